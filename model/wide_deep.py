"""Wide and deep: a ranking model over categorical and numeric features.

Each categorical value gets a row of a table per column, of the kind --embedding names (model/tables.py)
(a multi-valued column's values a row each, combined per example: model/multi_valued.py):
with --embedding=hashed, the row its hash picks among --hash_buckets (distinct values can share one,
model/hashed.py); with --embedding=dynamic, a row of its own, made the first time training meets it
(model/dynamic.py). The deep part reads an embedding
of --embedding_dim columns from the row and feeds the embeddings and the numeric features through
--hidden_units; the wide part adds a learned weight per row (and per numeric feature).
The tables are the model's bulk, spread over the ps tasks: each cut into --embedding_partitions
shards (by default table_shards() below: whole when they spread evenly, else one shard per ps),
hashed tables into row ranges with fixed_size_partitioner,
dynamic ones by a hash of the ID. Lookups gather only the rows a batch touches, on the ps that
holds them, and their gradients are sparse: a step moves those rows, whatever the table's size. It
trains as the canonical wide-and-deep model does: FTRL for the wide part, Adagrad for the deep part
(NEEDS).
"""

import tensorflow as tf

from ps_trainer.model import layers, multi_valued, spec, tables
from ps_trainer.model.needs import Needs, wide_part

v1 = tf.compat.v1


def table_shards(model_cfg, data_spec, num_ps: int) -> int:
    """How many shards each table is cut into by default. Every gather and sparse update of a shard is an
    op of its own on its ps, whatever the shard's size: two ps tasks that each hold a shard of every
    table each cost a step nearly as much as one ps holding them all (measured: docs/data.md). So tables
    stay whole and are spread over the ps tasks, hashed ones by size and dynamic ones a column each in
    turn (each can hold --embedding_capacity rows), unless whole tables would load one ps more than a
    quarter above its share (fewer tables than ps tasks, or a few); then each is cut into one shard per
    ps (a dynamic table's shard chosen by a hash of the ID). A dynamic run resumed without
    --embedding_partitions keeps its checkpoint's shards (flags/config.py)."""
    del model_cfg
    if num_ps <= 1:
        return 1
    num_tables = len(categorical_columns(data_spec))
    return 1 if -(-num_tables // num_ps) <= 1.25 * num_tables / num_ps else num_ps


NEEDS = Needs(default_optimizer="ftrl_adagrad", partitioned_tables=True, table_shards=table_shards,
              grouped_lookup_embeddings=("hashed", "dynamic"))


def check(data_spec):
    if not any(s.dtype in (tf.string, tf.float32) and s.shape.rank == 0 for s in data_spec.features.values()):
        return ("it reads categorical and numeric columns: use --dataset=clicks, or csv/tfrecord "
                "with --categorical_columns/--numeric_columns")
    return None


def numeric_input(values):
    """Numbers of any scale squashed to a few units either way: sign(x) * log(1 + |x|)."""
    return tf.sign(values) * tf.math.log1p(tf.abs(values))


def _embedding_initializer(model_cfg):
    return v1.truncated_normal_initializer(stddev=model_cfg.embedding_dim ** -0.5)


def categorical_columns(data_spec) -> list[str]:
    return sorted(n for n, s in data_spec.features.items() if s.dtype == tf.string)


def logits(features, model_cfg, data_spec, training, graph_tables):
    features = multi_valued.split_columns(features, data_spec.separators)
    categorical = categorical_columns(data_spec)
    numeric = sorted(n for n, s in data_spec.features.items() if s.dtype == tf.float32)
    num_classes = data_spec.num_classes
    deep_inputs, wide_terms = [], []
    if categorical:
        deep, wide = tables.KINDS[model_cfg.embedding].columns(features, categorical, model_cfg, num_classes, training,
                                                               _embedding_initializer(model_cfg), graph_tables)
        deep_inputs.append(tf.reshape(deep, [-1, len(categorical) * model_cfg.embedding_dim]))
        wide_terms.append(tf.reduce_sum(wide, axis=1))
    if numeric:
        values = numeric_input(tf.stack([tf.cast(features[n], tf.float32) for n in numeric], axis=1))
        deep_inputs.append(values)
        with wide_part():
            wide_terms.append(layers.dense(values, num_classes, "wide_numeric"))
    net = tf.concat(deep_inputs, axis=1)
    for i, units in enumerate(model_cfg.hidden_units):
        net = layers.dense(net, units, f"hidden{i}", activation=tf.nn.relu)
    return layers.dense(net, num_classes, "deep_logits") + tf.add_n(wide_terms)


# The model on the contract (model/spec.py): its logits, and their cross-entropy given labels.
model_fn = spec.classifier(logits)
