"""Hashed tables (--embedding=hashed): a table per categorical column of --hash_buckets rows from the
start, the row of a value picked by a hash of it (distinct values can share one); cut into row ranges
(fixed_size_partitioner). A kind of table: what model/tables.py's TableKind names."""

import tensorflow as tf

from ps_trainer.model import grouped_lookup, multi_valued, touched_rows
from ps_trainer.model.needs import table_part, wide_part

v1 = tf.compat.v1

OWN_FLAGS = ("hash_buckets",)


def misplaced(flag: str, embedding: str) -> str:
    """The refusal of this kind's own flag given for --embedding=`embedding`."""
    del flag
    return (f"--hash_buckets sizes hashed tables; --embedding={embedding} tables hold a row per ID (up to "
            "--embedding_capacity): drop the flag.")


def restore_refusal(saved: dict, now) -> str | None:
    """Why a checkpoint of hashed tables (`saved`: its run's model settings) cannot restore into `now`'s:
    never for the cut. TensorFlow's Saver restores a partitioned variable, and its optimizer slots, into any
    cut (each is saved whole, as slices); a shape that differs is checkpoints.shape_refusal's."""
    del saved, now
    return None


def resumed_shards(saved: dict) -> None:
    """A resume cuts hashed tables as this run's flags say: none kept from the checkpoint."""
    del saved


def columns(features, names, model_cfg, num_classes, training, initializer, graph_tables):
    """(embeddings, wide weights) of every categorical column, each [batch, columns, width] (a multi-valued
    column's rows combined: model/multi_valued.py). On the ps tasks every column's tables are gathered from
    at once, one call per ps (model/grouped_lookup.py); alone, each with embedding_lookup ("div":
    fixed_size_partitioner gives a shard a range of rows)."""
    tables = []
    for name in names:
        with v1.variable_scope(name):
            tables.append(_tables(model_cfg, num_classes, training, initializer, graph_tables))
    ids = multi_valued.ids_of([_bucket(features[name], model_cfg.hash_buckets) for name in names])
    deep, wide = zip(*tables)
    if model_cfg.table_devices:
        rows = grouped_lookup.lookup([deep, wide], ids, graph_tables)
    elif isinstance(ids, multi_valued.ColumnIds):
        rows = [tf.concat([v1.nn.embedding_lookup(table, values, partition_strategy="div")
                           for table, values in zip(column_tables, ids.values)], 0) for column_tables in (deep, wide)]
    else:
        rows = [tf.stack([v1.nn.embedding_lookup(table, ids[:, c], partition_strategy="div")
                          for c, table in enumerate(column_tables)], axis=1) for column_tables in (deep, wide)]
    return (multi_valued.combined(rows[0], ids, model_cfg.combiner),
            multi_valued.combined(rows[1], ids, multi_valued.WIDE_COMBINER))


def _bucket(values, buckets: int):
    """Each value's row: a hash of it (of each of a multi-valued column's values)."""
    if isinstance(values, tf.RaggedTensor):
        return values.with_flat_values(tf.strings.to_hash_bucket_fast(values.flat_values, buckets))
    return tf.strings.to_hash_bucket_fast(values, buckets)


def _tables(model_cfg, num_classes, training, initializer, graph_tables):
    """(embedding table, wide weight table) of the current column: --hash_buckets rows each."""
    shards = model_cfg.embedding_partitions
    partitioner = v1.fixed_size_partitioner(shards) if shards > 1 else None
    with table_part():
        table = v1.get_variable("embedding", [model_cfg.hash_buckets, model_cfg.embedding_dim], partitioner=partitioner,
                                initializer=initializer)
        with wide_part():
            weights = v1.get_variable("wide", [model_cfg.hash_buckets, num_classes], partitioner=partitioner,
                                      initializer=v1.zeros_initializer())
    for shard in [*grouped_lookup.shards(table), *grouped_lookup.shards(weights)]:
        # Each shard and its optimizer slots: a group of rows that incremental checkpoints save.
        marker = touched_rows.group(graph_tables, shard.op.name, shard.device, lambda slots_of, p=shard: [
            (p, None), *((slot, None) for slot, _ in slots_of(p))], shard.shape[0],
            mark=training and model_cfg.mark_touched_rows)
        touched_rows.marks_rows_of(graph_tables, shard, marker)
    return table, weights
