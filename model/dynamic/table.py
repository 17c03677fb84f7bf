"""DynamicTable: the rows of a batch of raw IDs, a row per ID, made the first time the ID is admitted, with
no collisions.

IDs are spread over a table's shards by a hash of the ID (model/dynamic/ids.py), each shard pinned to a ps
(TableOptions.part: whole tables, one shard each, spread over the ps tasks a column each in turn); a
lookup, its gradient and its update all run on that shard's ps, where the shard's map and rows are
(model/dynamic/storage.py).
"""

import tensorflow as tf

from ps_trainer.model import grouped_lookup, touched_rows
from ps_trainer.model.graph_tables import GraphTables
from ps_trainer.model.dynamic.ids import TableOptions, distinct_ids
from ps_trainer.model.dynamic.storage import DEFAULT_ROW, LIVE_ROWS, Shard, row_variable, shard_here

v1 = tf.compat.v1


class DynamicTable:
    """The rows of a batch of raw IDs: `DynamicTable(graph_tables, name, ids, options, training).rows(...)`, its
    shards recorded in the model's GraphTables (model/graph_tables.py).

    Built once per batch of IDs; each rows() call is one more trained value per ID (an embedding, a
    wide weight) sharing the same ID -> row map. With `training`, an ID not in the map is admitted
    (given the next free row of its shard); without, it reads the default row and nothing is stored.

    The worker finds the batch's distinct IDs and the shard that holds each (distinct_ids); each shard,
    on its own device, is sent its own and returns their rows, a row per distinct ID. The worker puts the
    shards' parts together and spreads the rows over the batch, and the gradient takes the same way
    back: a row crosses once, to and from its own ps only, however often the batch names its ID. Given
    the IDs of several columns ([batch, columns]) and a `column`, the table reads its column's IDs
    among a shard's: rows_of_columns then joins every column's part on the ps before it crosses, one
    tensor per ps for all the tables.
    """

    def __init__(self, graph_tables: GraphTables, name: str, ids: tf.Tensor, options: TableOptions, training: bool,
                 column: int | None = None):
        self.graph_tables, self.name, self.options, self._training = graph_tables, name, options, training
        self._scope = v1.get_variable_scope()
        self.distinct = distinct_ids(graph_tables, ids if column is not None else tf.reshape(ids, [-1, 1]), options)
        self.column = column or 0
        self._shards, self._found_rows, self._devices, live_rows = [], [], [], []
        self.keys = []  # each shard's part of the column's distinct IDs, on its device
        # A table built again (a round's batches, training/step/row_copies.py) counts its live rows once.
        built = {shard.scope for _, shard in graph_tables.of().trained_shards}
        # The part of the distinct IDs that each shard reads (and the ps it lives on).
        self.parts = [options.part(self.column, shard) for shard in range(options.shards)]
        for shard, part in enumerate(self.parts):
            device = options.device(part)
            self._devices.append(device)
            with v1.device(device), v1.variable_scope(f"shard{shard}"):
                distinct, bounds = self.distinct.on(part, device)
                start, end = bounds[self.column], bounds[self.column + 1]
                keys = distinct[start:end]  # the column's IDs that this shard holds
                # Each ID's occurrences in the batch, for admission (only counted with min_count > 1).
                counts = self.distinct.counts_of(part)[start:end] if options.min_count > 1 else None
                rows = shard_here(graph_tables, ids.dtype, options, shard, training, device)
                self._shards.append(rows)
                self.keys.append(keys)
                self._found_rows.append(rows.rows_of(keys, counts, training, name))
                if rows.scope not in built:
                    live_rows.append(tf.identity(rows.map.size(), name="live_rows"))
                    v1.add_to_collection(LIVE_ROWS, live_rows[-1])
        if training and live_rows:
            v1.summary.scalar("live_rows", tf.add_n(live_rows))
        if training:
            graph_tables.of().trained_shards.extend((name, s) for s in self._shards)

    def contents(self) -> list[tuple[tf.Tensor, tf.Tensor]]:
        """(IDs, their rows) of each shard, read from its map on its ps."""
        contents = []
        for shard, device in zip(self._shards, self._devices):
            with v1.device(device):
                contents.append(shard.map.pairs())
        return contents

    def rows(self, storage: str, width: int, initializer) -> tf.Tensor:
        """[batch, width]: each ID's row of the trained variable `storage` (one per shard)."""
        found = _crossed(self.distinct.joined(dict(zip(self.parts, self.shard_parts(storage, width, initializer))),
                                              self.column))
        return tf.gather(found, self.distinct.column_positions[self.column] - self.distinct.bounds[self.column])

    def storage(self, storage: str, width: int, initializer) -> list[tf.Variable]:
        """Each shard's variable of the trained value `storage` (its rows), made on its device."""
        variables = []
        with v1.variable_scope(self._scope, auxiliary_name_scope=False):
            for shard, device in enumerate(self._devices):
                with v1.device(device), v1.variable_scope(f"shard{shard}"):
                    rows = self._shards[shard]
                    values = row_variable(storage, [rows.start_rows, width], initializer, grow=self.options.grow)
                    rows.storages.append((values, initializer))
                    if self.options.grow:
                        self.graph_tables.of().row_locks[values.ref()] = rows.lock
                    touched_rows.marks_rows_of(self.graph_tables, values, rows.marker)
                    variables.append(values)
        return variables

    @property
    def shards(self) -> list[Shard]:
        return self._shards

    def found_rows(self, shard: int) -> tf.Tensor:
        """The rows of the shard's keys (self.keys[shard]), on its device, once admitted."""
        return self._found_rows[shard]

    def shard_parts(self, storage: str, width: int, initializer) -> list[tf.Tensor]:
        """Each shard's part, made on its device: [the column's distinct IDs it holds, width], their rows."""
        parts = []
        with v1.variable_scope(self._scope, auxiliary_name_scope=False):
            for shard, (device, values) in enumerate(zip(self._devices, self.storage(storage, width, initializer))):
                with v1.device(device), v1.variable_scope(f"shard{shard}"):
                    found = self._found_rows[shard]
                    if self.options.grow and not self._training:  # a save may catch a map naming rows not held
                        found = tf.where(found < tf.shape(values, out_type=tf.int64)[0], found, DEFAULT_ROW)
                    gradients = {"ResourceGather": _ROWS_GATHER_GRADIENT} if self.options.grow else {}
                    with v1.get_default_graph().gradient_override_map(gradients):
                        parts.append(tf.gather(values, found))
        return parts


