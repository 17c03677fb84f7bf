"""A TF1-era Estimator program, as teams wrote them (a model_fn with feature columns and
tf.compat.v1.layers, input_fns of tf.data, train_and_evaluate from TF_CONFIG, flags of its own), with one
line added: `import ps_trainer.estimator`."""

import numpy as np
import tensorflow as tf
from absl import app, flags

import ps_trainer.estimator  # noqa: F401  (the one line added)

flags.DEFINE_string("model_dir", None, "Where the checkpoints go.")
flags.DEFINE_integer("train_steps", 300, "The global step to train to.")
flags.DEFINE_bool("predict", False, "After training, score the held-out examples and print how many.")
FLAGS = flags.FLAGS


def make_data(examples, seed):
    """Clicks whose label follows two numbers and a city."""
    rng = np.random.RandomState(seed)
    x = rng.normal(size=(examples, 2)).astype(np.float32)
    city = rng.randint(0, 20, size=examples)
    logit = 2 * x[:, 0] - x[:, 1] + np.where(city < 10, 1.5, -1.5)
    label = (rng.rand(examples) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    return {"x1": x[:, 0], "x2": x[:, 1], "city": np.array([f"c{c}" for c in city])}, label


def input_fn(mode, params):
    training = mode == tf.estimator.ModeKeys.TRAIN
    features, label = make_data(4000 if training else 1000, 0 if training else 1)
    dataset = tf.data.Dataset.from_tensor_slices((features, label))
    if training:
        dataset = dataset.shuffle(1000, seed=1).repeat()
    return dataset.batch(params["batch_size"])


def model_fn(features, labels, mode, params):
    columns = [tf.compat.v1.feature_column.numeric_column("x1"), tf.compat.v1.feature_column.numeric_column("x2"),
               tf.compat.v1.feature_column.embedding_column(
                   tf.compat.v1.feature_column.categorical_column_with_hash_bucket("city", 100), dimension=4)]
    net = tf.compat.v1.feature_column.input_layer(features, columns)
    net = tf.compat.v1.layers.dense(net, 16, activation=tf.nn.relu)
    logits = tf.compat.v1.layers.dense(net, 1)[:, 0]
    probabilities = tf.sigmoid(logits)
    classes = tf.cast(probabilities > 0.5, tf.int64)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"probabilities": probabilities, "classes": classes})
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops={
            "accuracy": tf.compat.v1.metrics.accuracy(labels, classes),
            "auc": tf.compat.v1.metrics.auc(labels, probabilities)})
    optimizer = tf.compat.v1.train.AdagradOptimizer(params["learning_rate"])
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def main(argv):
    del argv
    config = tf.estimator.RunConfig(model_dir=FLAGS.model_dir, save_checkpoints_steps=100, tf_random_seed=7)
    estimator = tf.estimator.Estimator(model_fn, config=config, params={"batch_size": 64, "learning_rate": 0.1})
    result = tf.estimator.train_and_evaluate(
        estimator, tf.estimator.TrainSpec(input_fn, max_steps=FLAGS.train_steps),
        tf.estimator.EvalSpec(input_fn, steps=None, throttle_secs=1))
    metrics = result[0] if result else None  # TF1 returned None on the ps, the chief and the workers
    if metrics:
        print("final metrics: " + " ".join(f"{key}={value}" for key, value in sorted(metrics.items())), flush=True)
    if FLAGS.predict:
        scored = list(estimator.predict(input_fn, predict_keys=["probabilities"]))
        print(f"predicted {len(scored)} examples; global_step variable "
              f"{estimator.get_variable_value('global_step')}", flush=True)


if __name__ == "__main__":
    app.run(main)
