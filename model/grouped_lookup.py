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

import contextlib
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from model import registry

v1 = tf.compat.v1

DISTINCT_ROWS = "ps_trainer_distinct_rows"  # the row tensors of lookup()'s gathers: no row twice
ROW_BITS = 40  # a (cell, row) pair as one int64: cell << ROW_BITS | row (a piece holds under 2^40 rows)


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

    Inside rows_from(source), the source answers instead (training/step/row_copies.py: a round's rows
    held on the worker).
    """
    source = _source()
    if source is not None:
        return source.lookup(families, ids)
    family_pieces, num_cells = cut_alike(families)
    distinct, repeat = tf.unique(pairs(family_pieces, ids))
    columns = len(family_pieces[0])
    found = [None] * len(families)
    for placed in gather(family_pieces, num_cells, distinct):
        for i, f in enumerate(placed.families):
            # The gradient of this gather sums each distinct row's share on the worker (an unsorted segment sum).
            found[f] = tf.reshape(tf.gather(tf.dynamic_stitch(placed.positions, [rows[i] for rows in placed.rows]),
                                            repeat), [-1, columns, family_pieces[f][0][0].shape[1]])
    return found


@contextlib.contextmanager
def rows_from(source):
    """Inside, lookup() in the default graph returns source.lookup(families, ids)."""
    registered = registry.of()
    registered.rows_source = source
    try:
        yield source
    finally:
        registered.rows_source = None


def _source():
    """The source of the rows_from() the default graph is in, or in a loop body's graph, the graph it is
    built in; None outside any."""
    graph = v1.get_default_graph()
    while graph is not None and registry.of(graph).rows_source is None:
        graph = getattr(graph, "outer_graph", None)
    return registry.of(graph).rows_source if graph is not None else None


def cut_alike(families) -> tuple[list, int]:
    """(each family's tables as lists of pieces, the number of (column, piece) cells), checking that
    the families are cut into the same row ranges."""
    family_pieces = [[pieces(table) for table in tables] for tables in families]
    cuts = [[p.shape[0] for p in column] for column in family_pieces[0]]
    if any([[p.shape[0] for p in column] for column in other] != cuts for other in family_pieces[1:]):
        raise ValueError("grouped_lookup.lookup: the families' tables are not cut alike")
    return family_pieces, sum(len(column) for column in family_pieces[0])


def pairs(family_pieces, ids) -> tf.Tensor:
    """Each of ids[:, c] as the (cell, row) pair of the piece of column c's tables that holds it, one
    int64 (cell << ROW_BITS | row), row by row of ids."""
    table_pieces = family_pieces[0]
    columns, most = len(table_pieces), max(len(column) for column in table_pieces)
    # starts[c, p]: the first row of column c's piece p (past the last piece: never reached).
    starts = np.full([columns, most], np.iinfo(np.int64).max, np.int64)
    cell_base, num_cells = np.zeros([columns], np.int64), 0  # a cell is one piece of one column's table
    for column, column_pieces in enumerate(table_pieces):
        cell_base[column] = num_cells
        starts[column, :len(column_pieces)] = np.cumsum([0] + [p.shape[0] for p in column_pieces[:-1]])
        num_cells += len(column_pieces)

    flat = tf.reshape(tf.cast(ids, tf.int64), [-1])
    column = tf.tile(tf.range(columns, dtype=tf.int64), tf.shape(ids, out_type=tf.int64)[:1])
    column_starts = tf.gather(tf.constant(starts), column)
    piece = tf.reduce_sum(tf.cast(flat[:, None] >= column_starts, tf.int64), axis=1) - 1
    local = flat - tf.gather(tf.reshape(column_starts, [-1]), tf.range(tf.size(flat, tf.int64)) * most + piece)
    cell = tf.gather(tf.constant(cell_base), column) + piece
    return tf.bitwise.bitwise_or(tf.bitwise.left_shift(cell, ROW_BITS), local)


def split_pairs(distinct) -> tuple[tf.Tensor, tf.Tensor]:
    """(cell, row) of pairs()' int64s."""
    return tf.bitwise.right_shift(distinct, ROW_BITS), tf.bitwise.bitwise_and(distinct, (1 << ROW_BITS) - 1)


def placements(family_pieces) -> dict:
    """{the device of each cell: the families placed so}: families whose pieces sit on the same ps
    tasks share one tensor of pairs to each of them; whole tables spread over the ps by size may put a
    column's embedding and its weights apart."""
    found = {}
    for f, family in enumerate(family_pieces):
        found.setdefault(tuple(piece.device for piece in sum(family, [])), []).append(f)
    return found


def gather(family_pieces, num_cells, distinct):
    """Gathers the rows that `distinct` pairs name, one tensor of pairs to each ps: yields a Placement for
    each group of families whose pieces sit alike."""
    cell, local = split_pairs(distinct)
    family_cells = [sum(family, []) for family in family_pieces]  # each family's pieces in cell order
    for placement, placed_families in placements(family_pieces).items():
        devices = list(dict.fromkeys(placement))
        group = tf.gather(tf.constant([devices.index(device) for device in placement], tf.int32), cell)
        packed = tf.dynamic_partition(tf.stack([cell, local], axis=1), group, len(devices))
        positions = tf.dynamic_partition(tf.range(tf.size(distinct)), group, len(devices))
        rows, cells_here = [], []  # [device][family]; [device]: the cells there
        for index, device in enumerate(devices):
            here = [s for s, placed_on in enumerate(placement) if placed_on == device]
            with v1.colocate_with(family_cells[placed_families[0]][here[0]]):
                rows.append(_gather_here([[family_cells[family][cell] for cell in here] for family in placed_families],
                                         here,
                                         num_cells, packed[index]))
            cells_here.append(here)
        yield Placement(placed_families, packed, positions, rows, cells_here)


class Placement(NamedTuple):
    """What gather() did for the families placed alike, device by device."""
    families: list  # the families' indices
    packed: list  # [device]: its (cell, row) pairs, [n, 2], as it receives them
    positions: list  # [device]: the positions of its pairs among the distinct pairs
    rows: list  # [device][family]: the rows gathered there
    cells: list  # [device]: the cells whose pieces are there


def rows_are_distinct(indices) -> bool:
    """Whether these row indices of a sparse gradient are the rows one of lookup()'s gathers read,
    which name no row twice: the gradient's own Reshape of them, or they themselves."""
    distinct = {tensor.name for tensor in indices.graph.get_collection(DISTINCT_ROWS)}
    while indices.name not in distinct and indices.op.type in ("Reshape", "Identity"):
        indices = indices.op.inputs[0]
    return indices.name in distinct


def _by_piece(cells, num_cells, packed):
    """On one device: which of `cells` each of the `packed` (cell, row) pairs falls in, and the rows
    and positions among the pairs, piece by piece."""
    rank = np.zeros([num_cells], np.int32)
    rank[cells] = np.arange(len(cells), dtype=np.int32)
    cell, row = tf.unstack(packed, axis=1)
    which = tf.gather(tf.constant(rank), cell)
    return (which, tf.dynamic_partition(row, which, len(cells)),
            tf.dynamic_partition(tf.range(tf.size(which)), which, len(cells)))


def _gather_here(family_pieces, cells, num_cells, packed) -> list:
    """On one device: for each family, the rows of its pieces there that `packed` (cell, row) pairs
    name, in their order."""
    _, rows, where = _by_piece(cells, num_cells, packed)
    for piece_rows in rows:
        v1.add_to_collection(DISTINCT_ROWS, piece_rows)
    return [tf.dynamic_stitch(where, [tf.gather(piece, piece_rows) for piece, piece_rows in zip(pieces, rows)])
            for pieces in family_pieces]


def scatter_add_here(family_pieces, cells, num_cells, packed, values) -> tuple[list, list]:
    """On one device: adds values[f] (a row per pair of `packed`, in order) to the rows of family f's
    pieces there that the pairs name. Returns (each piece's rows, [family][piece] its add)."""
    which, rows, _ = _by_piece(cells, num_cells, packed)
    return rows, [[tf.raw_ops.ResourceScatterAdd(resource=piece.handle, indices=piece_rows, updates=part)
                   for piece, piece_rows, part in zip(pieces, rows, tf.dynamic_partition(family_values, which,
                                                                                        len(cells)))]
                  for pieces, family_values in zip(family_pieces, values)]
