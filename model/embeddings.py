"""Dynamic embedding tables: a row per raw ID, made the first time the ID is admitted, no collisions.

TF 2.21 cannot train the values of a hash table (lookups have no gradient), so a table here is, per
shard: an ID -> row map (MutableHashTable) beside ordinary trainable row variables, and a counter of
rows handed out. The model gathers rows by index, so the gradient is the usual IndexedSlices and any
optimizer's sparse apply updates just the rows a batch touched, on the ps that holds them. IDs are
spread over the shards by a hash of the ID (one shard per ps in a cluster, each pinned to its ps);
a lookup, its gradient and its update all run on that shard's ps. The map, the counter and the rows
are saved by the ps that holds them with every checkpoint, and a ps restarted alone gets them back
with the rest of the variables.

Row 0 of each shard is the default row: the ID "" (an empty field), an ID not yet admitted
(--embedding_min_count) and, when serving, an ID never seen in training read it, and train it.

Rows are allocated from a fixed block per shard (--embedding_capacity rows per table, over its
shards) so that optimizer slots can be ordinary variables: a table past its capacity stops training
with a message naming it, rather than sharing rows. Rows are handed out under a lock per shard (a
CriticalSection on its ps): workers meeting one new ID at once give it one row. With
--embedding_steps_to_live=S the chief, before each checkpoint, evicts the IDs whose rows no step
read in the last S global steps: their rows (and optimizer slots) go back to their initial values
and are handed out again before new ones.
"""

import dataclasses
import re
import weakref

import tensorflow as tf

v1 = tf.compat.v1

DEFAULT_ROW = 0
# Each shard's live rows (the IDs in its map), named <table>/shard<N>/live_rows: for the log and the
# summaries.
LIVE_ROWS = "ps_trainer_live_rows"
# The shards of each graph's tables that evict, for eviction(): (table name, _Shard).
_EVICTABLE = weakref.WeakKeyDictionary()


