"""Categorical columns that hold any number of values per example ("a|b|c" in one field: a user's last
clicked items, a page's tags), next to the columns that hold one.

Such a field stays one string from the file to the model (input/: the cache, the shuffle, the batches and
the export's serving input all see the raw field a user's log holds); the model splits it (split()), looks
up a row per value in the column's table, as it does for a single-valued column, and combines each
example's rows into one (combined()): the embeddings by --combiner (their sum, mean or sum over the square
root of their count), a wide model's weights summed (WIDE_COMBINER). An
empty field, or one of separators only, is an empty list: a row of zeros. Empty values between separators
are no values.

ColumnIds carries the IDs of a model's columns, some multi-valued, to a table kind's lookup: column by
column, each ID with the example it belongs to, so that one grouped lookup (model/grouped_lookup.py) and
one batch of distinct IDs (model/dynamic/ids.py) serve every column at once.
"""

from typing import NamedTuple

import tensorflow as tf

COMBINERS = ("sum", "mean", "sqrtn")
# The wide part's weights of a column's values add up, as in TF's linear models (their sparse_combiner).
WIDE_COMBINER = "sum"
DEFAULT_SEPARATOR = "|"


def split(fields: tf.Tensor, separator: str) -> tf.RaggedTensor:
    """[batch] raw fields -> [batch, (values)], empty values dropped."""
    values = tf.strings.split(fields, sep=separator)
    return tf.ragged.boolean_mask(values, tf.not_equal(values, ""))


class ColumnIds(NamedTuple):
    """The IDs of `len(values)` columns of a batch of `batch` examples: values[c], column c's IDs in the
    order of their examples, and examples[c], the example each one is of."""

    values: tuple
    examples: tuple
    batch: tf.Tensor

    @classmethod
    def of(cls, columns) -> "ColumnIds":
        """From each column's IDs: a [batch] tensor (one per example) or a [batch, (n)] RaggedTensor."""
        batch = next(tf.shape(c, out_type=tf.int64)[0] if isinstance(c, tf.Tensor) else c.nrows() for c in columns)
        values, examples = [], []
        for column in columns:
            if isinstance(column, tf.RaggedTensor):
                values.append(column.flat_values)
                examples.append(column.value_rowids())
            else:
                values.append(column)
                examples.append(tf.range(batch))
        return cls(tuple(values), tuple(examples), batch)

    def map(self, fn) -> "ColumnIds":
        """fn applied to each column's IDs (e.g. a hash to a row)."""
        return self._replace(values=tuple(fn(values) for values in self.values))

    @property
    def dtype(self):
        return self.values[0].dtype

    @property
    def graph(self):
        return self.values[0].graph

    def sizes(self) -> tf.Tensor:
        """[columns]: each column's count of IDs in the batch."""
        return tf.stack([tf.size(values, out_type=tf.int64) for values in self.values])

    def flat(self) -> tuple[tf.Tensor, tf.Tensor]:
        """(every ID, column after column, [ids]; the column of each, [ids])."""
        columns = tf.repeat(tf.range(len(self.values), dtype=tf.int64), self.sizes())
        return tf.concat(list(self.values), 0), columns

    def combined(self, rows: tf.Tensor, combiner: str) -> tf.Tensor:
        """rows [ids, width], a row per ID in flat()'s order -> [batch, columns, width], each example's rows of
        a column combined: "sum", "mean" or "sqrtn" (the sum over the square root of their count); an example
        with no ID in a column gets zeros."""
        columns = len(self.values)
        segments = tf.concat([examples * columns + c for c, examples in enumerate(self.examples)], 0)
        cells = self.batch * columns
        summed = tf.math.unsorted_segment_sum(rows, segments, cells)
        if combiner != "sum":
            counts = tf.math.unsorted_segment_sum(tf.ones_like(segments, rows.dtype), segments, cells)
            counts = tf.maximum(counts, 1.0)
            summed /= (counts if combiner == "mean" else tf.sqrt(counts))[:, None]
        return tf.reshape(summed, [-1, columns, rows.shape[-1]])


def split_columns(features: dict, separators: dict) -> dict:
    """features, with each multi-valued column's fields (`separators`: the separator of each) split()."""
    return {name: split(value, separators[name]) if name in separators else value
            for name, value in features.items()}


def ids_of(columns: list):
    """The IDs of columns (each [batch], or [batch, (n)] when multi-valued): [batch, columns] when none is
    multi-valued, else ColumnIds."""
    if not any(isinstance(column, tf.RaggedTensor) for column in columns):
        return tf.stack(columns, axis=1)
    return ColumnIds.of(columns)


def combined(rows, ids, combiner: str) -> tf.Tensor:
    """A lookup's rows of `ids` (ids_of()'s) -> [batch, columns, width]: as they are for [batch, columns] IDs,
    ColumnIds.combined() for ColumnIds."""
    return ids.combined(rows, combiner) if isinstance(ids, ColumnIds) else rows
