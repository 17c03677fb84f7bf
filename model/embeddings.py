"""Dynamic embedding tables: a row per raw ID, made the first time the ID is admitted, no collisions.

TF 2.21 cannot train the values of a hash table (lookups have no gradient), so a table here is, per
shard: an ID -> row map (MutableHashTable) beside ordinary trainable row variables, and a counter of
rows handed out. The model gathers rows by index, so the gradient is the usual IndexedSlices and any
optimizer's sparse apply updates just the rows a batch touched, on the ps that holds them. IDs are
spread over a table's shards by a hash of the ID, each shard pinned to a ps (TableOptions.part: whole
tables, one shard each, spread over the ps tasks a column each in turn); a lookup, its gradient and
its update all run on that shard's ps. The map, the counter and the rows
are saved by the ps that holds them with every checkpoint, and a ps restarted alone gets them back
with the rest of the variables.

Row 0 of each shard is the default row: the ID "" (an empty field), an ID not yet admitted
(--embedding_min_count) and, when serving, an ID never seen in training read it, and train it.

Rows are handed out under a lock per shard (a CriticalSection on its ps): workers meeting one new ID at
once give it one row. Without TableOptions.grow a shard holds its capacity of rows from the start.
With it (--embedding_growth) a shard's row storage grows with the IDs it meets: its variables (the
trained rows, their optimizer slots, the last-read steps) have a static shape of [None, width] and
start at GROWTH_ROWS rows (fewer when --embedding_capacity is smaller); they are ordinary resource
variables, so the gather's gradient is an IndexedSlices and TensorFlow's own sparse applies update
them. Admission hands out only rows the storage holds ("rows_held"). Every few training runs, a
worker reads whether each shard needs room (Upkeep: two counters on each ps); once fewer than half a
growth step of rows are left past what the last admission wanted, it grows every row variable of the
shard by max(GROWTH_ROWS, 1/8 of its rows), up to --embedding_capacity, the limit past which a table
stops training with a message naming it. IDs that meet a shard with no row left read the default row
until a later sighting admits them, as if seen one time fewer.

A growth copies each variable into a longer one, one at a time (the extra memory is one variable's
copy), inside the shard's lock; the optimizers update a growing table's rows inside that lock too
(training/optimizers.RowsLocked), so that no update meets a row variable and a slot of different
lengths, and none is lost to a copy.

With --embedding_steps_to_live=S the chief, before each checkpoint, evicts the IDs whose rows no step
read in the last S global steps: their rows (and optimizer slots) go back to fresh values and are
handed out again before new ones.

rows_held is not checkpointed: after every restore, the Upkeep's reconciliation sets it from the
restored variables (and grows any that a save caught mid-growth, so that every row variable of a shard holds the
same rows, and every row the map names).
"""

import dataclasses
import functools
import re
from typing import NamedTuple

import numpy as np
import tensorflow as tf
from tensorflow.python.training.saving import saveable_object  # the Saver's interface for a table

from model import layers, registry, touched_rows

v1 = tf.compat.v1

DEFAULT_ROW = 0
# The fewest rows a shard's storage starts with and grows by (it grows by 1/8 of itself when that is more).
GROWTH_ROWS = 8192
# Training runs between two reads of whether a shard needs room (Upkeep): half a growth step of room,
# 4,096 rows a shard at least, covers a few runs of new IDs from every worker.
UPKEEP_EVERY_N_RUNS = 4
# Each shard's live rows (the IDs in its map), named <table>/shard<N>/live_rows: for the log and the
# summaries.
LIVE_ROWS = "ps_trainer_live_rows"
# Each growing shard's rows_held and rows_wanted: state that a checkpoint should not hold (the Upkeep's
# reconciliation sets it after a restore).
ROWS_HELD = "ps_trainer_rows_held"


