"""An example's scalar features packed into one tensor per dtype while a pipeline caches, shuffles
and batches it, and unpacked once per batch.

tf.data's cache, shuffle buffer and batch handle each component of each example on its own: a
click-log example of 26 categorical strings, 13 numbers and a label is 40 copies into every batch.
Packed, it is three (one [26] string, one [13] float, the label), and a batch is cut back into
columns with one unstack per dtype. A source that makes its examples in blocks (blocks(): every
source today) has them packed a block at a time, before they are unbatched; one that has only
records() has them packed one at a time, a map call per example (which made a 784-column CSV 12%
slower, and the clicks generator's first epoch 20%, before they made blocks). The batches are the
same, example for example: the shuffle's order depends on the count of elements only. Measured in
docs/speed.md and docs/data.md.
"""

import tensorflow as tf


def unbatched(blocks):
    """A source's records(data_cfg, split, shard): its blocks(data_cfg, split, shard), a record per element."""

    def records(data_cfg, split: str, shard) -> tf.data.Dataset:
        return blocks(data_cfg, split, shard).unbatch()

    records.__doc__ = f"The records of {blocks.__module__}.blocks(), one per element."
    return records


def batched(examples: tf.data.Dataset, batch, in_blocks: bool = False) -> tf.data.Dataset:
    """batch(dataset) -> its batches (cached, shuffled, batched as the caller wants), applied to the
    examples packed, a record per element; its batches come out in the examples' own structure.
    in_blocks: `examples` are blocks of records (a source's blocks()), each component [n, ...]."""
    structure = examples.element_spec
    specs = tf.nest.flatten(structure)
    groups = {}  # dtype: positions in the flat element of a record's scalar components
    for position, spec in enumerate(specs):
        if isinstance(spec, tf.TensorSpec) and spec.shape.rank == (1 if in_blocks else 0):
            groups.setdefault(spec.dtype, []).append(position)
    groups = [positions for positions in groups.values() if len(positions) > 1]
    if not groups:
        return batch(examples.unbatch() if in_blocks else examples)
    packed = {position for positions in groups for position in positions}
    alone = [position for position in range(len(specs)) if position not in packed]
    axis = 1 if in_blocks else 0

    def to_packed(*element):  # map passes a tuple's parts as arguments; flat, they are the same
        flat = tf.nest.flatten(element)
        return (tuple(tf.stack([flat[p] for p in positions], axis) for positions in groups),
                tuple(flat[p] for p in alone))

    def unpacked(stacked, rest):
        flat = [None] * len(specs)
        for positions, columns in zip(groups, stacked):
            for position, column in zip(positions, tf.unstack(columns, num=len(positions), axis=1)):
                flat[position] = column
        for position, column in zip(alone, rest):
            flat[position] = column
        return tf.nest.pack_sequence_as(structure, flat)

    records = examples.map(to_packed)
    return batch(records.unbatch() if in_blocks else records).map(unpacked)
