"""The shapes every lever shares: what it is (Lever), what it is given (StepContext) and what it builds (Step)."""

from typing import Callable, NamedTuple, Protocol

import tensorflow as tf

from ps_trainer.training.step.loop import Metrics


class StepContext(NamedTuple):
    # (batch=None) -> (ModelOutput, labels) of `batch` (features, labels), or of the next batch, read through `reader`
    forward: Callable
    first: object  # the ModelOutput of the forward pass built outside any loop (it made the variables)
    first_labels: tf.Tensor
    optimizer: tf.compat.v1.train.Optimizer
    global_step: tf.Variable
    cluster: object  # ClusterConfig
    train: object  # TrainConfig
    reader: object | None  # the lever's reader of the variables (its custom getter's owner), if it has one
    stop_requested: Callable | None = None  # ends a sync worker's wait for a round
    next_batch: Callable | None = None  # () -> (features, labels) of the next read of the input

    @property
    def figures(self) -> tuple[str, ...]:
        """The names of the figures a step reports (Metrics.names of the first output's)."""
        return Metrics.of(self.first).names()


class Step(NamedTuple):
    train_op: tf.Operation
    metrics: Metrics  # the (last) batch's
    labels: tf.Tensor  # the (last) batch's, for the not-learning check
    steps_done: tf.Tensor | None = None  # with several steps a run: how many this run took
    hooks: tuple = ()  # SessionRunHooks of every worker
    chief_only_hooks: tuple = ()
    # Synchronous steps: the op that ends every worker's wait for a round (run when the input's epochs
    # are all trained), and () -> whether this session's next push goes stale (its batch trains nothing).
    end_op: tf.Operation | None = None
    drops_next_push: Callable[[], bool] | None = None
    # The op at the end of the run that adds its steps to the global step, on the global step's device; None
    # where the run ends in no such op (a synchronous worker's, counted by the chief's round; a run of several
    # steps, counted in its loop; a model_fn's own train_op): the input queue's reports then carry the global
    # step as the run read it (training/graph.step_reached), or for a synchronous worker `round_applied`.
    counted: tf.Operation | None = None
    # Synchronous steps: () -> the global step at which the round the run's gradient joined was applied, known
    # once the sync hook's after_run has run (training/step/sync.SyncReplicasHook.round_applied).
    round_applied: Callable[[], int | None] | None = None


class Lever(Protocol):
    """What a lever module has (training/step.LEVERS' values)."""

    # (cluster, train) -> the lever's own reader of the variables, whose custom getter the model reads them
    # through (worker-side copies, a snapshot); None for a lever that reads them as the wire does.
    reader: Callable | None

    def build(self, ctx: StepContext) -> Step:
        """The step one session.run takes."""