@dataclasses.dataclass(frozen=True)
class TableOptions:
    """What is particular to a table: its limit, its shards, and its admission rule."""

    capacity: int  # the most rows over all shards, the default rows included
    shards: int = 1
    # Where each shard lives (the ps tasks, in order); empty: wherever the caller's device scope says.
    devices: tuple[str, ...] = ()
    # An ID gets a row of its own from its min_count-th sighting; until then it reads the default row.
    min_count: int = 1
    # A row no training step read for this many global steps is evicted at the next checkpoint (its
    # ID removed, the row reset and handed out again); 0: never.
    steps_to_live: int = 0
    # The storage grows with the IDs met, up to capacity; else it holds capacity rows from the start.
    grow: bool = False
    # Training marks the rows it changes, for incremental checkpoints (model/touched_rows.py).
    mark_changes: bool = False

    def shard_capacity(self) -> int:
        return -(-self.capacity // self.shards)

    @property
    def parts(self) -> int:
        """How many tensors of IDs a batch's distinct IDs are cut into: one per ps (per shard when
        there are more shards than ps tasks, or no devices), each holding the IDs of the shards there."""
        return max(self.shards, len(self.devices))

    def part(self, column: int, shard: int) -> int:
        """Which part holds `shard` of the table of `column`: the shards of consecutive columns start on
        consecutive ps tasks, so that whole tables (one shard each) spread over them."""
        return (column + shard) % self.parts

    def device(self, part: int) -> str | None:
        return self.devices[part % len(self.devices)] if self.devices else None


class DistinctIds:
    """A batch's distinct IDs, found on the worker for every column at once, and cut there into parts by
    where their shard lives (TableOptions.part): in place of the batch, each ps holding shards of the
    columns' tables is sent one tensor per part: the part's IDs column after column, then where each
    column starts (written as IDs: a string's digits, or the int64 itself). With admission
    (--embedding_min_count) each ID's count in the batch crosses too."""

    def __init__(self, ids: tf.Tensor, options: TableOptions):
        found = [tf.unique_with_counts(_unreserved(ids[:, c]), out_idx=tf.int64) for c in range(ids.shape[1])]
        self.columns = len(found)
        parts = options.parts
        sizes = tf.stack([tf.size(f.y, out_type=tf.int64) for f in found])
        self.bounds = bounds = tf.concat([[0], tf.cumsum(sizes)], 0)  # where each column starts, and the end
        # [batch, columns]: each ID's place among the distinct IDs of every column, column after column.
        self.positions = tf.stack([bounds[c] + f.idx for c, f in enumerate(found)], axis=1)
        counts = tf.concat([f.count for f in found], 0)  # each distinct ID's occurrences in its column
        if parts == 1:  # the columns' IDs cross as they are, joined once
            self.places, pieces, self._counts = None, [[f.y for f in found]], [counts]
            part_bounds = [bounds]
        else:
            every = tf.concat([f.y for f in found], 0)
            column = tf.repeat(tf.range(self.columns), sizes)
            part = tf.math.floormod(column + _shard_of(every, options.shards), parts)  # TableOptions.part
            # Where each part's IDs sit among all the distinct IDs (dynamic_stitch puts its rows back there).
            self.places = tf.dynamic_partition(tf.range(tf.size(every)), part, parts)
            pieces = [[ids_of_part] for ids_of_part in tf.dynamic_partition(every, part, parts)]
            self._counts = tf.dynamic_partition(counts, part, parts)
            held = tf.reshape(tf.math.bincount(part * self.columns + column, minlength=parts * self.columns,
                                               maxlength=parts * self.columns, dtype=tf.int64),
                              [parts, self.columns])  # each part's IDs of each column
            part_bounds = tf.unstack(tf.concat([tf.zeros([parts, 1], tf.int64), tf.cumsum(held, axis=1)], 1))
        self.part_bounds = part_bounds
        self._crossing = [tf.concat(piece + [tf.strings.as_string(b) if ids.dtype == tf.string else b], 0)
                          for piece, b in zip(pieces, part_bounds)]
        self._received = {}

    def on(self, part: int, device) -> tuple[tf.Tensor, tf.Tensor]:
        """(the part's distinct IDs, [columns + 1]: where each column starts among them, and the end),
        read on `device` from the one tensor that crossed there."""
        if part not in self._received:
            crossing = self._crossing[part]
            with v1.device(device):
                ends = tf.size(crossing, out_type=tf.int64) - (self.columns + 1)
                written = crossing[ends:]
                bounds = tf.strings.to_number(written, tf.int64) if written.dtype == tf.string else written
                self._received[part] = crossing[:ends], bounds
        return self._received[part]

    def counts_of(self, part: int) -> tf.Tensor:
        """Each of the part's distinct IDs' occurrences in the batch (on the worker)."""
        return self._counts[part]

    def joined(self, rows: dict[int, tf.Tensor], column: int | None = None) -> tf.Tensor:
        """{part: a row per distinct ID of the part (of every column, or of `column`)}, put together on
        the worker in the order of the distinct IDs (of every column, or of `column`). A part missing
        from `rows` holds none of them."""
        if self.places is None:
            return rows[0]
        if column is None:
            places = [self.places[part] for part in rows]
        else:
            start = tf.cast(self.bounds[column], tf.int32)
            places = [self.places[part][self.part_bounds[part][column]:self.part_bounds[part][column + 1]] - start
                      for part in rows]
        return tf.dynamic_stitch(places, list(rows.values()))


def distinct_ids(ids: tf.Tensor, options: TableOptions) -> DistinctIds:
    """The DistinctIds of ids [batch, columns] for tables of `options`, on the caller's device; each
    built once per tensor of IDs and cut into parts, which every table of its columns shares."""
    built = registry.of(ids.graph).distinct_ids
    key = (ids.name, options.shards, options.devices)
    if key not in built:
        built[key] = DistinctIds(ids, options)
    return built[key]


class DynamicTable:
    """The rows of a batch of raw IDs: `DynamicTable(name, ids, options, training).rows(...)`.

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

    def __init__(self, name: str, ids: tf.Tensor, options: TableOptions, training: bool, column: int | None = None):
        self.name, self.options, self._training = name, options, training
        self._scope = v1.get_variable_scope()
        self.distinct = distinct_ids(ids if column is not None else tf.reshape(ids, [-1, 1]), options)
        self.column = column or 0
        self._shards, self._found_rows, self._devices, live_rows = [], [], [], []
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
                rows = _Shard(ids.dtype, options, shard, training, device)
                self._shards.append(rows)
                self._found_rows.append(rows.rows_of(keys, counts, training, name))
                live_rows.append(tf.identity(rows.map.size(), name="live_rows"))
                v1.add_to_collection(LIVE_ROWS, live_rows[-1])
        if training:
            v1.summary.scalar("live_rows", tf.add_n(live_rows))
            registry.of().trained_shards.extend((name, s) for s in self._shards)

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
        return tf.gather(found, self.distinct.positions[:, self.column] - self.distinct.bounds[self.column])

    def shard_parts(self, storage: str, width: int, initializer) -> list[tf.Tensor]:
        """Each shard's part, made on its device: [the column's distinct IDs it holds, width], their rows."""
        parts = []
        with v1.variable_scope(self._scope, auxiliary_name_scope=False):
            for shard, device in enumerate(self._devices):
                with v1.device(device), v1.variable_scope(f"shard{shard}"):
                    rows = self._shards[shard]
                    values = _row_variable(storage, [rows.start_rows, width], initializer, grow=self.options.grow)
                    rows.storages.append((values, initializer))
                    if self.options.grow:
                        registry.of().row_locks[values.op.name] = rows.lock
                    touched_rows.marks_rows_of(values, rows.marker)
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
    `column` of one tensor of IDs), and put together on the worker."""
    if any(table.column != column or table.distinct is not tables[0].distinct for column, table in enumerate(tables)):
        raise ValueError("rows_of_columns: the tables are not the columns of one tensor of IDs, in order")
    by_part = {}  # part: the rows of each table's shard there, column after column (as its IDs crossed)
    for table in tables:
        for part, rows in zip(table.parts, table.shard_parts(storage, width, initializer)):
            by_part.setdefault(part, []).append(rows)
    joined = {}
    for part, rows in sorted(by_part.items()):
        with v1.device(tables[0].options.device(part)):
            joined[part] = tf.concat(rows, axis=0) if len(rows) > 1 else rows[0]
    return tf.gather(_crossed(tables[0].distinct.joined(joined)), tables[0].distinct.positions)


