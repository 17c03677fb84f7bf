"""A TF1-era canned wide & deep program, as census-style programs were written and kept running on TF 2.x
(TF1's DNNLinearCombinedClassifier, `tf.compat.v1.estimator`'s, with tf.compat.v1.train optimizers, over feature
columns, numpy_input_fn, train_and_evaluate from TF_CONFIG, a FinalExporter of a parsing serving input), with one
line added: `import ps_trainer.estimator`."""

import numpy as np
import tensorflow as tf
from absl import app, flags

import ps_trainer.estimator  # noqa: F401  (the one line added)

flags.DEFINE_string("model_dir", None, "Where the checkpoints and the export go.")
flags.DEFINE_integer("train_steps", 400, "The global step to train to.")
FLAGS = flags.FLAGS
fc = tf.compat.v1.feature_column

OCCUPATIONS = [f"job{i}" for i in range(30)]


def make_data(examples, seed):
    """People whose income class follows their age, hours, education and occupation."""
    rng = np.random.RandomState(seed)
    age = rng.randint(18, 80, size=examples).astype(np.float32)
    hours = rng.randint(10, 70, size=examples).astype(np.float32)
    education = rng.choice(["school", "college", "masters", "doctorate"], size=examples)
    occupation = rng.choice(OCCUPATIONS, size=examples)
    logit = (0.04 * (age - 45) + 0.05 * (hours - 40) + np.select(
        [education == "doctorate", education == "masters", education == "college"], [1.5, 1.0, 0.3], -0.8)
        + np.array([1.0 if int(job[3:]) % 3 == 0 else -0.5 for job in occupation]))
    label = (rng.rand(examples) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    return {"age": age, "hours": hours, "education": education, "occupation": occupation}, label


def columns():
    # Ages and hours scaled, as census programs did (normalizer_fn): raw (18-80, 10-70), they leave many
    # initializations with a DNN whose ReLUs are dead from the first steps.
    age = fc.numeric_column("age", normalizer_fn=lambda value: (value - 45) / 15)
    education = fc.categorical_column_with_vocabulary_list("education", ["school", "college", "masters", "doctorate"])
    occupation = fc.categorical_column_with_hash_bucket("occupation", 100)
    age_buckets = fc.bucketized_column(fc.numeric_column("age"), [25, 35, 45, 55, 65])
    wide = [education, occupation, age_buckets, fc.crossed_column([age_buckets, education], 200)]
    hours = fc.numeric_column("hours", normalizer_fn=lambda value: (value - 40) / 15)
    deep = [age, hours, fc.indicator_column(education), fc.embedding_column(occupation, 8)]
    return wide, deep


def main(argv):
    del argv
    wide, deep = columns()
    config = tf.estimator.RunConfig(model_dir=FLAGS.model_dir, save_checkpoints_steps=100, tf_random_seed=7)
    estimator = tf.compat.v1.estimator.DNNLinearCombinedClassifier(
        config=config, linear_feature_columns=wide, dnn_feature_columns=deep, dnn_hidden_units=[32, 16],
        linear_optimizer=tf.compat.v1.train.FtrlOptimizer(0.1), dnn_optimizer=tf.compat.v1.train.AdagradOptimizer(0.1))
    x, y = make_data(8000, 0)
    held_x, held_y = make_data(2000, 1)
    inputs = tf.compat.v1.estimator.inputs
    train_input = inputs.numpy_input_fn(x, y, batch_size=64, num_epochs=None, shuffle=True)
    eval_input = inputs.numpy_input_fn(held_x, held_y, batch_size=500, num_epochs=1, shuffle=False)
    feature_spec = fc.make_parse_example_spec(wide + deep)
    exporter = tf.estimator.FinalExporter(
        "census", tf.estimator.export.build_parsing_serving_input_receiver_fn(feature_spec))
    result = tf.estimator.train_and_evaluate(
        estimator, tf.estimator.TrainSpec(train_input, max_steps=FLAGS.train_steps),
        tf.estimator.EvalSpec(eval_input, steps=None, exporters=[exporter], throttle_secs=1))
    metrics, exports = result or (None, [])  # TF1 returned None on the ps, the chief and the workers
    if metrics:
        print("final metrics: " + " ".join(f"{key}={value}" for key, value in sorted(metrics.items())), flush=True)
    for path in exports:
        print(f"exported: {path.decode()}", flush=True)


if __name__ == "__main__":
    app.run(main)
