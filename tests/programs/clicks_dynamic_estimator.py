"""An Estimator program whose users and items each get a row of their own in the runtime's dynamic tables: the
model_fn of clicks_dynamic_model_fn.py (the file `trainer.py --model_fn` trains too), with TF1's AUC added, in
train_and_evaluate from TF_CONFIG, exported for raw features. The tables and the update come from outside the
program: `PS_TRAINER_FLAGS="--embedding=dynamic --optimizer=adagrad --learning_rate=0.1"`."""

import os
import sys

import numpy as np
import tensorflow as tf
from absl import app, flags

import ps_trainer.estimator  # noqa: F401  (the one line added)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import clicks_dynamic_model_fn  # noqa: E402  (beside this file)

flags.DEFINE_string("model_dir", None, "Where the checkpoints go.")
flags.DEFINE_integer("train_steps", 1000, "The global step to train to.")
flags.DEFINE_integer("save_checkpoints_steps", 200, "Global steps between the chief's checkpoints.")
FLAGS = flags.FLAGS
USERS, ITEMS = 400, 100


def make_data(examples, seed):
    """Clicks whose label follows the user's and the item's own leaning (IDs drawn with one seed: the same
    users and items in every split) and the price."""
    leaning = np.random.RandomState(0)
    user_leaning, item_leaning = leaning.choice([-2.0, 2.0], USERS), leaning.choice([-1.5, 1.5], ITEMS)
    rng = np.random.RandomState(seed)
    user, item = rng.randint(0, USERS, examples), rng.randint(0, ITEMS, examples)
    price, hour = rng.normal(size=examples).astype(np.float32), rng.randint(0, 24, examples).astype(np.float32)
    logit = user_leaning[user] + item_leaning[item] - price
    label = (rng.rand(examples) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    features = {"user": np.array([f"u{u}" for u in user]), "item": np.array([f"i{i}" for i in item]),
                "category": np.array([f"c{i % 10}" for i in item]), "hour": hour, "price": price}
    return features, label


def input_fn(mode, params):
    training = mode == tf.estimator.ModeKeys.TRAIN
    features, label = make_data(8000 if training else 2000, 0 if training else 1)
    dataset = tf.data.Dataset.from_tensor_slices((features, label))
    if training:
        dataset = dataset.shuffle(2000, seed=1).repeat()
    return dataset.batch(params["batch_size"])


def model_fn(features, labels, mode, params):
    spec = clicks_dynamic_model_fn.model_fn(features, labels, mode, params)
    if mode != tf.estimator.ModeKeys.EVAL:
        return spec
    clicked = tf.nn.softmax(spec.predictions["logits"])[:, 1]
    return tf.estimator.EstimatorSpec(mode, loss=spec.loss, predictions=spec.predictions, eval_metric_ops={
        "auc": tf.compat.v1.metrics.auc(labels, clicked)})


def serving_input_receiver_fn():
    features = {name: tf.compat.v1.placeholder(dtype, [None], name=name) for name, dtype in (
        ("user", tf.string), ("item", tf.string), ("category", tf.string), ("hour", tf.float32),
        ("price", tf.float32))}
    return tf.estimator.export.ServingInputReceiver(features, features)


def main(argv):
    del argv
    config = tf.estimator.RunConfig(model_dir=FLAGS.model_dir, save_checkpoints_steps=FLAGS.save_checkpoints_steps,
                                    tf_random_seed=7)
    estimator = tf.estimator.Estimator(model_fn, config=config, params={"batch_size": 64, "dimension": 8})
    exporter = tf.estimator.FinalExporter("clicks", serving_input_receiver_fn)
    tf.estimator.train_and_evaluate(
        estimator, tf.estimator.TrainSpec(input_fn, max_steps=FLAGS.train_steps),
        tf.estimator.EvalSpec(input_fn, steps=None, exporters=[exporter], throttle_secs=1))


if __name__ == "__main__":
    app.run(main)
