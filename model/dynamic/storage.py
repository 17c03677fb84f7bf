"""A dynamic table's shard: its ID -> row map, its row counters, the row variables it hands rows of, and the
admission that gives an ID a row.

TF 2.21 cannot train the values of a hash table (lookups have no gradient), so a shard is an ID -> row map
(Map) beside ordinary trainable row variables, and a counter of rows handed out. The model gathers rows by
index (model/dynamic/table.py), so the gradient is the usual IndexedSlices and any optimizer's sparse apply
updates just the rows a batch touched, on the ps that holds them. The map, the counter and the rows are
saved by the ps that holds them with every checkpoint, and a ps restarted alone gets them back with the
rest of the variables.

Row 0 of each shard is the default row: the ID "" (an empty field), an ID not yet admitted
(--embedding_min_count) and, when serving, an ID never seen in training read it, and train it.

Rows are handed out under a lock per shard (a CriticalSection on its ps): workers meeting one new ID at
once give it one row. Without TableOptions.grow a shard holds its capacity of rows from the start. With it
(--embedding_growth) its row variables (the trained rows, their optimizer slots, the last-read steps) have
a static shape of [None, width] and start at GROWTH_ROWS rows (fewer when --embedding_capacity is
smaller); they are ordinary resource variables, so TensorFlow's own sparse applies update them. Admission
hands out only rows the storage holds ("rows_held"); model/dynamic/upkeep.py grows it. IDs that meet a
shard with no row left read the default row until a later sighting admits them, as if seen one time fewer.
"""

import functools
import re

import tensorflow as tf
from tensorflow.python.training.saving import saveable_object  # the Saver's interface for a table

from ps_trainer.model import layers, touched_rows
from ps_trainer.model.dynamic.ids import DELETED_KEY, EMPTY_KEY, NO_ID, TableOptions

v1 = tf.compat.v1

DEFAULT_ROW = 0
# The fewest rows a shard's storage starts with and grows by (it grows by 1/8 of itself when that is more).
GROWTH_ROWS = 8192
# Each shard's live rows (the IDs in its map), named <table>/shard<N>/live_rows: for the log and the
# summaries.
LIVE_ROWS = "ps_trainer_live_rows"
# Each growing shard's rows_held and rows_wanted: state that a checkpoint should not hold (the Upkeep's
# reconciliation sets it after a restore).
ROWS_HELD = "ps_trainer_rows_held"


class Shard:
    """One shard's map (ID -> row), its row counters, its free rows, and its admission counts.

    Rows are handed out and taken back, and the storage grown, inside one CriticalSection per shard (a
    lock on its ps), so that workers admitting IDs at once, and the chief evicting, never hand one row
    to two IDs and never lose one."""

    def __init__(self, graph_tables, key_dtype, options: TableOptions, shard: int, training: bool, device: str | None):
        self.graph_tables, self.options, self.shard = graph_tables, options, shard
        self.scope = v1.get_variable_scope().name  # its name: a table built twice shares it
        self.capacity = options.shard_capacity()
        self.start_rows = min(self.capacity, GROWTH_ROWS) if options.grow else self.capacity
        # The trained variables whose rows this shard hands out (DynamicTable.rows), with their initializers.
        self.storages = []
        self.map = checkpointed_map(key_dtype, -1, "rows_of_ids")
        # The next row never handed out; row 0 is the default row.
        self.next_row = counter("next_row", DEFAULT_ROW + 1)
        self.held = self.wanted = None
        if training and options.grow:  # (no checkpoint holds them: a graph that serves has none)
            # The rows every row variable of the shard holds: admission hands out no row past it.
            self.held = counter("rows_held", self.start_rows)
            # The rows the last admission wanted (next_row with every ID it met admitted): upkeep() makes room.
            self.wanted = counter("rows_wanted", DEFAULT_ROW + 1)
            v1.add_to_collection(ROWS_HELD, self.held)
            v1.add_to_collection(ROWS_HELD, self.wanted)
        self.sightings = checkpointed_map(key_dtype, 0, "sightings") if options.min_count > 1 else None
        self.lock = tf.CriticalSection(shared_name=f"{self.scope}/rows_lock")
        self.free_rows = self.free_count = self.last_seen = None
        if options.steps_to_live:
            # Rows evicted, to hand out again before new ones: free_rows[:free_count].
            self.free_rows = row_variable("free_rows", [0], v1.zeros_initializer(), tf.int64, trainable=False)
            self.free_count = counter("free_count", 0)
            # The global step at which each row was last read in training.
            self.last_seen = row_variable("last_seen", [self.start_rows], v1.zeros_initializer(), tf.int64,
                                           trainable=False, grow=options.grow)
        # The rows changed since the last checkpoint (None unless training marks them), and the group
        # an incremental checkpoint saves them by.
        self.marker = touched_rows.group(graph_tables, self.scope, device or "", self.row_variables, self.start_rows,
                                         mark=training and options.mark_changes, grow=options.grow,
                                         table_map=self.map)
        if self.last_seen is not None:
            touched_rows.marks_rows_of(graph_tables, self.last_seen, self.marker)

    def locked(self, work):
        """work() inside the shard's lock. The generation counter that marks changed rows is read under
        every shard's lock on its ps (model/touched_rows.py): a read that needs no exclusion."""
        return self.lock.execute(work, exclusive_resource_access=self.marker is None)

    def rows_of(self, keys, sightings, training: bool, table: str) -> tf.Tensor:
        if not training:
            return self._found(keys)
        found = self.map.lookup(keys)
        missing = tf.logical_and(found < 0, tf.not_equal(keys, NO_ID[keys.dtype]))
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
                changes.append(touched_rows.mark(self.graph_tables, self.marker, rows))
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
            found.append((self.marker, lambda n, m=self.marker: tf.fill(tf.reshape(n, [1]),
                                                                      touched_rows.current(self.graph_tables, m))))
        return found


    def _found(self, keys):
        found = self.map.lookup(keys)
        return tf.where(found < 0, tf.constant(DEFAULT_ROW, tf.int64), found)



