"""A feature column of a dynamic table, for a user's model_fn: `dynamic_embedding_column(key, dimension)`
reads the raw values of feature `key` (strings or integers) and gives each value an embedding row of its
own, made when training first meets it, in the trainer's dynamic tables (--embedding=dynamic: their
capacity, growth, admission, eviction and shards are the run's flags). It goes into
`tf.compat.v1.feature_column.input_layer` with TF1's own columns.

A feature may hold any number of values per example, as TF1's categorical columns take them: a
SparseTensor (tf.io.VarLenFeature, which the column's parse spec is) or a dense [batch, n] tensor whose
'' (strings) or -1 (integers) pad it. Each example's rows are combined by `combiner` (sum, mean or sqrtn,
model/multi_valued.py); an example with no value gets zeros.

The tables are the runtime's: whoever calls the model_fn (trainer.py's `--model_fn`, model/user_fn.py, or an
Estimator program's Estimator with PS_TRAINER_FLAGS --embedding=dynamic) says, while it builds the model_fn's
graph, the GraphTables the tables go in, the run's table options and whether the graph trains (`building`).
Without them the column refuses in one line, naming itself.

`building` is a context variable because nothing else reaches the column: TF1's input_layer calls it with the
features alone, inside a user's model_fn that the runtime cannot pass anything through.
"""

import contextlib
import contextvars
import dataclasses

import tensorflow as tf
from tensorflow.python.feature_column import feature_column as fc_v1  # TF1's column interface (input_layer's)

from ps_trainer.model import multi_valued
from ps_trainer.model.dynamic import table as dynamic_table
from ps_trainer.model.dynamic.ids import TableOptions
from ps_trainer.model.graph_tables import GraphTables
from ps_trainer.model.needs import table_part

v1 = tf.compat.v1


@dataclasses.dataclass
class _Build:
    graph_tables: GraphTables
    options: TableOptions
    training: bool
    columns: int = 0  # the dynamic columns built so far in this forward pass


_BUILD: contextvars.ContextVar = contextvars.ContextVar("dynamic_columns", default=None)


@contextlib.contextmanager
def building(graph_tables: GraphTables, options: TableOptions | None, training: bool):
    """While a model_fn builds its graph: the GraphTables its dynamic tables go in, the run's table options
    (None: the run has no dynamic tables) and whether the graph trains (admits IDs) or only reads."""
    token = _BUILD.set(_Build(graph_tables, options, training) if options is not None else None)
    try:
        yield
    finally:
        _BUILD.reset(token)


def dynamic_embedding_column(key: str, dimension: int, initializer=None, combiner: str = "mean"):
    """The column: [batch, dimension], each example's row of the table of feature `key` (its rows combined
    by `combiner` where it holds several values)."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"dynamic_embedding_column: key must be a feature's name, not {key!r}")
    if not isinstance(dimension, int) or dimension < 1:
        raise ValueError(f"dynamic_embedding_column({key!r}): dimension must be a positive integer, not {dimension!r}")
    if combiner not in multi_valued.COMBINERS:
        raise ValueError(f"dynamic_embedding_column({key!r}): combiner must be one of "
                         f"{', '.join(multi_valued.COMBINERS)}, not {combiner!r}")
    return DynamicEmbeddingColumn(key, dimension, initializer, combiner)


class DynamicEmbeddingColumn(fc_v1._DenseColumn):  # noqa: SLF001  (TF1's base class of a dense feature column, as its own columns subclass it)
    """TF1's _DenseColumn over a dynamic table (dynamic_embedding_column makes one)."""

    def __init__(self, key, dimension, initializer, combiner="mean"):
        self.key, self.dimension, self.combiner = key, dimension, combiner
        self.initializer = initializer or v1.truncated_normal_initializer(stddev=dimension ** -0.5)

    @property
    def name(self):
        return f"{self.key}_dynamic_embedding"

    @property
    def _parse_example_spec(self):
        return {self.key: v1.VarLenFeature(tf.string)}

    def _transform_feature(self, inputs):
        return inputs.get(self.key)

    @property
    def _variable_shape(self):
        return tf.TensorShape([self.dimension])

    def _get_dense_tensor(self, inputs, weight_collections=None, trainable=None):
        del weight_collections, trainable  # the runtime trains the table's rows (`building` says whether)
        build = _BUILD.get()
        if build is None:
            raise ValueError(f"dynamic_embedding_column({self.key!r}): its table is the runtime's dynamic tables': "
                             "give --embedding=dynamic (trainer.py --model_fn=FILE.py:FUNCTION --embedding=dynamic, "
                             "or an Estimator program's PS_TRAINER_FLAGS)")
        values = self._values(inputs.get(self))  # TF1's input_layer gives a raw [batch] feature as [batch, 1]
        # Whole tables spread over the ps tasks a column each in turn, as wide_deep's (TableOptions.part).
        turn = build.columns % max(len(build.options.devices), 1)
        build.columns += 1
        devices = build.options.devices
        options = dataclasses.replace(build.options, devices=devices[turn:] + devices[:turn])
        scope = v1.get_variable_scope().name
        with table_part():
            if not isinstance(values, tf.RaggedTensor):
                table = dynamic_table.DynamicTable(build.graph_tables, scope, values, options, build.training)
                return table.rows("embedding", self.dimension, self.initializer)
            ids = multi_valued.ColumnIds.of([values])
            table = dynamic_table.DynamicTable(build.graph_tables, scope, ids, options, build.training, column=0)
            rows = dynamic_table.rows_of_columns([table], "embedding", self.dimension, self.initializer)
            return tf.reshape(ids.combined(rows, self.combiner), [-1, self.dimension])

    def _values(self, feature):
        """The feature's IDs: [batch] (one value per example), or [batch, (values)] (a SparseTensor's, or a
        dense [batch, n]'s without its padding)."""
        if isinstance(feature, tf.SparseTensor):
            if feature.shape.rank not in (None, 2):
                raise ValueError(f"dynamic_embedding_column({self.key!r}): feature {self.key!r} is sparse of rank "
                                 f"{feature.shape.rank}; the column reads [batch, values]")
            return self._ids(tf.RaggedTensor.from_sparse(feature))
        if feature.shape.rank not in (1, 2):
            raise ValueError(f"dynamic_embedding_column({self.key!r}): feature {self.key!r} is of shape "
                             f"{feature.shape}; the column reads [batch] or [batch, values]")
        if feature.shape.rank == 1 or feature.shape[1] == 1:
            return self._ids(tf.reshape(feature, [-1]))
        padding = "" if feature.dtype == tf.string else -1
        return self._ids(tf.ragged.boolean_mask(feature, tf.not_equal(feature, padding)))

    @staticmethod
    def _ids(values):
        return values if values.dtype in (tf.string, tf.int64) else tf.cast(values, tf.int64)
