"""GraphTables: what a model's embedding tables leave in the graph they are built in, for the optimizer's update,
the checkpoints, warm start and the tables' upkeep to use.

A model build makes one (model.build, model.logits_of) or is handed the one its caller made (a round of rows
builds the model several times into one graph; an Estimator's graph calls its model_fn more than once), and
returns it with the model's output (ModelOutput.graph_tables), so that whoever needs the tables is handed
them: no module keeps them. A loop body's graph (a round's steps) has a record of its own beside its outer
graph's, as its tensors do (each module that records says which graph it uses: the variable's, or the
outermost one of a loop body's graph)."""

import dataclasses
import weakref

import tensorflow as tf


@dataclasses.dataclass
class Record:
    """What the tables built in one graph left there."""
    # model/dynamic/: (table name, shard) of each dynamic table built for training; each shard, by its variable
    # scope (a table built again, for a round's batches, uses the same: its map is one resource); the lock of the
    # shard whose rows a growing row variable holds, by the variable; the DistinctIds built, by (names of the
    # tensors of IDs, shards, devices).
    trained_shards: list = dataclasses.field(default_factory=list)
    shards: dict = dataclasses.field(default_factory=dict)
    row_locks: dict = dataclasses.field(default_factory=dict)
    distinct_ids: dict = dataclasses.field(default_factory=dict)
    # model/touched_rows.py: the groups of rows by name; the marker of a row variable's rows, by the variable;
    # the generation counters, by device.
    row_groups: dict = dataclasses.field(default_factory=dict)
    markers: dict = dataclasses.field(default_factory=dict)
    generations: dict = dataclasses.field(default_factory=dict)
    # model/grouped_lookup.py: the source of the rows_from() this graph is built in, or None.
    rows_source: object = None


class GraphTables:
    """The tables one model graph builds: a Record per graph (the graph, and the loop bodies built in it)."""

    def __init__(self):
        self._records = weakref.WeakKeyDictionary()  # graph -> its Record

    def of(self, graph: tf.Graph | None = None) -> Record:
        """The record of `graph` (the default graph if None)."""
        graph = graph or tf.compat.v1.get_default_graph()
        found = self._records.get(graph)
        if found is None:
            found = self._records[graph] = Record()
        return found
