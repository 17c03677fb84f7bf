"""An Estimator program whose loss turns NaN at a global step (--nan_at_step), as a diverging model's does, with
one line added (`import ps_trainer.estimator`): the drill of a chief that ends in a permanent error on a TF_CONFIG
cluster (tests/test_estimator.py)."""

import numpy as np
import tensorflow as tf
from absl import app, flags

import ps_trainer.estimator  # noqa: F401  (the one line added)

flags.DEFINE_string("model_dir", None, "Where the checkpoints go.")
flags.DEFINE_integer("train_steps", 100000, "The global step to train to.")
flags.DEFINE_integer("nan_at_step", 30, "The global step from which the loss is NaN.")
FLAGS = flags.FLAGS
v1 = tf.compat.v1


def input_fn():
    x = np.random.RandomState(0).normal(size=(1000, 2)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(({"x": x}, (x.sum(axis=1) > 0).astype(np.int64))).repeat().batch(32)


def model_fn(features, labels, mode):
    logits = tf.matmul(features["x"], v1.get_variable("w", [2, 1]))[:, 0]
    global_step = v1.train.get_global_step()
    diverged = tf.where(global_step >= FLAGS.nan_at_step, np.float32(np.nan), np.float32(0.0))
    loss = v1.losses.sigmoid_cross_entropy(labels, logits) + diverged
    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(mode, loss=loss)
    train_op = v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=global_step)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def main(argv):
    del argv
    config = tf.estimator.RunConfig(model_dir=FLAGS.model_dir, save_checkpoints_steps=10)
    estimator = tf.estimator.Estimator(model_fn, config=config)
    tf.estimator.train_and_evaluate(estimator, tf.estimator.TrainSpec(input_fn, max_steps=FLAGS.train_steps),
                                    tf.estimator.EvalSpec(input_fn, steps=5, throttle_secs=1))


if __name__ == "__main__":
    app.run(main)
