"""What a model declares to the trainer, so that no rule about a model lives outside model/.

A model module may set NEEDS = Needs(...); one that does not needs nothing particular. Variables the
model creates inside `wide_part()` are its wide part: the optimizer that splits wide from deep
(--optimizer=ftrl_adagrad) reads them from the WIDE_VARIABLES collection, never from their names.
"""

import contextlib
import dataclasses

import tensorflow as tf

v1 = tf.compat.v1

WIDE_VARIABLES = "ps_trainer_wide_variables"


@dataclasses.dataclass(frozen=True)
class Needs:
    # The optimizer the model trains with unless --optimizer names one (None: the flag's default).
    default_optimizer: str | None = None
    # Tables cut across the ps tasks (partitioned variables): a step moves only the rows it touches, and
    # the levers that keep worker-side copies of every variable (--local_steps, --accumulate_batches)
    # refuse such a model.
    partitioned_tables: bool = False
    # pieces(model_cfg, data_spec, num_ps): how many pieces each of its tables is cut into when
    # --embedding_partitions is not given (None: one per ps task).
    table_pieces: object = None


@contextlib.contextmanager
def wide_part():
    """Every variable created inside (each piece of a partitioned one too) joins WIDE_VARIABLES."""
    def record(next_creator, **kwargs):
        variable = next_creator(**kwargs)
        v1.add_to_collection(WIDE_VARIABLES, variable)
        return variable

    with v1.variable_creator_scope(record):
        yield


def wide_variable_names(graph=None) -> set[str]:
    graph = graph or v1.get_default_graph()
    return {variable.op.name for variable in graph.get_collection(WIDE_VARIABLES)}
