"""The upkeep of a dynamic table's shards: growth, eviction, and the reconciliation after a restore.

Growth (--embedding_growth): every few training runs a worker reads whether each shard needs room (Upkeep:
two counters on each ps); once fewer than half a growth step of rows are left past what the last admission
wanted, it grows every row variable of the shard by max(GROWTH_ROWS, 1/8 of its rows), up to
--embedding_capacity, the limit past which a table stops training with a message naming it. A growth copies
each variable into a longer one, one at a time (the extra memory is one variable's copy), inside the
shard's lock; the optimizers update a growing table's rows inside that lock too (model/tables.RowUpdate),
so that no update meets a row variable and a slot of different lengths, and none is lost to a copy.

Eviction (--embedding_steps_to_live=S): the chief, before each checkpoint, evicts the IDs whose rows no step
read in the last S global steps: their rows (and optimizer slots) go back to fresh values and are handed
out again before new ones.

rows_held is not checkpointed: after every restore, the reconciliation sets it from the restored variables
(and grows any that a save caught mid-growth, so that every row variable of a shard holds the same rows,
and every row the map names).
"""

from typing import NamedTuple

import tensorflow as tf

from ps_trainer.model import layers
from ps_trainer.model.dynamic import storage
from ps_trainer.model.dynamic.storage import Shard

v1 = tf.compat.v1

# Training runs between two reads of whether a shard needs room (Upkeep): half a growth step of room,
# 4,096 rows a shard at least, covers a few runs of new IDs from every worker.
UPKEEP_EVERY_N_RUNS = 4


def _grow_to(shard: Shard, target, variables) -> tf.Operation:
    """Every variable of `variables` holding `target` rows (or more), one copy at a time; then
    rows_held. Inside the lock."""
    previous = []
    for variable, fresh in variables:
        with tf.control_dependencies(previous):
            value = variable.read_value()
            more = tf.maximum(target - tf.shape(value, out_type=tf.int64)[0], 0)
            previous = [variable.assign(tf.concat([value, fresh(more)], 0), read_value=False)]
    with tf.control_dependencies(previous):
        return shard.held.assign(target, read_value=False)

