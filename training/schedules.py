"""Learning-rate schedules by name, as train_image_classifier.py has them: each a function of the
global step (a tensor) and the training settings. Adding one is one table line.

A linear warm-up (--warmup_steps) runs in front of any of them: from 0 up to the schedule's value,
which then goes on as if the warm-up had not been there (the schedule counts from step 0).
"""

import tensorflow as tf

v1 = tf.compat.v1


def _decay_steps(cfg) -> int:
    return cfg.decay_steps or cfg.train_steps


SCHEDULES = {
    "constant": lambda lr, step, cfg: tf.constant(lr),
    "exponential": lambda lr, step, cfg: v1.train.exponential_decay(
        lr, step, _decay_steps(cfg), cfg.decay_rate, staircase=cfg.staircase),
    "polynomial": lambda lr, step, cfg: v1.train.polynomial_decay(
        lr, step, _decay_steps(cfg), end_learning_rate=cfg.end_learning_rate, power=1.0),
    "cosine": lambda lr, step, cfg: v1.train.cosine_decay(lr, step, _decay_steps(cfg), alpha=cfg.end_learning_rate / lr
                                                          if lr else 0.0),
    "piecewise": lambda lr, step, cfg: v1.train.piecewise_constant(
        step, list(cfg.lr_boundaries), [lr * factor for factor in cfg.lr_factors]),
}


def learning_rate(global_step, cfg) -> tf.Tensor:
    """The learning rate at this global step: the schedule, behind a linear warm-up."""
    step = tf.cast(global_step, tf.int64)
    rate = tf.cast(SCHEDULES[cfg.lr_schedule](cfg.learning_rate, step, cfg), tf.float32)
    if cfg.warmup_steps:
        ramp = tf.cast(step + 1, tf.float32) / float(cfg.warmup_steps)
        rate = tf.minimum(ramp, 1.0) * rate
    return tf.identity(rate, name="learning_rate_value")