_ROWS_GATHER_GRADIENT = "PsTrainerRowsGather"
_DENSE_GRADIENT = "PsTrainerDenseGradient"


@tf.RegisterGradient(_ROWS_GATHER_GRADIENT)
def _rows_gather_gradient(op, grad):
    """The gradient of a gather from a row variable: TensorFlow's (ResourceGather's), but for the
    IndexedSlices' dense shape, left unset. TensorFlow's reads the variable's shape when its length is
    unknown (a growing row variable's): an op on the ps whose result the worker would wait for at every
    step, one round trip per variable. No sparse apply reads the dense shape."""
    width = op.outputs[0].shape[-1]
    return tf.IndexedSlices(tf.reshape(grad, [-1, width]), tf.reshape(op.inputs[1], [-1])), None


@tf.RegisterGradient(_DENSE_GRADIENT)
def _dense_gradient(op, grad):
    """An Identity's gradient made dense where the Identity is: the batch's gradients summed per
    distinct ID on the worker, before they cross."""
    del op
    return tf.convert_to_tensor(grad)


def _crossed(rows) -> tf.Tensor:
    """rows, the distinct IDs' rows come from the ps tasks, as the worker's: the gradient of the gather
    that spreads them over the batch is summed per row here (a dense tensor of the distinct rows), not
    sent to each ps as a row per ID of the batch."""
    with v1.get_default_graph().gradient_override_map({"Identity": _DENSE_GRADIENT}):
        return tf.identity(rows)


def rows_of_columns(tables: list[DynamicTable], storage: str, width: int, initializer) -> tf.Tensor:
    """[batch, len(tables), width]: each table's rows() of `storage`, from one tensor per ps for all the
    tables: the parts of the shards on a ps joined there before they cross (each table built with
    `column` of one tensor of IDs), and put together on the worker. Built with model/multi_valued.ColumnIds:
    [ids, width], a row per ID in its flat() order."""
    _check_columns(tables)
    by_part = {}  # part: the rows of each table's shard there, column after column (as its IDs crossed)
    for table in tables:
        for part, rows in zip(table.parts, table.shard_parts(storage, width, initializer)):
            by_part.setdefault(part, []).append(rows)
    joined = {}
    for part, rows in sorted(by_part.items()):
        with v1.device(tables[0].options.device(part)):
            joined[part] = tf.concat(rows, axis=0) if len(rows) > 1 else rows[0]
    return tf.gather(_crossed(tables[0].distinct.joined(joined)), tables[0].distinct.positions)


def pairs_of_columns(tables: list[DynamicTable]) -> tf.Tensor:
    """Where the rows of each ID of the tables' one tensor of IDs lie, once admitted: model/grouped_lookup's
    (cell, row) pair, cell << ROW_BITS | row, a cell being one shard of one column's table (column * shards +
    shard: the cells of grouped_lookup.lookup([each column's row variables, ...])). One int64 per ID in the
    IDs' order ([batch, columns] row by row, or ColumnIds' flat() order), from one tensor per ps."""
    _check_columns(tables)
    by_part = {}
    for column, table in enumerate(tables):
        for shard, part in enumerate(table.parts):
            with v1.device(table.options.device(part)):
                cell = column * table.options.shards + shard
                by_part.setdefault(part, []).append(
                    tf.bitwise.bitwise_or(tf.constant(cell << grouped_lookup.ROW_BITS, tf.int64),
                                          table.found_rows(shard)))
    joined = {}
    for part, pairs in sorted(by_part.items()):
        with v1.device(tables[0].options.device(part)):
            joined[part] = tf.concat(pairs, axis=0) if len(pairs) > 1 else pairs[0]
    return tf.reshape(tf.gather(tables[0].distinct.joined(joined), tables[0].distinct.positions), [-1])


def _check_columns(tables: list[DynamicTable]) -> None:
    if any(table.column != column or table.distinct is not tables[0].distinct for column, table in enumerate(tables)):
        raise ValueError("the tables are not the columns of one tensor of IDs, in order")


def rows_lock(graph_tables: GraphTables, variable) -> tf.CriticalSection | None:
    """The lock of the shard whose rows `variable` holds, if it is a row variable of a dynamic table of
    `graph_tables`: an optimizer updates it inside (model/tables.RowUpdate), as model/dynamic/upkeep.py
    changes it there."""
    return graph_tables.of(variable.graph).row_locks.get(variable.ref())