def _step_and_need(shard: Shard):
    """(rows held, rows wanted, growth step, whether to grow): fewer than half a growth step of rows
    left past those the last admission wanted (all of its IDs, those it could not admit included)."""
    held, wanted = shard.held.read_value(), shard.wanted.read_value()
    step = tf.maximum(tf.constant(storage.GROWTH_ROWS, tf.int64), held // 8)
    return held, wanted, step, tf.logical_and(wanted + step // 2 > held, held < shard.capacity)

def need(shard: Shard) -> tf.Tensor:
    """Whether the shard's storage should grow: two counters read on its ps."""
    return _step_and_need(shard)[-1]

def grow(shard: Shard, slots_of) -> tf.Operation:
    """Grows every row variable of the shard by a growth step, if it still needs it once in the lock
    (another worker may have grown it)."""
    variables = shard.row_variables(slots_of)

    def grown_if_needed():
        held, wanted, step, need = _step_and_need(shard)
        grown = tf.minimum(tf.constant(shard.capacity, tf.int64), tf.maximum(held, wanted) + step)
        return _done(_grow_to(shard, tf.where(need, grown, held), variables))

    return shard.locked(grown_if_needed).op

def reconcile(shard: Shard, slots_of) -> tf.Operation:
    """After a restore: every row variable holding as many rows as the largest of them and as the map
    names, next_row past every row the map names, rows_held set. A save is not atomic: one that
    caught a growth or an admission between its reads restores variables of different lengths, or a
    map naming rows past next_row (which would be handed out twice)."""
    variables = shard.row_variables(slots_of)

    def reconciled():
        named = tf.reduce_max(tf.concat([shard.map.pairs()[1], tf.zeros([1], tf.int64)], 0)) + 1
        next_row = tf.maximum(shard.next_row.read_value(), named)
        target = tf.reduce_max(tf.stack([next_row] + [tf.shape(v, out_type=tf.int64)[0] for v, _ in variables]))
        with tf.control_dependencies([shard.next_row.assign(next_row), shard.wanted.assign(next_row)]):
            return _done(_grow_to(shard, target, variables))

    return shard.locked(reconciled).op

def holding(shard: Shard, rows, slots_of, then) -> tf.Operation:
    """then() inside the shard's lock, once every row variable of a growing shard holds `rows` rows (or
    more): a load of rows past those a fresh shard holds (training/warm_start.py)."""
    variables = shard.row_variables(slots_of)

    def grown_then():
        if shard.options.grow:
            target = tf.maximum(tf.cast(rows, tf.int64), shard.held.read_value())
            with tf.control_dependencies([_grow_to(shard, target, variables)]):
                return _done(then())
        return _done(then())

    return shard.locked(grown_then).op


def evict(shard: Shard, slots_of) -> tf.Tensor:
    """Removes the IDs whose rows no training step read for steps_to_live global steps, resets
    those rows (and their optimizer slots) to fresh values and frees them; inside the lock.
    Returns how many were evicted."""
    variables = shard.row_variables(slots_of)
    oldest = v1.train.get_global_step().read_value() - shard.options.steps_to_live  # read outside the lock

    def evict_stale():
        keys, rows = shard.map.pairs()
        stale = tf.gather(shard.last_seen, rows) < oldest
        stale_keys, stale_rows = layers.masked(keys, stale), layers.masked(rows, stale)
        count = tf.size(stale_rows, out_type=tf.int64)
        free = tf.concat([shard.free_rows[:shard.free_count.read_value()], stale_rows], 0)
        changes = [shard.map.remove(stale_keys), shard.free_rows.assign(free, read_value=False)]
        with tf.control_dependencies(changes[-1:]):
            changes.append(shard.free_count.assign(tf.size(free, out_type=tf.int64)))
        for variable, fresh in variables:
            if variable is not shard.last_seen:
                changes.append(v1.scatter_update(variable, stale_rows, fresh(count)))
        with tf.control_dependencies(changes):
            return tf.identity(count)

    return shard.locked(evict_stale)


def trained_shards(graph_tables, graph=None, evicting=False):
    """(table, shard) of the tables of `graph_tables` trained in the graph that grow (or, `evicting`, that
    evict), each shard once (a table built twice shares them)."""
    unique = {}
    for table, shard in graph_tables.of(graph).trained_shards:
        if shard.options.steps_to_live if evicting else shard.options.grow:
            unique.setdefault(shard.scope, (table, shard))
    return list(unique.values())


class Upkeep(NamedTuple):
    """The upkeep of the default graph's trained tables: `needs`, one bool vector per ps, whether each of
    its shards' storage should grow (two counters read per shard, stacked there so that a read of them
    is one tensor per ps); `grows`, each shard's growth, in the order of the needs' elements;
    `reconciles`, what runs after a restore (reconcile). Training reads the needs every few runs
    and grows the shards that need it."""
    needs: tuple = ()
    grows: tuple = ()
    reconciles: tuple = ()

    def grow_as_needed(self, session, needs) -> None:
        """Grows the shards whose `needs` (as read) say so."""
        grows = [growth for growth, needed in zip(self.grows, (flag for vector in needs for flag in vector)) if needed]
        if grows:
            session.run(grows)

    def after_restore(self, session) -> None:
        if self.reconciles:
            session.run(list(self.reconciles))


def upkeep(graph_tables, slots_of, restores: bool = True) -> Upkeep:
    """The Upkeep of the trained tables of `graph_tables` in the default graph. `slots_of(variable)`: the
    optimizer's (slot, start value) pairs, whose rows grow with the variable's. restores=False (a graph that
    never restores a checkpoint: a non-chief worker's) builds no reconciliation: a third of a dynamic model's
    graph."""
    by_device = {}
    for _, shard in trained_shards(graph_tables):
        by_device.setdefault(shard.map.resource_handle.device, []).append(shard)
    needs, grows, reconciles = [], [], []
    for device, shards in by_device.items():
        with v1.device(device):
            needs.append(tf.stack([need(shard) for shard in shards]))
            for shard in shards:
                grows.append(grow(shard, slots_of))
                if restores:
                    reconciles.append(reconcile(shard, slots_of))
    return Upkeep(tuple(needs), tuple(grows), tuple(reconciles))


def eviction(graph_tables, slots_of) -> dict[str, tf.Tensor] | None:
    """{table: rows evicted} ops of the tables of `graph_tables` in the default graph with steps_to_live, each
    shard in its lock; `slots_of(variable)`: the optimizer's (slot, start value) pairs to reset with a row. None
    if no table evicts."""
    evictable = trained_shards(graph_tables, evicting=True)
    if not evictable:
        return None
    counts = {}
    for table, shard in evictable:
        with v1.device(shard.map.resource_handle.device):
            counts.setdefault(table, []).append(evict(shard, slots_of))
    return {table: tf.add_n(shard_counts) for table, shard_counts in counts.items()}


def _done(op) -> tf.Tensor:
    with tf.control_dependencies([op]):
        return tf.constant(True)