@dataclasses.dataclass(frozen=True)
class TableOptions:
    """What is particular to a table: its room, its shards, and its admission rule."""

    capacity: int  # rows over all shards, the default rows included
    shards: int = 1
    # Where each shard lives (the ps tasks, in order); empty: wherever the caller's device scope says.
    devices: tuple[str, ...] = ()
    # An ID gets a row of its own from its min_count-th sighting; until then it reads the default row.
    min_count: int = 1
    # A row no training step read for this many global steps is evicted at the next checkpoint (its
    # ID removed, the row reset and handed out again); 0: never.
    steps_to_live: int = 0

    def shard_capacity(self) -> int:
        return -(-self.capacity // self.shards)


class DynamicTable:
    """The rows of a batch of raw IDs: `DynamicTable(name, ids, options, training).rows(...)`.

    Built once per batch of IDs; each rows() call is one more trained value per ID (an embedding, a
    wide weight) sharing the same ID -> row map. With `training`, an ID not in the map is admitted
    (given the next free row of its shard); without, it reads the default row and nothing is stored.

    Each shard does all of its work on its own device: it reads the whole batch of IDs, keeps those a
    hash gives it, and returns a [batch, width] part holding their rows (zeros for the others'), so a
    shard's ps is sent the IDs once and sends one tensor back. Given the IDs of several columns
    ([batch, columns]) and a `column`, the table reads its column there: rows_of_columns then stacks
    every column's part on the ps before it crosses, one tensor per ps for all the tables.
    """

    def __init__(self, name: str, ids: tf.Tensor, options: TableOptions, training: bool, column: int | None = None):
        self.name, self.options = name, options
        self._scope = v1.get_variable_scope()
        self._shards, self._found_rows, self._devices, self._spread, live_rows = [], [], [], [], []
        for shard in range(options.shards):
            device = options.devices[shard % len(options.devices)] if options.devices else None
            self._devices.append(device)
            with v1.device(device), v1.variable_scope(f"shard{shard}"):
                column_ids = tf.reshape(ids if column is None else ids[:, column], [-1])
                unique, index, counts = tf.unique_with_counts(column_ids, out_idx=tf.int64)
                if options.shards == 1:
                    keys, mine = unique, None
                else:  # this shard's IDs, and where they sit among the batch's unique IDs
                    held = tf.equal(_shard_of(unique, options.shards), shard)
                    keys, mine = tf.boolean_mask(unique, held), tf.where(held)
                    counts = tf.boolean_mask(counts, held)
                self._spread.append((mine, tf.size(unique, out_type=tf.int64), index))
                # Each ID's occurrences in the batch, for admission (only counted with min_count > 1).
                rows = _Shard(ids.dtype, options, shard)
                self._shards.append(rows)
                self._found_rows.append(rows.rows_of(keys, counts if options.min_count > 1 else None, training, name))
                live_rows.append(tf.identity(rows.map.size(), name="live_rows"))
                v1.add_to_collection(LIVE_ROWS, live_rows[-1])
        if training:
            v1.summary.scalar("live_rows", tf.add_n(live_rows))
            if options.steps_to_live:
                _EVICTABLE.setdefault(v1.get_default_graph(), []).extend((name, s) for s in self._shards)

    def contents(self) -> list[tuple[tf.Tensor, tf.Tensor]]:
        """(IDs, their rows) of each shard, read from its map on its ps."""
        contents = []
        for shard, device in zip(self._shards, self._devices):
            with v1.device(device):
                contents.append(tuple(tf.reshape(exported, [-1]) for exported in shard.map.export()))
        return contents

    def rows(self, storage: str, width: int, initializer) -> tf.Tensor:
        """[batch, width]: each ID's row of the trained variable `storage` (one per shard)."""
        return tf.add_n(self.shard_parts(storage, width, initializer))

    def shard_parts(self, storage: str, width: int, initializer) -> list[tf.Tensor]:
        """Each shard's [batch, width] part of rows(), made on its device: the rows of the IDs it holds,
        zeros for the others'."""
        parts = []
        with v1.variable_scope(self._scope, auxiliary_name_scope=False):
            for shard, device in enumerate(self._devices):
                with v1.device(device), v1.variable_scope(f"shard{shard}"):
                    values = v1.get_variable(storage, [self.options.shard_capacity(), width], initializer=initializer)
                    self._shards[shard].storages.append(values)
                    gathered = tf.gather(values, self._found_rows[shard])
                    mine, unique, index = self._spread[shard]
                    if mine is not None:
                        gathered = tf.scatter_nd(mine, gathered, tf.stack([unique, width]))
                    parts.append(tf.gather(gathered, index))
        return parts


def rows_of_columns(tables: list[DynamicTable], storage: str, width: int, initializer) -> tf.Tensor:
    """[batch, len(tables), width]: each table's rows() of `storage`, stacked on each shard's device
    before they cross: one tensor per ps for all the tables (each table built with `column`)."""
    parts = [table.shard_parts(storage, width, initializer) for table in tables]
    stacked = []
    for shard, device in enumerate(tables[0]._devices):  # pylint: disable=protected-access
        with v1.device(device):
            stacked.append(tf.stack([table_parts[shard] for table_parts in parts], axis=1))
    return tf.add_n(stacked)


class _Shard:
    """One shard's map (ID -> row), its row counter, its free rows, and its admission counts.

    Rows are handed out and taken back inside one CriticalSection per shard (a lock on its ps), so
    that workers admitting IDs at once, and the chief evicting, never hand one row to two IDs and
    never lose one."""

    def __init__(self, key_dtype, options: TableOptions, shard: int):
        self.options, self.shard = options, shard
        self.capacity = options.shard_capacity()
        self.storages = []  # the trained variables whose rows this shard hands out (DynamicTable.rows)
        self.map = _checkpointed_map(key_dtype, -1, "rows_of_ids")
        # The next row never handed out; row 0 is the default row.
        self.next_row = _counter("next_row", DEFAULT_ROW + 1)
        self.sightings = _checkpointed_map(key_dtype, 0, "sightings") if options.min_count > 1 else None
        self.lock = tf.CriticalSection(shared_name=f"{v1.get_variable_scope().name}/rows_lock")
        if options.steps_to_live:
            # Rows evicted, to hand out again before new ones: free_rows[:free_count].
            self.free_rows = v1.get_variable("free_rows", [self.capacity], tf.int64, trainable=False,
                                             initializer=v1.zeros_initializer())
            self.free_count = _counter("free_count", 0)
            # The global step at which each row was last read in training.
            self.last_seen = v1.get_variable("last_seen", [self.capacity], tf.int64, trainable=False,
                                             initializer=v1.zeros_initializer())

    def rows_of(self, keys, sightings, training: bool, table: str) -> tf.Tensor:
        if not training:
            return self._found(keys)
        found = self.map.lookup(keys)
        missing = tf.logical_and(found < 0, tf.not_equal(keys, "") if keys.dtype == tf.string else True)
        new_keys = tf.boolean_mask(keys, missing)
        if self.sightings is not None:
            seen = self.sightings.lookup(new_keys) + tf.boolean_mask(sightings, missing)
            count = self.sightings.insert(new_keys, seen)
            with tf.control_dependencies([count]):
                new_keys = tf.boolean_mask(new_keys, seen >= self.options.min_count)
        # The lock only when there is something to admit: most steps of a warm table meet no new ID.
        admitted = tf.cond(tf.size(new_keys) > 0, lambda: self.lock.execute(lambda: self._admit(new_keys, table)),
                           lambda: tf.constant(0, tf.int64))
        with tf.control_dependencies([admitted]):
            rows = self._found(keys)
        if not self.options.steps_to_live:
            return rows
        touched = v1.scatter_update(self.last_seen, rows, tf.fill(tf.shape(rows), v1.train.get_global_step()))
        with tf.control_dependencies([touched]):
            return tf.identity(rows)

    def _admit(self, new_keys, table: str) -> tf.Tensor:
        """Rows for the IDs of new_keys still without one (another worker may have admitted some since);
        inside the lock. Returns how many were admitted, once every change is made."""
        fresh = tf.boolean_mask(new_keys, self.map.lookup(new_keys) < 0)
        count = tf.size(fresh, out_type=tf.int64)
        changes = []
        reused = tf.zeros([0], tf.int64)
        if self.options.steps_to_live:
            free = self.free_count.read_value()
            taken = tf.minimum(count, free)
            reused = tf.gather(self.free_rows, tf.range(free - taken, free))
            changes.append(self.free_count.assign_sub(taken))
        more = count - tf.size(reused, out_type=tf.int64)
        end = self.next_row.assign_add(more).read_value()
        full = tf.debugging.assert_less_equal(
            end, tf.constant(self.capacity, tf.int64),
            message=f"embedding table {table} is full: shard {self.shard} holds {self.capacity} rows "
                    f"(--embedding_capacity={self.options.capacity} over {self.options.shards} shards); "
                    f"raise --embedding_capacity, in a new --model_dir (a run keeps its capacity)")
        with tf.control_dependencies([full]):
            rows = tf.concat([reused, end - more + tf.range(more, dtype=tf.int64)], axis=0)
        changes.append(self.map.insert(fresh, rows))
        if self.sightings is not None:  # counted until admitted, no longer
            changes.append(self.sightings.remove(fresh))
        with tf.control_dependencies(changes):
            return tf.identity(count)

    def evict(self, slots_of) -> tf.Tensor:
        """Removes the IDs whose rows no training step read for steps_to_live global steps, resets
        those rows (and their optimizer slots, `slots_of(variable)`) to their initial values and frees
        them; inside the lock. Returns how many were evicted."""
        oldest = v1.train.get_global_step().read_value() - self.options.steps_to_live  # read outside the lock

        def evict_stale():
            keys, rows = (tf.reshape(exported, [-1]) for exported in self.map.export())
            stale = tf.gather(self.last_seen, rows) < oldest
            stale_keys, stale_rows = tf.boolean_mask(keys, stale), tf.boolean_mask(rows, stale)
            count = tf.size(stale_rows, out_type=tf.int64)
            free = self.free_count.read_value()
            changes = [self.map.remove(stale_keys),
                       v1.scatter_update(self.free_rows, free + tf.range(count, dtype=tf.int64), stale_rows)]
            with tf.control_dependencies(changes[-1:]):
                changes.append(self.free_count.assign_add(count))
            for variable in [*self.storages, *(slot for storage in self.storages for slot in slots_of(storage))]:
                changes.append(v1.scatter_update(variable, stale_rows, tf.gather(variable.initial_value, stale_rows)))
            with tf.control_dependencies(changes):
                return tf.identity(count)

        return self.lock.execute(evict_stale)

    def _found(self, keys):
        found = self.map.lookup(keys)
        return tf.where(found < 0, tf.constant(DEFAULT_ROW, tf.int64), found)


def eviction(slots_of) -> dict[str, tf.Tensor] | None:
    """{table: rows evicted} ops of the default graph's tables with steps_to_live, each shard in its lock;
    `slots_of(variable)`: the optimizer slots to reset with a row. None if no table evicts."""
    evictable = _EVICTABLE.get(v1.get_default_graph())
    if not evictable:
        return None
    counts = {}
    for table, shard in evictable:
        with v1.device(shard.map.resource_handle.device):
            counts.setdefault(table, []).append(shard.evict(slots_of))
    return {table: tf.add_n(shard_counts) for table, shard_counts in counts.items()}


def _counter(name: str, start: int):
    return v1.get_variable(name, [], tf.int64, initializer=v1.constant_initializer(start), trainable=False)


def full_table_message(error_message: str) -> str | None:
    """The one line a full table's failed assertion carries, else None."""
    found = re.search(r"embedding table \S+ is full: [^\]]*", error_message)
    return found.group(0) if found else None


def _checkpointed_map(key_dtype, default_value: int, name: str):
    """A MutableHashTable named by its variable scope: its checkpoint keys are its name plus "-keys" and
    "-values", and the workers share it on its ps by that name."""
    full_name = f"{v1.get_variable_scope().name}/{name}"
    with v1.name_scope(None):
        return tf.lookup.experimental.MutableHashTable(key_dtype, tf.int64, default_value, name=full_name)


def _shard_of(ids, shards: int) -> tf.Tensor:
    if shards == 1:
        return tf.zeros(tf.shape(ids), tf.int32)
    if ids.dtype == tf.string:
        return tf.cast(tf.strings.to_hash_bucket_fast(ids, shards), tf.int32)
    return tf.cast(tf.math.floormod(ids, shards), tf.int32)
