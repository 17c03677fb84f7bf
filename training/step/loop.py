"""Several training steps in one session.run: the one tf.while_loop every looping lever builds on.

Each iteration runs a body that reads the next batch and does the lever's work with it; the loop
carries the steps done, the lever's own values, and the last iteration's labels and Metrics, all
taken after that iteration's update (if it has one).
"""

from typing import Callable, NamedTuple

import tensorflow as tf

from ps_trainer import model


class Metrics(NamedTuple):
    """A step's figures for the logs, the summaries and the not-learning check."""
    loss: tf.Tensor
    accuracy: tf.Tensor | None = None  # None: a program's model_fn, whose labels are its own
    auc: tf.Tensor | None = None  # two classes only: the batch's ROC AUC of class 1

    @classmethod
    def of(cls, output: model.ModelOutput) -> "Metrics":
        return cls(output.loss, output.accuracy, output.auc)

    def present(self) -> list[tf.Tensor]:
        return [metric for metric in self if metric is not None]

    def names(self) -> tuple[str, ...]:
        """The names of the figures present (a loop carries those)."""
        return tuple(name for name, metric in zip(self._fields, self) if metric is not None)


class Iteration(NamedTuple):
    """What a loop body returns: the carried values for the next iteration, this batch's metrics and
    labels, and the update they are read after (None: no update in the loop)."""
    carried: list
    metrics: Metrics
    labels: tf.Tensor
    update: tf.Operation | None = None


class LoopResult(NamedTuple):
    done: tf.Tensor  # iterations run
    carried: list
    metrics: Metrics  # the last iteration's
    labels: tf.Tensor  # the last iteration's


def training_loop(name: str, keep_going: Callable, body: Callable, figures: tuple[str, ...], carried=(),
                  carried_shapes=()) -> LoopResult:
    """Runs body(carried) -> Iteration while keep_going(done, carried) holds, in one tf.while_loop; the
    last iteration's `figures` (Metrics.names of what the body returns) come out with its labels."""
    metric_count = len(figures)

    def condition(done, carried, labels, metrics):
        del labels, metrics
        return keep_going(done, carried)

    def iteration(done, carried, labels, metrics):
        del labels, metrics
        result = body(carried)
        after = [result.update] if result.update is not None else []
        with tf.control_dependencies(after):
            figures = [tf.identity(metric) for metric in result.metrics.present()]
            return [done + 1, list(result.carried), tf.identity(result.labels), figures]

    start = [tf.constant(0), list(carried), tf.zeros([0], tf.int64), [tf.constant(0.0)] * metric_count]
    shapes = [tf.TensorShape([]), list(carried_shapes), tf.TensorShape([None]), [tf.TensorShape([])] * metric_count]
    done, carried, labels, metrics = tf.while_loop(condition, iteration, start, shape_invariants=shapes, name=name)
    return LoopResult(done, carried, Metrics(**dict(zip(figures, metrics))), labels)
