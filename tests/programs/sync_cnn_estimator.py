"""A TF1-era synchronous CNN program, as mnist-style programs were written (a model_fn with
tf.compat.v1.layers.conv2d, inputs.numpy_input_fn, SyncReplicasOptimizer and its session hook,
train_and_evaluate from TF_CONFIG), with one line added: `import ps_trainer.estimator`."""

import json
import os

import numpy as np
import tensorflow as tf
from absl import app, flags

import ps_trainer.estimator  # noqa: F401  (the one line added)

flags.DEFINE_string("model_dir", None, "Where the checkpoints go.")
flags.DEFINE_integer("train_steps", 200, "The global step to train to.")
FLAGS = flags.FLAGS


def make_data(examples, seed):
    """12x12 images: class 1 holds a bright vertical bar, class 0 a horizontal one, in noise."""
    rng = np.random.RandomState(seed)
    images = rng.normal(0, 0.6, size=(examples, 12, 12, 1)).astype(np.float32)
    labels = rng.randint(0, 2, size=examples).astype(np.int64)
    where = rng.randint(2, 10, size=examples)
    for i in range(examples):
        if labels[i]:
            images[i, :, where[i], 0] += 1.0
        else:
            images[i, where[i], :, 0] += 1.0
    return {"image": images}, labels


def replicas():
    """The training replicas of TF_CONFIG's cluster (chief and workers), as TF1 programs counted them."""
    cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
    return max(1, len(cluster.get("chief", [])) + len(cluster.get("worker", [])))


def model_fn(features, labels, mode, config):
    net = tf.compat.v1.layers.conv2d(features["image"], 8, 3, activation=tf.nn.relu)
    net = tf.compat.v1.layers.max_pooling2d(net, 2, 2)
    net = tf.compat.v1.layers.flatten(net)
    logits = tf.compat.v1.layers.dense(net, 2)
    classes = tf.argmax(logits, axis=1)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"classes": classes})
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops={
            "accuracy": tf.compat.v1.metrics.accuracy(labels, classes)})
    optimizer = tf.compat.v1.train.SyncReplicasOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(0.1), replicas_to_aggregate=replicas(),
        total_num_replicas=replicas())
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                      training_hooks=[optimizer.make_session_run_hook(config.is_chief)])


def main(argv):
    del argv
    config = tf.estimator.RunConfig(model_dir=FLAGS.model_dir, save_checkpoints_steps=50, tf_random_seed=3)
    estimator = tf.estimator.Estimator(model_fn, config=config)
    x, y = make_data(4000, 0)
    held_x, held_y = make_data(1000, 1)
    result = tf.estimator.train_and_evaluate(
        estimator,
        tf.estimator.TrainSpec(tf.estimator.inputs.numpy_input_fn(x, y, batch_size=32, num_epochs=None, shuffle=True),
                               max_steps=FLAGS.train_steps),
        tf.estimator.EvalSpec(tf.estimator.inputs.numpy_input_fn(held_x, held_y, batch_size=250, shuffle=False),
                              steps=None, throttle_secs=1))
    metrics = result[0] if result else None  # TF1 returned None on the ps, the chief and the workers
    if metrics:
        print("final metrics: " + " ".join(f"{key}={value}" for key, value in sorted(metrics.items())), flush=True)


if __name__ == "__main__":
    app.run(main)
