"""One gather per ps for the tables of every column together, in place of a gather per table shard.

tf.nn.embedding_lookup on a table cut into shards over the ps tasks sends each shard its own ids and
gets its own rows back, and the gradient comes back shard by shard: a model with 26 categorical
columns, each with an embedding and a wide table, made 485 calls between a worker and 2 ps per step
(launch/measure.round_trips), each a fixed cost (docs/speed.md). Here each device that holds shards
receives one tensor of (shard, row) pairs for all the tables at once, gathers from its shards there,
and returns one tensor of rows per family of tables cut alike (wide_deep's embeddings and wide
weights: one tensor of pairs for both where they sit on the same ps); the gradient takes the same way
back, one tensor per device, and is split into each shard's sparse gradient on the device
(gradients are colocated with their ops). The variables, their shards and their rows are the same
as embedding_lookup's ("div": a shard holds a range of rows), so checkpoints, the evaluator and the
export do not change.

Each (table, row) a batch names crosses once: click-log IDs repeat (Zipf's law; on zipf_clicks a batch
of 256 names about 37% distinct rows), so the worker sends each ps the distinct rows only and repeats
them itself, and their gradients are summed on the worker before they cross back. A shard's gradient
then arrives with distinct rows, and the optimizer applies it as it comes (rows_are_distinct), without
the unique and segment sum it would run per shard.
"""

import contextlib
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from ps_trainer.model import multi_valued
from ps_trainer.model.graph_tables import GraphTables

v1 = tf.compat.v1

DISTINCT_ROWS = "ps_trainer_distinct_rows"  # the row tensors of lookup()'s gathers: no row twice
ROW_BITS = 40  # a (cell, row) pair as one int64: cell << ROW_BITS | row (a shard holds under 2^40 rows)


def shards(table) -> list:
    """A table's shards in row order: a PartitionedVariable's, or the variable alone."""
    return [table] if isinstance(table, tf.Variable) else list(table)


class Resolved(NamedTuple):
    """IDs whose (cell, row) pairs (pairs()' form) the ps tasks found: a dynamic table's, admitted
    (model/dynamic/table.pairs_of_columns). `pairs`: one per ID, in the order of `ids`, the IDs
    ([batch, columns] or ColumnIds). Looked up only inside rows_from()."""
    pairs: tf.Tensor
    ids: object


def lookup(families, ids, graph_tables: GraphTables | None = None) -> list:
    """For each family of tables, the rows of ids[:, c] in its table of column c: [batch, columns, width].

    families: lists of tables, a table per column, each list of one width: variables or
    PartitionedVariables (cut into row ranges), every family cut into the same row ranges (wide_deep's
    embedding and wide weight tables), so that one unique finds the distinct rows of all of them;
    families whose shards also sit on the same ps tasks send each of them one tensor of pairs. ids:
    int64 [batch, columns], each a row of its column's tables; or model/multi_valued.ColumnIds of such rows,
    whose rows come back [ids, width], in its flat() order.

    Inside rows_from(graph_tables, source), the source answers instead (training/step/row_copies.py: a round's
    rows held on the worker), for Resolved IDs too.
    """
    source = current_source(graph_tables) if graph_tables is not None else None
    if source is not None:
        return source.lookup(families, ids)
    family_shards, num_cells = cut_alike(families)
    distinct, repeat = tf.unique(pairs(family_shards, ids))
    found = [None] * len(families)
    for placed in gather(family_shards, num_cells, distinct):
        for i, f in enumerate(placed.families):
            # The gradient of this gather sums each distinct row's share on the worker (an unsorted segment sum).
            found[f] = shaped(tf.gather(tf.dynamic_stitch(placed.positions, [rows[i] for rows in placed.rows]),
                                        repeat), ids, len(family_shards[0]))
    return found


def shaped(rows, ids, columns: int) -> tf.Tensor:
    """rows [ids, width], a row per ID of `ids` in pairs()' order -> lookup()'s shape of them."""
    if isinstance(ids, multi_valued.ColumnIds):
        return rows
    return tf.reshape(rows, [-1, columns, rows.shape[-1]])


@contextlib.contextmanager
def rows_from(graph_tables: GraphTables, source):
    """Inside, lookup() of the tables of `graph_tables` in the default graph returns source.lookup(families,
    ids)."""
    recorded = graph_tables.of()
    recorded.rows_source = source
    try:
        yield source
    finally:
        recorded.rows_source = None


def current_source(graph_tables: GraphTables):
    """The source of the rows_from() the default graph is in, or in a loop body's graph, the graph it is
    built in; None outside any."""
    graph = v1.get_default_graph()
    while graph is not None and graph_tables.of(graph).rows_source is None:
        graph = getattr(graph, "outer_graph", None)
    return graph_tables.of(graph).rows_source if graph is not None else None


def cut_alike(families) -> tuple[list, int]:
    """(each family's tables as lists of shards, the number of (column, shard) cells), checking that
    the families are cut into the same row ranges."""
    family_shards = [[shards(table) for table in tables] for tables in families]
    cuts = [[p.shape[0] for p in column] for column in family_shards[0]]
    if any([[p.shape[0] for p in column] for column in other] != cuts for other in family_shards[1:]):
        raise ValueError("grouped_lookup.lookup: the families' tables are not cut alike")
    return family_shards, sum(len(column) for column in family_shards[0])


