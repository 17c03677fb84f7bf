"""What one session.run of a worker does: the step, chosen from a table of levers.

Every lever turns the same inputs (StepContext: the model's forward pass, its first output, the
optimizer, the global step, the settings) into the same shape of step (Step: the op to run, its
metrics and labels, the steps one run takes, and the hooks it needs). The update rule they share is
training/step/update.py; their loops, training/step/loop.py. Adding a lever is one module here,
its path in training/plan.py, one line in LEVERS, and its flag in flags/.
"""

from ps_trainer.training import plan
from ps_trainer.training.step import accumulate, local_steps, single, steps_per_run, wire
from ps_trainer.training.step.base import Lever, Step, StepContext  # noqa: F401  (the shapes every lever shares)
from ps_trainer.training.step.loop import Metrics  # noqa: F401

# The module that builds each step path of training/plan.py (where the path is chosen). Rounds of rows
# are local_steps with the tables' rows copied too (its reader sees TrainConfig.step_path).
LEVERS: dict[str, Lever] = {
    plan.SINGLE: single,
    plan.STEPS_PER_RUN: steps_per_run,
    plan.LOCAL_STEPS: local_steps,
    plan.ROUNDS: local_steps,
    plan.ACCUMULATE: accumulate,
}


def lever(train) -> Lever:
    """The module that builds this run's step."""
    return LEVERS[train.step_path.name]


def reader_and_getter(chosen_lever: Lever, cluster, train):
    """(the lever's reader or None, the variable_scope custom_getter the model reads variables
    through): the lever's own (Lever.reader), else the wire's (clusters only: one process has no wire)."""
    reader = chosen_lever.reader(cluster, train) if chosen_lever.reader else None
    if reader is not None:
        return reader, reader.getter
    return None, wire.read_through(wire.WIRE_DTYPES[train.wire_dtype]) if cluster.is_distributed else None
