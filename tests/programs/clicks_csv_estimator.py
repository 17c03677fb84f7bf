"""A TF1-era Estimator program on click logs in CSV files (user, item and category IDs, the hour and the
price, the click), as teams wrote them: an input_fn of tf.data over the files, a model_fn with feature
columns and tf.compat.v1.layers, train_and_evaluate from TF_CONFIG; with one line added,
`import ps_trainer.estimator`.

Its model_fn also runs under `trainer.py --model_fn=clicks_csv_estimator.py:model_fn
--model_fn_params=update=runtime --dataset=csv ...`: with `update=runtime` in its params it returns the loss
alone and the trainer makes the update, with its optimizer and levers. Its flags are defined where it
runs as a program, so that loading it for its model_fn defines none.
"""

import glob
import os

import tensorflow as tf
from absl import app, flags

import ps_trainer.estimator  # noqa: F401  (the one line added)

v1 = tf.compat.v1
COLUMNS = ("user", "item", "category", "hour", "price", "clicked")
DEFAULTS = [[""], [""], [""], [0.0], [0.0], [0]]


def input_fn(files, training, batch_size):
    def parse(line):
        values = dict(zip(COLUMNS, tf.io.decode_csv(line, DEFAULTS)))
        return values, values.pop("clicked")

    dataset = tf.data.Dataset.from_tensor_slices(sorted(glob.glob(files)))
    dataset = dataset.flat_map(lambda name: tf.data.TextLineDataset(name).skip(1))  # each file's header
    if training:
        dataset = dataset.shuffle(10000, seed=1).repeat()
    return dataset.map(parse).batch(batch_size).prefetch(2)


def model_fn(features, labels, mode, params):
    columns = [v1.feature_column.embedding_column(
        v1.feature_column.categorical_column_with_hash_bucket(name, 1000), dimension=8)
        for name in ("user", "item", "category")]
    columns += [v1.feature_column.numeric_column(name) for name in ("hour", "price")]
    net = v1.feature_column.input_layer(features, columns)
    net = v1.layers.dense(net, 32, activation=tf.nn.relu)
    logits = v1.layers.dense(net, 2)
    probabilities = tf.nn.softmax(logits)[:, 1]
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits, "probabilities": probabilities})
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits}, loss=loss, eval_metric_ops={
            "auc": v1.metrics.auc(labels, probabilities)})
    if params.get("update") == "runtime":  # trainer.py --model_fn: the trainer makes the update
        return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits}, loss=loss)
    optimizer = v1.train.AdagradOptimizer(params["learning_rate"])
    train_op = optimizer.minimize(loss, global_step=v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def main(argv):
    del argv
    FLAGS = flags.FLAGS
    config = tf.estimator.RunConfig(model_dir=FLAGS.model_dir, save_checkpoints_steps=1000, tf_random_seed=7)
    estimator = tf.estimator.Estimator(model_fn, config=config, params={"learning_rate": 0.1})
    train = os.path.join(FLAGS.data_dir, "train-*.csv")
    held_out = os.path.join(FLAGS.data_dir, "eval-*.csv")
    result = tf.estimator.train_and_evaluate(
        estimator, tf.estimator.TrainSpec(lambda: input_fn(train, True, FLAGS.batch_size), max_steps=FLAGS.train_steps),
        tf.estimator.EvalSpec(lambda: input_fn(held_out, False, 1000), steps=None, throttle_secs=1))
    if result:
        print("final metrics: " + " ".join(f"{key}={value}" for key, value in sorted(result[0].items())), flush=True)


if __name__ == "__main__":
    flags.DEFINE_string("model_dir", None, "Where the checkpoints go.")
    flags.DEFINE_string("data_dir", None, "The train-*.csv and eval-*.csv files.")
    flags.DEFINE_integer("train_steps", 3000, "The global step to train to.")
    flags.DEFINE_integer("batch_size", 64, "Examples a step.")
    app.run(main)
