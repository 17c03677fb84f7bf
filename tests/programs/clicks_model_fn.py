"""A TF1-era model_fn for the trainer's clicks data (user, item and category IDs, numeric features), as a
team writes one for tf.estimator: feature columns and tf.compat.v1.layers. It leaves the update to the
runtime (no train_op), so `trainer.py --model_fn=tests/programs/clicks_model_fn.py:model_fn --dataset=clicks`
trains it with the trainer's optimizer and levers."""

import tensorflow as tf

import ps_trainer.estimator  # noqa: F401  (tf.estimator.EstimatorSpec)

v1 = tf.compat.v1


def model_fn(features, labels, mode, params):
    columns = [v1.feature_column.embedding_column(
        v1.feature_column.categorical_column_with_hash_bucket(name, 1000), dimension=params.get("dimension", 8))
        for name in ("user", "item", "category")]
    columns += [v1.feature_column.numeric_column(name) for name in ("hour", "price")]
    net = v1.feature_column.input_layer(features, columns)
    for units in params.get("hidden_units", (32,)):
        net = v1.layers.dense(net, units, activation=tf.nn.relu)
    logits = v1.layers.dense(net, 2)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits}, loss=loss)
