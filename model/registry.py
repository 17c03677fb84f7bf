"""What the model's tables leave in the graph they are built in, for the optimizers, the checkpoints and the
hooks to find again: one Registry per graph, made on first use and gone with its graph. Each module that
registers says which graph it keys by (the variable's, or the outermost one of a loop body's graph)."""

import dataclasses
import weakref

import tensorflow as tf


@dataclasses.dataclass
class Registry:
    # model/dynamic/: (table name, shard) of each dynamic table built for training; each shard, by its variable
    # scope (a table built again, for a round's batches, uses the same: its map is one resource); the lock of the
    # shard whose rows a growing row variable holds, by the variable's op name; the DistinctIds built, by
    # (name of the tensor of IDs, shards, devices).
    trained_shards: list = dataclasses.field(default_factory=list)
    shards: dict = dataclasses.field(default_factory=dict)  # each shard, by its variable scope: one per graph
    row_locks: dict = dataclasses.field(default_factory=dict)
    distinct_ids: dict = dataclasses.field(default_factory=dict)
    # model/touched_rows.py: the groups of rows by name; the marker of a row variable's rows, by its op
    # name; the generation counters, by device.
    row_groups: dict = dataclasses.field(default_factory=dict)
    markers: dict = dataclasses.field(default_factory=dict)
    generations: dict = dataclasses.field(default_factory=dict)
    # model/grouped_lookup.py: the source of the rows_from() this graph is built in, or None.
    rows_source: object = None


_REGISTRIES = weakref.WeakKeyDictionary()  # graph -> its Registry


def of(graph: tf.Graph | None = None) -> Registry:
    """The registry of `graph` (the default graph if None)."""
    graph = graph or tf.compat.v1.get_default_graph()
    found = _REGISTRIES.get(graph)
    if found is None:
        found = _REGISTRIES[graph] = Registry()
    return found
