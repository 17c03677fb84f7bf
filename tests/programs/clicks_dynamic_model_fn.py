"""A model_fn for the trainer's clicks data whose user and item IDs each get a row of their own in the
trainer's dynamic tables (ps_trainer.estimator.feature_column.dynamic_embedding_column), beside TF1's own
columns (the category's hashed embedding, the numbers) and tf.compat.v1.layers. It leaves the update to
the runtime:
`trainer.py --model_fn=tests/programs/clicks_dynamic_model_fn.py:model_fn --dataset=clicks --embedding=dynamic`."""

import tensorflow as tf

import ps_trainer.estimator  # noqa: F401  (tf.estimator.EstimatorSpec)
from ps_trainer.estimator.feature_column import dynamic_embedding_column

v1 = tf.compat.v1


def model_fn(features, labels, mode, params):
    dimension = params.get("dimension", 8)
    columns = [dynamic_embedding_column(name, dimension) for name in ("user", "item")]
    columns += [v1.feature_column.embedding_column(v1.feature_column.categorical_column_with_hash_bucket(
        "category", 100), dimension=dimension)]
    columns += [v1.feature_column.numeric_column(name) for name in ("hour", "price")]
    net = v1.feature_column.input_layer(features, columns)
    for units in params.get("hidden_units", (32,)):
        net = v1.layers.dense(net, units, activation=tf.nn.relu)
    logits = v1.layers.dense(net, 2)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits}, loss=loss)
