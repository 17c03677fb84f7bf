"""What a model declares to the trainer, so that no rule about a model lives outside model/.

A model module sets NEEDS = Needs(...): Needs() for nothing particular. Variables the
model creates inside `wide_part()` are its wide part: the optimizer that splits wide from deep
(--optimizer=ftrl_adagrad) reads them from the WIDE_VARIABLES collection, never from their names.
Variables it creates inside `table_part()` are its embedding tables (rows, and a dynamic table's
counters): read by the rows a batch names, on the ps that holds them, never whole. The getters that
read a dense variable whole and change how (the 16-bit wire, --local_steps' worker-side copies) leave
them alone (`is_table`), whether or not they are partitioned.
"""

import dataclasses

import tensorflow as tf

v1 = tf.compat.v1

WIDE_VARIABLES = "ps_trainer_wide_variables"
TABLE_VARIABLES = "ps_trainer_table_variables"


@dataclasses.dataclass(frozen=True)
class Needs:
    # The optimizer the model trains with unless --optimizer names one (None: the flag's default).
    default_optimizer: str | None = None
    # Tables cut across the ps tasks (partitioned variables): a step moves only the rows it touches;
    # --accumulate_batches refuses such a model, and --local_steps keeps worker-side copies of its dense
    # variables only (the model makes its tables in table_part()).
    partitioned_tables: bool = False
    # shards(model_cfg, data_spec, num_ps): how many shards each of its tables is cut into when
    # --embedding_partitions is not given (None: one per ps task).
    table_shards: object = None
    # The --embedding kinds whose tables the model reads through one model/grouped_lookup.lookup per
    # forward pass: with those, --local_steps holds a round's rows on the worker (training/step/row_copies.py).
    grouped_lookup_embeddings: tuple[str, ...] = ()
    # Its tables are the dynamic feature columns its model_fn builds (model/dynamic/column.py): it has
    # tables on the ps when the run's --embedding is dynamic, none otherwise.
    dynamic_columns: bool = False


def _collecting(collection: str):
    """A variable_creator_scope in which every variable created (each shard of a partitioned one too)
    joins the collection."""
    def record(next_creator, **kwargs):
        variable = next_creator(**kwargs)
        v1.add_to_collection(collection, variable)
        return variable

    return v1.variable_creator_scope(record)


def wide_part():
    """Every variable created inside joins WIDE_VARIABLES."""
    return _collecting(WIDE_VARIABLES)


def table_part():
    """Every variable created inside joins TABLE_VARIABLES."""
    return _collecting(TABLE_VARIABLES)


def is_table(variable, graph=None) -> bool:
    """Whether a variable, or a partitioned variable's first shard, was made in table_part()."""
    first = variable if isinstance(variable, tf.Variable) else next(iter(variable))
    graph = graph or v1.get_default_graph()
    return any(first is table for table in graph.get_collection(TABLE_VARIABLES))


def wide_variable_names(graph=None) -> set[str]:
    graph = graph or v1.get_default_graph()
    return {variable.op.name for variable in graph.get_collection(WIDE_VARIABLES)}
