"""What one session.run of a worker does: the step, chosen from a table of levers.

Every lever turns the same inputs (StepContext: the model's forward pass, its first output, the
optimizer, the global step, the settings) into the same shape of step (Step: the op to run, its
metrics and labels, the steps one run takes, and the hooks it needs). The update rule they share is
training/step/update.py; their loops, training/step/loop.py. Adding a lever is one module here,
one line in LEVERS, and its flag in flags/.
"""

from training.step import accumulate, local_steps, single, steps_per_run, wire
from training.step.base import Step, StepContext  # noqa: F401  (the shapes every lever shares)
from training.step.loop import Metrics  # noqa: F401

# A TrainConfig setting that turns a lever on (when above 1): the module that builds that step. The
# first that is on wins (--local_steps also sets steps_per_run); flags/config.py lets one lever on.
# With none on, a run is one step (single).
LEVERS = {
    "local_steps": local_steps,
    "accumulate_batches": accumulate,
    "steps_per_run": steps_per_run,
}


def lever(train):
    """The module that builds this run's step."""
    return next((module for setting, module in LEVERS.items() if getattr(train, setting) > 1), single)


def reader_and_getter(chosen_lever, cluster, train):
    """(the lever's reader or None, the variable_scope custom_getter the model reads variables
    through): the lever's own (a lever module with a reader(cluster, train)), else the wire's
    (clusters only: one process has no wire)."""
    reader = chosen_lever.reader(cluster, train) if hasattr(chosen_lever, "reader") else None
    if reader is not None:
        return reader, reader.getter
    return None, wire.read_through(wire.WIRE_DTYPES[train.wire_dtype]) if cluster.is_distributed else None