def pairs(family_shards, ids) -> tf.Tensor:
    """Each of ids[:, c] as the (cell, row) pair of the shard of column c's tables that holds it, one
    int64 (cell << ROW_BITS | row), row by row of ids (ColumnIds: in its flat() order)."""
    table_shards = family_shards[0]
    columns, most = len(table_shards), max(len(column) for column in table_shards)
    # starts[c, p]: the first row of column c's shard p (past the last shard: never reached).
    starts = np.full([columns, most], np.iinfo(np.int64).max, np.int64)
    cell_base, num_cells = np.zeros([columns], np.int64), 0  # a cell is one shard of one column's table
    for column, column_shards in enumerate(table_shards):
        cell_base[column] = num_cells
        starts[column, :len(column_shards)] = np.cumsum([0] + [p.shape[0] for p in column_shards[:-1]])
        num_cells += len(column_shards)

    if isinstance(ids, multi_valued.ColumnIds):
        flat, column = ids.flat()
        flat = tf.cast(flat, tf.int64)
    else:
        flat = tf.reshape(tf.cast(ids, tf.int64), [-1])
        column = tf.tile(tf.range(columns, dtype=tf.int64), tf.shape(ids, out_type=tf.int64)[:1])
    column_starts = tf.gather(tf.constant(starts), column)
    shard = tf.reduce_sum(tf.cast(flat[:, None] >= column_starts, tf.int64), axis=1) - 1
    local = flat - tf.gather(tf.reshape(column_starts, [-1]), tf.range(tf.size(flat, tf.int64)) * most + shard)
    cell = tf.gather(tf.constant(cell_base), column) + shard
    return tf.bitwise.bitwise_or(tf.bitwise.left_shift(cell, ROW_BITS), local)


def split_pairs(distinct) -> tuple[tf.Tensor, tf.Tensor]:
    """(cell, row) of pairs()' int64s."""
    return tf.bitwise.right_shift(distinct, ROW_BITS), tf.bitwise.bitwise_and(distinct, (1 << ROW_BITS) - 1)


def placements(family_shards) -> dict:
    """{the device of each cell: the families placed so}: families whose shards sit on the same ps
    tasks share one tensor of pairs to each of them; whole tables spread over the ps by size may put a
    column's embedding and its weights apart."""
    found = {}
    for f, family in enumerate(family_shards):
        found.setdefault(tuple(shard.device for shard in sum(family, [])), []).append(f)
    return found


def gather(family_shards, num_cells, distinct):
    """Gathers the rows that `distinct` pairs name, one tensor of pairs to each ps: yields a Placement for
    each group of families whose shards sit alike."""
    cell, local = split_pairs(distinct)
    family_cells = [sum(family, []) for family in family_shards]  # each family's shards in cell order
    for placement, placed_families in placements(family_shards).items():
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
    cells: list  # [device]: the cells whose shards are there


def rows_are_distinct(indices) -> bool:
    """Whether these row indices of a sparse gradient are the rows one of lookup()'s gathers read,
    which name no row twice: the gradient's own Reshape of them, or they themselves."""
    distinct = {tensor.name for tensor in indices.graph.get_collection(DISTINCT_ROWS)}
    while indices.name not in distinct and indices.op.type in ("Reshape", "Identity"):
        indices = indices.op.inputs[0]
    return indices.name in distinct


def by_shard(cells, num_cells, packed):
    """On one device: which of `cells` each of the `packed` (cell, row) pairs falls in, and the rows
    and positions among the pairs, shard by shard."""
    rank = np.zeros([num_cells], np.int32)
    rank[cells] = np.arange(len(cells), dtype=np.int32)
    cell, row = tf.unstack(packed, axis=1)
    which = tf.gather(tf.constant(rank), cell)
    return (which, tf.dynamic_partition(row, which, len(cells)),
            tf.dynamic_partition(tf.range(tf.size(which)), which, len(cells)))


def _gather_here(family_shards, cells, num_cells, packed) -> list:
    """On one device: for each family, the rows of its shards there that `packed` (cell, row) pairs
    name, in their order."""
    _, rows, where = by_shard(cells, num_cells, packed)
    for shard_rows in rows:
        v1.add_to_collection(DISTINCT_ROWS, shard_rows)
    return [tf.dynamic_stitch(where, [tf.gather(shard, shard_rows) for shard, shard_rows in zip(shards, rows)])
            for shards in family_shards]


def scatter_add_here(family_shards, cells, num_cells, packed, values) -> tuple[list, list]:
    """On one device: adds values[f] (a row per pair of `packed`, in order) to the rows of family f's
    shards there that the pairs name. Returns (each shard's rows, [family][shard] its add)."""
    which, rows, _ = by_shard(cells, num_cells, packed)
    return rows, [[tf.raw_ops.ResourceScatterAdd(resource=shard.handle, indices=shard_rows, updates=part)
                   for shard, shard_rows, part in zip(shards, rows, tf.dynamic_partition(family_values, which,
                                                                                        len(cells)))]
                  for shards, family_values in zip(family_shards, values)]
