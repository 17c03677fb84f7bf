"""Wide and deep: a ranking model over categorical and numeric features.

Each categorical feature is hashed into --hash_buckets ids. The deep part looks each id up in an
embedding table of --embedding_dim columns and feeds the embeddings and the numeric features
through --hidden_units; the wide part adds a learned weight per id (and per numeric feature).
The tables are the model's bulk, so each is cut into --embedding_partitions row ranges with
fixed_size_partitioner (one per ps by default) and spread over the ps tasks. Lookups gather only the
rows a batch touches, on the ps that holds them, and their gradients are sparse: a step moves
those rows, whatever the table's size. It trains as the canonical wide-and-deep model does: FTRL for
the wide part, Adagrad for the deep part (NEEDS).
"""

import tensorflow as tf

from model import layers
from model.needs import Needs, wide_part

v1 = tf.compat.v1
NEEDS = Needs(default_optimizer="ftrl_adagrad", partitioned_tables=True)


def check(data_spec):
    if not any(s.dtype in (tf.string, tf.float32) and s.shape.rank == 0 for s in data_spec.features.values()):
        return ("it reads categorical and numeric columns: use --dataset=clicks, or csv/tfrecord "
                "with --categorical_columns/--numeric_columns")
    return None


def numeric_input(values):
    """Numbers of any scale squashed to a few units either way: sign(x) * log(1 + |x|)."""
    return tf.sign(values) * tf.math.log1p(tf.abs(values))


def logits(features, cfg, data_spec):
    categorical = sorted(n for n, s in data_spec.features.items() if s.dtype == tf.string)
    numeric = sorted(n for n, s in data_spec.features.items() if s.dtype == tf.float32)
    num_classes = data_spec.num_classes
    partitioner = (v1.fixed_size_partitioner(cfg.embedding_partitions) if cfg.embedding_partitions > 1 else None)
    deep_inputs, wide_terms = [], []
    for name in categorical:
        ids = tf.strings.to_hash_bucket_fast(features[name], cfg.hash_buckets)
        with v1.variable_scope(name):
            table = v1.get_variable(
                "embedding", [cfg.hash_buckets, cfg.embedding_dim], partitioner=partitioner,
                initializer=v1.truncated_normal_initializer(stddev=cfg.embedding_dim ** -0.5))
            with wide_part():
                weights = v1.get_variable("wide", [cfg.hash_buckets, num_classes], partitioner=partitioner,
                                          initializer=v1.zeros_initializer())
        # "div": fixed_size_partitioner gives each piece a contiguous range of rows.
        deep_inputs.append(v1.nn.embedding_lookup(table, ids, partition_strategy="div"))
        wide_terms.append(v1.nn.embedding_lookup(weights, ids, partition_strategy="div"))
    if numeric:
        values = numeric_input(tf.stack([tf.cast(features[n], tf.float32) for n in numeric], axis=1))
        deep_inputs.append(values)
        with wide_part():
            wide_terms.append(layers.dense(values, num_classes, "wide_numeric"))
    net = tf.concat(deep_inputs, axis=1)
    for i, units in enumerate(cfg.hidden_units):
        net = layers.dense(net, units, f"hidden{i}", activation=tf.nn.relu)
    return layers.dense(net, num_classes, "deep_logits") + tf.add_n(wide_terms)
