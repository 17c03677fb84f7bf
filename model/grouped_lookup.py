"""One gather per ps for the tables of every column together, in place of a gather per table piece.

tf.nn.embedding_lookup on a table cut into pieces over the ps tasks sends each piece its own ids and
gets its own rows back, and the gradient comes back piece by piece: a model with 26 categorical
columns, each with an embedding and a wide table, made 485 calls between a worker and 2 ps per step
(launch/measure.round_trips), each a fixed cost (docs/speed.md). Here each device that holds pieces
receives one tensor of (piece, row) pairs for all the tables at once, gathers from its pieces there,
and returns one tensor of rows per family of tables cut alike (wide_deep's embeddings and wide
weights: one tensor of pairs for both where they sit on the same ps); the gradient takes the same way
back, one tensor per device, and is split into each piece's sparse gradient on the device
(gradients are colocated with their ops). The variables, their pieces and their rows are the same
as embedding_lookup's ("div": a piece holds a range of rows), so checkpoints, the evaluator and the
export do not change.

Each (table, row) a batch names crosses once: click-log IDs repeat (Zipf's law; on zipf_clicks a batch
of 256 names about 37% distinct rows), so the worker sends each ps the distinct rows only and repeats
them itself, and their gradients are summed on the worker before they cross back. A piece's gradient
then arrives with distinct rows, and the optimizer applies it as it comes (rows_are_distinct), without
the unique and segment sum it would run per piece.
"""

import numpy as np
import tensorflow as tf

v1 = tf.compat.v1

DISTINCT_ROWS = "ps_trainer_distinct_rows"  # the row tensors of lookup()'s gathers: no row twice
ROW_BITS = 40  # a (slot, row) pair as one int64: slot << ROW_BITS | row (a piece holds under 2^40 rows)


def pieces(table) -> list:
    """A table's pieces in row order: a PartitionedVariable's, or the variable alone."""
    return [table] if isinstance(table, tf.Variable) else list(table)


def lookup(families, ids) -> list:
    """For each family of tables, the rows of ids[:, c] in its table of column c: [batch, columns, width].

    families: lists of tables, a table per column, each list of one width: variables or
    PartitionedVariables (cut into row ranges), every family cut into the same row ranges (wide_deep's
    embedding and wide weight tables), so that one unique finds the distinct rows of all of them;
    families whose pieces also sit on the same ps tasks send each of them one tensor of pairs. ids:
    int64 [batch, columns], each a row of its column's tables.
    """
    family_pieces = [[pieces(table) for table in tables] for tables in families]
    table_pieces = family_pieces[0]
    cuts = [[p.shape[0] for p in column] for column in table_pieces]
    if any([[p.shape[0] for p in column] for column in other] != cuts for other in family_pieces[1:]):
        raise ValueError("grouped_lookup.lookup: the families' tables are not cut alike")
    columns, most = len(table_pieces), max(len(column) for column in table_pieces)
    # starts[c, p]: the first row of column c's piece p (past the last piece: never reached).
    starts = np.full([columns, most], np.iinfo(np.int64).max, np.int64)
    slot_base, num_slots = np.zeros([columns], np.int64), 0  # a slot is one piece of one column's table
    for column, column_pieces in enumerate(table_pieces):
        slot_base[column] = num_slots
        starts[column, :len(column_pieces)] = np.cumsum([0] + [p.shape[0] for p in column_pieces[:-1]])
        num_slots += len(column_pieces)

    flat = tf.reshape(tf.cast(ids, tf.int64), [-1])
    column = tf.tile(tf.range(columns, dtype=tf.int64), tf.shape(ids, out_type=tf.int64)[:1])
    column_starts = tf.gather(tf.constant(starts), column)
    piece = tf.reduce_sum(tf.cast(flat[:, None] >= column_starts, tf.int64), axis=1) - 1
    local = flat - tf.gather(tf.reshape(column_starts, [-1]), tf.range(tf.size(flat, tf.int64)) * most + piece)
    slot = tf.gather(tf.constant(slot_base), column) + piece
    # Each (slot, row) once: the distinct pairs cross, and `repeat` spreads their rows back over the batch.
    distinct, repeat = tf.unique(tf.bitwise.bitwise_or(tf.bitwise.left_shift(slot, ROW_BITS), local))
    slot = tf.bitwise.right_shift(distinct, ROW_BITS)
    local = tf.bitwise.bitwise_and(distinct, (1 << ROW_BITS) - 1)

    # Families whose pieces sit on the same ps tasks share one tensor of pairs to each of them; whole
    # tables spread over the ps by size may put a column's embedding and its weights apart.
    family_slots = [sum(family, []) for family in family_pieces]  # each family's pieces in slot order
    placements = {}
    for f, placed in enumerate(family_slots):
        placements.setdefault(tuple(piece.device for piece in placed), []).append(f)
    found = [None] * len(families)
    for placement, placed_families in placements.items():
        devices = list(dict.fromkeys(placement))
        group = tf.gather(tf.constant([devices.index(device) for device in placement], tf.int32), slot)
        packed = tf.dynamic_partition(tf.stack([slot, local], axis=1), group, len(devices))
        positions = tf.dynamic_partition(tf.range(tf.size(distinct)), group, len(devices))
        rows = []  # [device][family]
        for index, device in enumerate(devices):
            here = [s for s, placed_on in enumerate(placement) if placed_on == device]
            with v1.colocate_with(family_slots[placed_families[0]][here[0]]):
                rows.append(_gather_here([[family_slots[f][s] for s in here] for f in placed_families], here,
                                         num_slots, packed[index]))
        for i, f in enumerate(placed_families):
            # The gradient of this gather sums each distinct row's share on the worker (an unsorted segment sum).
            found[f] = tf.reshape(tf.gather(tf.dynamic_stitch(positions, [device_rows[i] for device_rows in rows]),
                                            repeat), [-1, columns, family_pieces[f][0][0].shape[1]])
    return found


def rows_are_distinct(indices) -> bool:
    """Whether these row indices of a sparse gradient are the rows one of lookup()'s gathers read,
    which name no row twice: the gradient's own Reshape of them, or they themselves."""
    distinct = {tensor.name for tensor in indices.graph.get_collection(DISTINCT_ROWS)}
    while indices.name not in distinct and indices.op.type in ("Reshape", "Identity"):
        indices = indices.op.inputs[0]
    return indices.name in distinct


def _gather_here(family_pieces, slots, num_slots, packed) -> list:
    """On one device: for each family, the rows of its pieces there that `packed` (slot, row) pairs
    name, in their order."""
    rank = np.zeros([num_slots], np.int32)
    rank[slots] = np.arange(len(slots), dtype=np.int32)
    slot, row = tf.unstack(packed, axis=1)
    which = tf.gather(tf.constant(rank), slot)
    rows = tf.dynamic_partition(row, which, len(slots))
    where = tf.dynamic_partition(tf.range(tf.size(which)), which, len(slots))
    for piece_rows in rows:
        v1.add_to_collection(DISTINCT_ROWS, piece_rows)
    return [tf.dynamic_stitch(where, [tf.gather(piece, piece_rows) for piece, piece_rows in zip(pieces, rows)])
            for pieces in family_pieces]
