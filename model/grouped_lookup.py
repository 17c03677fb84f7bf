"""One gather per ps for the tables of every column together, in place of a gather per table piece.

tf.nn.embedding_lookup on a table cut into pieces over the ps tasks sends each piece its own ids and
gets its own rows back, and the gradient comes back piece by piece: a model with 26 categorical
columns, each with an embedding and a wide table, made 485 calls between a worker and 2 ps per step
(launch/measure.round_trips), each a fixed cost (docs/speed.md). Here each device that holds pieces
receives one tensor of (piece, row) pairs for all the tables at once, gathers from its pieces there,
and returns one tensor of rows; the gradient takes the same way back, one tensor per device, and is
split into each piece's sparse gradient on the device (gradients are colocated with their ops). The
variables, their pieces and their rows are the same as embedding_lookup's ("div": a piece holds a
range of rows), so checkpoints, the evaluator and the export do not change.
"""

import numpy as np
import tensorflow as tf

v1 = tf.compat.v1


def pieces(table) -> list:
    """A table's pieces in row order: a PartitionedVariable's, or the variable alone."""
    return [table] if isinstance(table, tf.Variable) else list(table)


def lookup(tables, ids):
    """The rows of ids[:, c] in tables[c] for every column c: [batch, len(tables), width].

    tables: variables or PartitionedVariables (cut into row ranges) of one width; ids: int64 [batch,
    len(tables)], each a row of its column's table.
    """
    table_pieces = [pieces(table) for table in tables]
    width = table_pieces[0][0].shape[1]
    most = max(len(column) for column in table_pieces)
    # starts[c, p]: the first row of column c's piece p (past the last piece: never reached).
    starts = np.full([len(tables), most], np.iinfo(np.int64).max, np.int64)
    slot_base, slots = np.zeros([len(tables)], np.int64), []  # a slot is one piece of one table
    for column, column_pieces in enumerate(table_pieces):
        slot_base[column] = len(slots)
        starts[column, :len(column_pieces)] = np.cumsum([0] + [p.shape[0] for p in column_pieces[:-1]])
        slots += column_pieces
    devices = list(dict.fromkeys(piece.device for piece in slots))
    group_of_slot = np.array([devices.index(piece.device) for piece in slots], np.int32)

    flat = tf.reshape(tf.cast(ids, tf.int64), [-1])
    column = tf.tile(tf.range(len(tables), dtype=tf.int64), tf.shape(ids, out_type=tf.int64)[:1])
    column_starts = tf.gather(tf.constant(starts), column)
    piece = tf.reduce_sum(tf.cast(flat[:, None] >= column_starts, tf.int64), axis=1) - 1
    local = flat - tf.gather(tf.reshape(column_starts, [-1]), tf.range(tf.size(flat, tf.int64)) * most + piece)
    slot = tf.gather(tf.constant(slot_base), column) + piece
    group = tf.gather(tf.constant(group_of_slot), slot)
    packed = tf.dynamic_partition(tf.stack([slot, local], axis=1), group, len(devices))
    positions = tf.dynamic_partition(tf.range(tf.size(flat)), group, len(devices))

    rows = []
    for index, device in enumerate(devices):
        here = [s for s, piece in enumerate(slots) if piece.device == device]
        with v1.colocate_with(slots[here[0]]):
            rows.append(_gather_here([slots[s] for s in here], here, len(slots), packed[index]))
    return tf.reshape(tf.dynamic_stitch(positions, rows), [-1, len(tables), width])


def _gather_here(pieces, slots, num_slots, packed):
    """On one device: the rows of its pieces that `packed` (slot, row) pairs name, in their order."""
    rank = np.zeros([num_slots], np.int32)
    rank[slots] = np.arange(len(slots), dtype=np.int32)
    slot, row = tf.unstack(packed, axis=1)
    which = tf.gather(tf.constant(rank), slot)
    rows = tf.dynamic_partition(row, which, len(pieces))
    where = tf.dynamic_partition(tf.range(tf.size(which)), which, len(pieces))
    return tf.dynamic_stitch(where, [tf.gather(piece, piece_rows) for piece, piece_rows in zip(pieces, rows)])
