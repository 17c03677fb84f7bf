"""The kinds of embedding table a model's categorical columns can have (--embedding), each a module of its
own with what TableKind names: how a column's rows are looked up, which flags only it takes, how a checkpoint
of it restores and what a resume keeps of it. The trainer asks the kind; it never names one."""

from typing import NamedTuple, Protocol

import tensorflow as tf

from ps_trainer.model import dynamic, grouped_lookup, hashed, touched_rows
from ps_trainer.model.dynamic import table as dynamic_table
from ps_trainer.model.graph_tables import GraphTables


class TableKind(Protocol):
    OWN_FLAGS: tuple[str, ...]  # the settings only this kind has

    def misplaced(self, flag: str, embedding: str) -> str:
        """The refusal of one of OWN_FLAGS given for another kind, --embedding=`embedding`."""

    def columns(self, features, names, model_cfg, num_classes: int, training: bool, initializer,
                graph_tables: GraphTables) -> tuple[tf.Tensor, ...]:
        """(embeddings [batch, columns, model_cfg.embedding_dim], wide weights [batch, columns, num_classes]) of
        the categorical columns `names` (`training`: a kind may add rows as it meets IDs), their tables recorded
        in `graph_tables`."""

    def restore_refusal(self, saved: dict, now) -> str | None:
        """Why a checkpoint of this kind (`saved`: its run's model settings, run.json's) cannot restore into
        tables of `now` (model.ModelConfig), or None."""

    def resumed_shards(self, saved: dict) -> int | None:
        """The shards a resume keeps from the checkpoint's run unless --embedding_partitions is given, or
        None for this run's own cut."""


KINDS: dict[str, TableKind] = {"hashed": hashed, "dynamic": dynamic}


class RowUpdate(NamedTuple):
    """How an optimizer's update of a variable's rows runs, as the model's tables ask: `lock`,
    the lock of the dynamic table's shard whose rows it holds, when they grow (model/dynamic/upkeep.py
    replaces the row variable and its slots one by one inside it: an update in between would meet a
    variable and a slot of different lengths); `marker`, the marks of the rows incremental checkpoints
    save (model/touched_rows.py); `distinct`, whether the gradient's indices name no row twice (a grouped
    lookup's, summed on the worker: model/grouped_lookup.py). A variable of no table: none of them."""
    lock: tf.CriticalSection | None = None
    marker: tf.Variable | None = None
    distinct: bool = False
    graph_tables: GraphTables | None = None  # where the marker's generation counters are

    def of_rows(self, apply, indices) -> tf.Operation:
        """apply(), the update of rows `indices`, marked once written, inside the lock if there is one (taken
        for the update alone, once the gradient is computed)."""
        def update():
            applied = apply()
            if self.marker is None:
                return applied
            with tf.control_dependencies([applied]):
                return touched_rows.mark(self.graph_tables, self.marker, indices)

        if self.lock is None:
            return update()

        def locked():
            with tf.control_dependencies([update()]):
                return tf.constant(True)
        # Not exclusive: the update also reads what the optimizer shares between every table's rows (Adam's
        # beta powers), each table's under its own lock. What this lock guards, the shard's rows and slots,
        # only its own executions change (the update and the shard's growth, model/dynamic/storage.py).
        return self.lock.execute(locked, exclusive_resource_access=False).op

    def of_all(self, apply) -> tf.Operation:
        """apply(), a dense update: every row changed."""
        applied = apply()
        if self.marker is None:
            return applied
        with tf.control_dependencies([applied]):
            return touched_rows.mark_all(self.graph_tables, self.marker)


def row_update(graph_tables: GraphTables | None, variable, indices=None) -> RowUpdate:
    """The RowUpdate of `variable` (a resource variable), for a gradient at `indices` (None: dense), as the tables
    of `graph_tables` ask (None: a model with no tables)."""
    distinct = indices is not None and grouped_lookup.rows_are_distinct(indices)
    if graph_tables is None:
        return RowUpdate(distinct=distinct)
    return RowUpdate(lock=dynamic_table.rows_lock(graph_tables, variable),
                     marker=touched_rows.marker_of(graph_tables, variable), distinct=distinct,
                     graph_tables=graph_tables)