def shard_here(graph_tables, key_dtype, options: TableOptions, shard: int, training: bool, device: str | None) -> Shard:
    """The Shard of the current variable scope, made the first time a table of `graph_tables` is built in the
    graph: a table built again (training/step/row_copies.py builds it for a round's batches) reads and admits
    into the same map (a map built twice would be two resources, its node name made unique)."""
    shards = graph_tables.of().shards
    scope = v1.get_variable_scope().name
    if scope not in shards:
        shards[scope] = Shard(graph_tables, key_dtype, options, shard, training, device)
    return shards[scope]


def counter(name: str, start: int):
    return v1.get_variable(name, [], tf.int64, initializer=v1.constant_initializer(start), trainable=False)


def row_variable(name: str, shape: list, initializer, dtype=tf.float32, trainable=True, grow=True):
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


def checkpointed_map(key_dtype, default_value: int, name: str):
    """An ID -> int64 map named by its variable scope: its checkpoint keys are its name plus "-keys" and
    "-values", and the workers share it on its ps by that name."""
    full_name = f"{v1.get_variable_scope().name}/{name}"
    with v1.name_scope(None):
        return Map(key_dtype, default_value, full_name)



_FIRST_BUCKETS = 1024


class Map(tf.lookup.experimental.DenseHashTable):
    """TensorFlow's open-addressing hash table, checkpointed as the (key, value) pairs that a
    MutableHashTable saves, under the same names: so a checkpoint of either kind restores into it.

    Its buckets are an array of keys beside an array of values (16 bytes a bucket for int64 keys, 32 for
    strings), at most 80% full, doubled when fuller (MutableHashTable takes about 130 bytes an entry on
    the ps: docs/data.md). Its own checkpoint would hold the bucket arrays, empty
    buckets included and placed by hash; the pairs are what every other reader of a checkpoint knows."""

    def __init__(self, key_dtype, default_value: int, name: str):
        # checkpoint=True: the workers share it on its ps by its node name, as they do a MutableHashTable.
        self.full_name = name  # its checkpoint keys' prefix (TensorFlow's `name` is the last part)
        super().__init__(key_dtype, tf.int64, default_value, empty_key=EMPTY_KEY[key_dtype],
                         deleted_key=DELETED_KEY[key_dtype], initial_num_buckets=_FIRST_BUCKETS, name=name,
                         checkpoint=True)
        saveables = v1.get_collection_ref(v1.GraphKeys.SAVEABLE_OBJECTS)
        saveables[:] = [saveable for saveable in saveables if getattr(saveable, "op", None) is not self]
        saveables.append(MapPairs(self, name))

    def pairs(self) -> tuple[tf.Tensor, tf.Tensor]:
        """(keys, values) of every entry, read on its ps."""
        with tf.compat.v1.colocate_with(self.resource_handle):
            keys, values = (tf.reshape(exported, [-1]) for exported in self.export())
            used = tf.reshape(tf.where(tf.logical_and(tf.not_equal(keys, self._empty_key),
                                                      tf.not_equal(keys, self._deleted_key))), [-1])
            return tf.gather(keys, used), tf.gather(values, used)


class MapPairs(saveable_object.SaveableObject):
    """A Map's checkpoint: its pairs, as "<name>-keys" and "<name>-values". A restore removes what the
    map holds, then inserts the pairs."""

    def __init__(self, table: Map, name: str):
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