class _Shard:
    """One shard's map (ID -> row), its row counters, its free rows, and its admission counts.

    Rows are handed out and taken back, and the storage grown, inside one CriticalSection per shard (a
    lock on its ps), so that workers admitting IDs at once, and the chief evicting, never hand one row
    to two IDs and never lose one."""

    def __init__(self, key_dtype, options: TableOptions, shard: int, training: bool, device: str | None):
        self.options, self.shard = options, shard
        self.scope = v1.get_variable_scope().name  # its name: a table built twice shares it
        self.capacity = options.shard_capacity()
        self.start_rows = min(self.capacity, GROWTH_ROWS) if options.grow else self.capacity
        # The trained variables whose rows this shard hands out (DynamicTable.rows), with their initializers.
        self.storages = []
        self.map = _checkpointed_map(key_dtype, -1, "rows_of_ids")
        # The next row never handed out; row 0 is the default row.
        self.next_row = _counter("next_row", DEFAULT_ROW + 1)
        self.held = self.wanted = None
        if training and options.grow:  # (no checkpoint holds them: a graph that serves has none)
            # The rows every row variable of the shard holds: admission hands out no row past it.
            self.held = _counter("rows_held", self.start_rows)
            # The rows the last admission wanted (next_row with every ID it met admitted): upkeep() makes room.
            self.wanted = _counter("rows_wanted", DEFAULT_ROW + 1)
            v1.add_to_collection(ROWS_HELD, self.held)
            v1.add_to_collection(ROWS_HELD, self.wanted)
        self.sightings = _checkpointed_map(key_dtype, 0, "sightings") if options.min_count > 1 else None
        self.lock = tf.CriticalSection(shared_name=f"{self.scope}/rows_lock")
        self.free_rows = self.free_count = self.last_seen = None
        if options.steps_to_live:
            # Rows evicted, to hand out again before new ones: free_rows[:free_count].
            self.free_rows = _row_variable("free_rows", [0], v1.zeros_initializer(), tf.int64, trainable=False)
            self.free_count = _counter("free_count", 0)
            # The global step at which each row was last read in training.
            self.last_seen = _row_variable("last_seen", [self.start_rows], v1.zeros_initializer(), tf.int64,
                                           trainable=False, grow=options.grow)
        # The rows changed since the last checkpoint (None unless training marks them), and the group
        # an incremental checkpoint saves them by.
        self.marker = touched_rows.group(self.scope, device or "", self.row_variables, self.start_rows,
                                         mark=training and options.mark_changes, grow=options.grow,
                                         table_map=self.map)
        if self.last_seen is not None:
            touched_rows.marks_rows_of(self.last_seen, self.marker)

    def locked(self, work):
        """work() inside the shard's lock. The generation counter that marks changed rows is read under
        every shard's lock on its ps (model/touched_rows.py): a read that needs no exclusion."""
        return self.lock.execute(work, exclusive_resource_access=self.marker is None)

    def rows_of(self, keys, sightings, training: bool, table: str) -> tf.Tensor:
        if not training:
            return self._found(keys)
        found = self.map.lookup(keys)
        missing = tf.logical_and(found < 0, tf.not_equal(keys, _NO_ID[keys.dtype]))
        new_keys = layers.masked(keys, missing)
        if self.sightings is not None:
            seen = self.sightings.lookup(new_keys) + layers.masked(sightings, missing)
            count = self.sightings.insert(new_keys, seen)
            with tf.control_dependencies([count]):
                new_keys = layers.masked(new_keys, seen >= self.options.min_count)
        # The lock only when there is something to admit: most steps of a warm table meet no new ID.
        admitted = tf.cond(tf.size(new_keys) > 0, lambda: self.locked(lambda: self._admit(new_keys, table)),
                           lambda: tf.constant(0, tf.int64))
        with tf.control_dependencies([admitted]):
            rows = self._found(keys)
        if not self.options.steps_to_live:
            return rows
        touched = v1.scatter_update(self.last_seen, rows, tf.fill(tf.shape(rows), v1.train.get_global_step()))
        with tf.control_dependencies([touched]):
            return tf.identity(rows)

    def _admit(self, new_keys, table: str) -> tf.Tensor:
        """Rows for the IDs of new_keys still without one (another worker may have admitted some since),
        as many as the storage holds; inside the lock. Returns how many were admitted, once every
        change is made."""
        fresh = layers.masked(new_keys, self.map.lookup(new_keys) < 0)
        count = tf.size(fresh, out_type=tf.int64)
        changes = []
        reused = tf.zeros([0], tf.int64)
        if self.options.steps_to_live:
            free = self.free_count.read_value()
            taken = tf.minimum(count, free)
            reused = tf.gather(self.free_rows, tf.range(free - taken, free))
            changes.append(self.free_count.assign_sub(taken))
        wanted = count - tf.size(reused, out_type=tf.int64)
        first = self.next_row.read_value()
        full = tf.debugging.assert_less_equal(
            first + wanted, tf.constant(self.capacity, tf.int64),
            message=f"embedding table {table} is full: shard {self.shard} holds {self.capacity} rows "
                    f"(--embedding_capacity={self.options.capacity} over {self.options.shards} shards); "
                    + ("raise --embedding_capacity and resume" if self.options.grow else
                       "raise --embedding_capacity, in a new --model_dir (its tables hold their capacity)"))
        with tf.control_dependencies([full]):
            more = tf.identity(wanted)
            if self.options.grow:  # the rest wait for the storage to grow (upkeep())
                more = tf.maximum(tf.minimum(wanted, self.held.read_value() - first), 0)
                changes.append(self.wanted.assign(first + wanted))
        with tf.control_dependencies([self.next_row.assign_add(more)]):
            rows = tf.concat([reused, first + tf.range(more, dtype=tf.int64)], axis=0)
        admitted = fresh[:tf.size(rows)]
        changes.append(self.map.insert(admitted, rows))
        if self.marker is not None:  # the map changed: the next delta holds these rows' IDs
            with tf.control_dependencies(changes[-1:]):
                changes.append(touched_rows.mark(self.marker, rows))
        if self.sightings is not None:  # counted until admitted, no longer
            changes.append(self.sightings.remove(admitted))
        with tf.control_dependencies(changes):
            return tf.size(rows, out_type=tf.int64)

    def row_variables(self, slots_of) -> list[tuple[tf.Variable, object]]:
        """(variable, fresh(n): n rows as a new row starts) for each variable with a row per row of the
        shard: the trained ones, their optimizer slots (`slots_of(variable)`: (slot, start value)
        pairs), the last-read steps."""
        found = []
        for variable, initializer in dict((id(v), (v, i)) for v, i in self.storages).values():
            width = variable.shape[1]
            found.append((variable, lambda n, i=initializer, v=variable, w=width: i(tf.stack([n, w]), dtype=v.dtype)))
            for slot, start in slots_of(variable):
                found.append((slot, lambda n, s=slot, w=width, x=start: tf.fill(tf.stack([n, w]),
                                                                                tf.cast(x, s.dtype))))
        if self.last_seen is not None:  # a new row counts as read at the newest step any row was
            def newest(n):
                latest = tf.reduce_max(tf.concat([self.last_seen, tf.zeros([1], tf.int64)], 0))
                return tf.fill(tf.reshape(n, [1]), latest)
            found.append((self.last_seen, newest))
        if self.marker is not None:  # rows added, or reset by an eviction, are changed rows
            found.append((self.marker, lambda n, m=self.marker: tf.fill(tf.reshape(n, [1]), touched_rows.current(m))))
        return found

    def _grow_to(self, target, variables) -> tf.Operation:
        """Every variable of `variables` holding `target` rows (or more), one copy at a time; then
        rows_held. Inside the lock."""
        previous = []
        for variable, fresh in variables:
            with tf.control_dependencies(previous):
                value = variable.read_value()
                more = tf.maximum(target - tf.shape(value, out_type=tf.int64)[0], 0)
                previous = [variable.assign(tf.concat([value, fresh(more)], 0), read_value=False)]
        with tf.control_dependencies(previous):
            return self.held.assign(target, read_value=False)

    def _step_and_need(self):
        """(rows held, rows wanted, growth step, whether to grow): fewer than half a growth step of rows
        left past those the last admission wanted (all of its IDs, those it could not admit included)."""
        held, wanted = self.held.read_value(), self.wanted.read_value()
        step = tf.maximum(tf.constant(GROWTH_ROWS, tf.int64), held // 8)
        return held, wanted, step, tf.logical_and(wanted + step // 2 > held, held < self.capacity)

    def need(self) -> tf.Tensor:
        """Whether the shard's storage should grow: two counters read on its ps."""
        return self._step_and_need()[-1]

    def grow(self, slots_of) -> tf.Operation:
        """Grows every row variable of the shard by a growth step, if it still needs it once in the lock
        (another worker may have grown it)."""
        variables = self.row_variables(slots_of)

        def grow():
            held, wanted, step, need = self._step_and_need()
            grown = tf.minimum(tf.constant(self.capacity, tf.int64), tf.maximum(held, wanted) + step)
            return _done(self._grow_to(tf.where(need, grown, held), variables))

        return self.locked(grow).op

    def reconcile(self, slots_of) -> tf.Operation:
        """After a restore: every row variable holding as many rows as the largest of them and as the map
        names, next_row past every row the map names, rows_held set. A save is not atomic: one that
        caught a growth or an admission between its reads restores variables of different lengths, or a
        map naming rows past next_row (which would be handed out twice)."""
        variables = self.row_variables(slots_of)

        def reconciled():
            named = tf.reduce_max(tf.concat([self.map.pairs()[1], tf.zeros([1], tf.int64)], 0)) + 1
            next_row = tf.maximum(self.next_row.read_value(), named)
            target = tf.reduce_max(tf.stack([next_row] + [tf.shape(v, out_type=tf.int64)[0] for v, _ in variables]))
            with tf.control_dependencies([self.next_row.assign(next_row), self.wanted.assign(next_row)]):
                return _done(self._grow_to(target, variables))

        return self.locked(reconciled).op

    def evict(self, slots_of) -> tf.Tensor:
        """Removes the IDs whose rows no training step read for steps_to_live global steps, resets
        those rows (and their optimizer slots) to fresh values and frees them; inside the lock.
        Returns how many were evicted."""
        variables = self.row_variables(slots_of)
        oldest = v1.train.get_global_step().read_value() - self.options.steps_to_live  # read outside the lock

        def evict_stale():
            keys, rows = self.map.pairs()
            stale = tf.gather(self.last_seen, rows) < oldest
            stale_keys, stale_rows = layers.masked(keys, stale), layers.masked(rows, stale)
            count = tf.size(stale_rows, out_type=tf.int64)
            free = tf.concat([self.free_rows[:self.free_count.read_value()], stale_rows], 0)
            changes = [self.map.remove(stale_keys), self.free_rows.assign(free, read_value=False)]
            with tf.control_dependencies(changes[-1:]):
                changes.append(self.free_count.assign(tf.size(free, out_type=tf.int64)))
            for variable, fresh in variables:
                if variable is not self.last_seen:
                    changes.append(v1.scatter_update(variable, stale_rows, fresh(count)))
            with tf.control_dependencies(changes):
                return tf.identity(count)

        return self.locked(evict_stale)

    def _found(self, keys):
        found = self.map.lookup(keys)
        return tf.where(found < 0, tf.constant(DEFAULT_ROW, tf.int64), found)


def _trained_shards(graph=None, evicting=False):
    """(table, shard) of the tables trained in the graph that grow (or, `evicting`, that evict), each
    shard once (a table built twice shares them)."""
    unique = {}
    for table, shard in registry.of(graph).trained_shards:
        if shard.options.steps_to_live if evicting else shard.options.grow:
            unique.setdefault(shard.scope, (table, shard))
    return list(unique.values())


def rows_lock(variable) -> tf.CriticalSection | None:
    """The lock of the shard whose rows `variable` holds, if it is a dynamic table's row variable: an
    optimizer updates it inside (training/optimizers.RowsLocked), as upkeep() changes it there."""
    return registry.of(variable.graph).row_locks.get(variable.op.name)


class Upkeep(NamedTuple):
    """The upkeep of the default graph's trained tables: `needs`, one bool vector per ps, whether each of
    its shards' storage should grow (two counters read per shard, stacked there so that a read of them
    is one tensor per ps); `grows`, each shard's growth, in the order of the needs' elements;
    `reconciles`, what runs after a restore (_Shard.reconcile). Training reads the needs every few runs
    and grows the shards that need it."""
    needs: tuple = ()
    grows: tuple = ()
    reconciles: tuple = ()

    def grow_as_needed(self, session, needs) -> None:
        """Grows the shards whose `needs` (as read) say so."""
        grows = [grow for grow, need in zip(self.grows, (flag for vector in needs for flag in vector)) if need]
        if grows:
            session.run(grows)

    def after_restore(self, session) -> None:
        if self.reconciles:
            session.run(list(self.reconciles))


def upkeep(slots_of, restores: bool = True) -> Upkeep:
    """The Upkeep of the default graph's trained tables. `slots_of(variable)`: the optimizer's (slot,
    start value) pairs, whose rows grow with the variable's. restores=False (a graph that never restores
    a checkpoint: a non-chief worker's) builds no reconciliation: a third of a dynamic model's graph."""
    by_device = {}
    for _, shard in _trained_shards():
        by_device.setdefault(shard.map.resource_handle.device, []).append(shard)
    needs, grows, reconciles = [], [], []
    for device, shards in by_device.items():
        with v1.device(device):
            needs.append(tf.stack([shard.need() for shard in shards]))
            for shard in shards:
                grows.append(shard.grow(slots_of))
                if restores:
                    reconciles.append(shard.reconcile(slots_of))
    return Upkeep(tuple(needs), tuple(grows), tuple(reconciles))


def eviction(slots_of) -> dict[str, tf.Tensor] | None:
    """{table: rows evicted} ops of the default graph's tables with steps_to_live, each shard in its lock;
    `slots_of(variable)`: the optimizer's (slot, start value) pairs to reset with a row. None if no
    table evicts."""
    evictable = _trained_shards(evicting=True)
    if not evictable:
        return None
    counts = {}
    for table, shard in evictable:
        with v1.device(shard.map.resource_handle.device):
            counts.setdefault(table, []).append(shard.evict(slots_of))
    return {table: tf.add_n(shard_counts) for table, shard_counts in counts.items()}


def _done(op) -> tf.Tensor:
    with tf.control_dependencies([op]):
        return tf.constant(True)


def _counter(name: str, start: int):
    return v1.get_variable(name, [], tf.int64, initializer=v1.constant_initializer(start), trainable=False)


def _row_variable(name: str, shape: list, initializer, dtype=tf.float32, trainable=True, grow=True):
    """A variable of `shape`; with `grow`, one whose first dimension can grow: its static shape is [None,
    ...shape[1:]], so it can be assigned a longer value, and its optimizer slots are made the same way."""
    if not grow:
        return v1.get_variable(name, shape, dtype, initializer=initializer, trainable=trainable)

    def growable(next_creator, **kwargs):
        kwargs["shape"] = tf.TensorShape([None, *shape[1:]])
        return next_creator(**kwargs)

    with tf.variable_creator_scope(growable):
        return v1.get_variable(name, shape, dtype, initializer=initializer, trainable=trainable)


def full_table_message(error_message: str) -> str | None:
    """The one line a full table's failed assertion carries, else None."""
    found = re.search(r"embedding table \S+ is full: [^\]]*", error_message)
    return found.group(0) if found else None


def _checkpointed_map(key_dtype, default_value: int, name: str):
    """An ID -> int64 map named by its variable scope: its checkpoint keys are its name plus "-keys" and
    "-values", and the workers share it on its ps by that name."""
    full_name = f"{v1.get_variable_scope().name}/{name}"
    with v1.name_scope(None):
        return _Map(key_dtype, default_value, full_name)


# The keys a _Map keeps for its empty and removed buckets; IDs equal to them count as no ID (_unreserved).
_EMPTY_KEY = {tf.int64: np.iinfo(np.int64).min, tf.string: "\0ps_trainer:empty"}
_DELETED_KEY = {tf.int64: np.iinfo(np.int64).min + 1, tf.string: "\0ps_trainer:deleted"}
# No ID (an empty field): it reads the default row and is never admitted.
_NO_ID = {tf.int64: np.iinfo(np.int64).min + 2, tf.string: ""}
_FIRST_BUCKETS = 1024


class _Map(tf.lookup.experimental.DenseHashTable):
    """TensorFlow's open-addressing hash table, checkpointed as the (key, value) pairs that a
    MutableHashTable saves, under the same names: so a checkpoint of either kind restores into it.

    Its buckets are an array of keys beside an array of values (16 bytes a bucket for int64 keys, 32 for
    strings), at most 80% full, doubled when fuller (MutableHashTable takes about 130 bytes an entry on
    the ps: docs/data.md). Its own checkpoint would hold the bucket arrays, empty
    buckets included and placed by hash; the pairs are what every other reader of a checkpoint knows."""

    def __init__(self, key_dtype, default_value: int, name: str):
        # checkpoint=True: the workers share it on its ps by its node name, as they do a MutableHashTable.
        self.full_name = name  # its checkpoint keys' prefix (TensorFlow's `name` is the last part)
        super().__init__(key_dtype, tf.int64, default_value, empty_key=_EMPTY_KEY[key_dtype],
                         deleted_key=_DELETED_KEY[key_dtype], initial_num_buckets=_FIRST_BUCKETS, name=name,
                         checkpoint=True)
        saveables = v1.get_collection_ref(v1.GraphKeys.SAVEABLE_OBJECTS)
        saveables[:] = [saveable for saveable in saveables if getattr(saveable, "op", None) is not self]
        saveables.append(_MapPairs(self, name))

    def pairs(self) -> tuple[tf.Tensor, tf.Tensor]:
        """(keys, values) of every entry, read on its ps."""
        with tf.compat.v1.colocate_with(self.resource_handle):
            keys, values = (tf.reshape(exported, [-1]) for exported in self.export())
            used = tf.reshape(tf.where(tf.logical_and(tf.not_equal(keys, self._empty_key),
                                                      tf.not_equal(keys, self._deleted_key))), [-1])
            return tf.gather(keys, used), tf.gather(values, used)


class _MapPairs(saveable_object.SaveableObject):
    """A _Map's checkpoint: its pairs, as "<name>-keys" and "<name>-values". A restore removes what the
    map holds, then inserts the pairs."""

    def __init__(self, table: _Map, name: str):
        # The pairs are read when a Saver builds its save ops (not for a graph that only restores), once.
        pairs = functools.cache(table.pairs)
        device = table.resource_handle.device
        super().__init__(table, [
            saveable_object.SaveSpec(lambda: pairs()[0], "", f"{name}-keys", table.key_dtype, device),
            saveable_object.SaveSpec(lambda: pairs()[1], "", f"{name}-values", tf.int64, device)], name)

    def restore(self, restored_tensors, restored_shapes):
        del restored_shapes
        keys, values = restored_tensors
        with tf.compat.v1.colocate_with(self.op.resource_handle):
            with tf.control_dependencies([self.op.remove(self.op.pairs()[0])]):
                return self.op.insert(keys, values)


def _unreserved(ids):
    """ids, with those a _Map keeps for itself made no ID (_NO_ID): so the three lowest int64 values, and
    two strings that start with a NUL byte, read the default row, as an empty field does."""
    if ids.dtype == tf.int64:
        return tf.maximum(ids, _NO_ID[tf.int64])
    reserved = tf.logical_or(tf.equal(ids, _EMPTY_KEY[tf.string]), tf.equal(ids, _DELETED_KEY[tf.string]))
    return tf.where(reserved, _NO_ID[tf.string], ids)


def _shard_of(ids, shards: int) -> tf.Tensor:
    if shards == 1:
        return tf.zeros(tf.shape(ids), tf.int32)
    if ids.dtype == tf.string:
        return tf.cast(tf.strings.to_hash_bucket_fast(ids, shards), tf.int32)
    return tf.cast(tf.math.floormod(ids, shards), tf.int32)
