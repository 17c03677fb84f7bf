"""A batch's IDs on their way to a dynamic table's shards: which shard holds an ID (a hash of it), where that
shard lives (TableOptions), and the batch's distinct IDs of every column, found once on the worker and cut
into one tensor per ps (DistinctIds), so that a row crosses once, to and from its own ps only, however often
the batch names its ID."""

import dataclasses

import numpy as np
import tensorflow as tf

from ps_trainer.model import multi_valued

v1 = tf.compat.v1

# The keys a shard's map keeps for its empty and removed buckets (model/dynamic/storage.py); IDs equal to them
# count as no ID (unreserved).
EMPTY_KEY = {tf.int64: np.iinfo(np.int64).min, tf.string: "\0ps_trainer:empty"}
DELETED_KEY = {tf.int64: np.iinfo(np.int64).min + 1, tf.string: "\0ps_trainer:deleted"}
# No ID (an empty field): it reads the default row and is never admitted.
NO_ID = {tf.int64: np.iinfo(np.int64).min + 2, tf.string: ""}


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

    def __init__(self, ids, options: TableOptions):
        multi = isinstance(ids, multi_valued.ColumnIds)
        columns = list(ids.values) if multi else [ids[:, c] for c in range(ids.shape[1])]
        found = [tf.unique_with_counts(unreserved(column), out_idx=tf.int64) for column in columns]
        self.columns = len(found)
        parts = options.parts
        sizes = tf.stack([tf.size(f.y, out_type=tf.int64) for f in found])
        self.bounds = bounds = tf.concat([[0], tf.cumsum(sizes)], 0)  # where each column starts, and the end
        # Each ID's place among the distinct IDs of every column, column after column: by column, and as
        # the IDs came ([batch, columns], or ColumnIds' flat() order).
        self.column_positions = [bounds[c] + f.idx for c, f in enumerate(found)]
        self.positions = tf.concat(self.column_positions, 0) if multi else tf.stack(self.column_positions, axis=1)
        counts = tf.concat([f.count for f in found], 0)  # each distinct ID's occurrences in its column
        if parts == 1:  # the columns' IDs cross as they are, joined once
            self.places, outgoing, self._counts = None, [[f.y for f in found]], [counts]
            part_bounds = [bounds]
        else:
            every = tf.concat([f.y for f in found], 0)
            column = tf.repeat(tf.range(self.columns), sizes)
            part = tf.math.floormod(column + shard_of(every, options.shards), parts)  # TableOptions.part
            # Where each part's IDs sit among all the distinct IDs (dynamic_stitch puts its rows back there).
            self.places = tf.dynamic_partition(tf.range(tf.size(every)), part, parts)
            outgoing = [[ids_of_part] for ids_of_part in tf.dynamic_partition(every, part, parts)]
            self._counts = tf.dynamic_partition(counts, part, parts)
            held = tf.reshape(tf.math.bincount(part * self.columns + column, minlength=parts * self.columns,
                                               maxlength=parts * self.columns, dtype=tf.int64),
                              [parts, self.columns])  # each part's IDs of each column
            part_bounds = tf.unstack(tf.concat([tf.zeros([parts, 1], tf.int64), tf.cumsum(held, axis=1)], 1))
        self.part_bounds = part_bounds
        self._crossing = [tf.concat(ids_out + [tf.strings.as_string(b) if ids.dtype == tf.string else b], 0)
                          for ids_out, b in zip(outgoing, part_bounds)]
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


def distinct_ids(graph_tables, ids, options: TableOptions) -> DistinctIds:
    """The DistinctIds of ids [batch, columns] (or model/multi_valued.ColumnIds) for tables of `options`, on
    the caller's device; each built once per tensor of IDs and cut into parts, which every table of its
    columns shares (recorded in `graph_tables`, model/graph_tables.py)."""
    built = graph_tables.of(ids.graph).distinct_ids
    names = tuple(values.name for values in ids.values) if isinstance(ids, multi_valued.ColumnIds) else ids.name
    key = (names, options.shards, options.devices)
    if key not in built:
        built[key] = DistinctIds(ids, options)
    return built[key]


def unreserved(ids):
    """ids, with those a shard's map keeps for itself made no ID (NO_ID): so the three lowest int64 values, and
    two strings that start with a NUL byte, read the default row, as an empty field does."""
    if ids.dtype == tf.int64:
        return tf.maximum(ids, NO_ID[tf.int64])
    reserved = tf.logical_or(tf.equal(ids, EMPTY_KEY[tf.string]), tf.equal(ids, DELETED_KEY[tf.string]))
    return tf.where(reserved, NO_ID[tf.string], ids)


def shard_of(ids, shards: int) -> tf.Tensor:
    if shards == 1:
        return tf.zeros(tf.shape(ids), tf.int32)
    if ids.dtype == tf.string:
        return tf.cast(tf.strings.to_hash_bucket_fast(ids, shards), tf.int32)
    return tf.cast(tf.math.floormod(ids, shards), tf.int32)
