"""Optimizers by name. Adding one is one table line."""

import tensorflow as tf

_v1 = tf.compat.v1.train

OPTIMIZERS = {
    "sgd": lambda lr, cfg: _v1.GradientDescentOptimizer(lr),
    "momentum": lambda lr, cfg: _v1.MomentumOptimizer(lr, momentum=cfg.momentum),
    "adam": lambda lr, cfg: _v1.AdamOptimizer(lr),
    "adagrad": lambda lr, cfg: _v1.AdagradOptimizer(lr),
    "rmsprop": lambda lr, cfg: _v1.RMSPropOptimizer(lr, momentum=cfg.momentum),
}


def make_optimizer(learning_rate, cfg) -> tf.compat.v1.train.Optimizer:
    return OPTIMIZERS[cfg.optimizer](learning_rate, cfg)
