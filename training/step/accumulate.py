"""--accumulate_batches=K: a synchronous worker sends one gradient per K batches to each round.

The worker reads the variables once per round (a snapshot on the worker), runs K micro-batches
through the model in a tf.while_loop, sums their gradients with respect to that snapshot, and hands
the mean to SyncReplicasOptimizer as its one contribution. Per example, the variables cross the wire
K times less often and so do the gradients; the round's update is the mean over K x replicas batches,
as one K-times larger batch would give, with the memory of one micro-batch. A global step is still
one round (one update); each round now covers batch_size x K x replicas_to_aggregate examples.
"""

import tensorflow as tf

from ps_trainer.model import needs
from ps_trainer.training.step import single, update
from ps_trainer.training.step.base import Step, StepContext
from ps_trainer.training.step.loop import Iteration, LoopResult, Metrics, training_loop

v1 = tf.compat.v1


class Snapshot:
    """A variable_scope custom_getter: the model reads each dense variable through one worker-side
    read per session.run, made the first time the getter sees it (outside any loop)."""

    def __init__(self, device):
        self.device = device
        self.reads = {}  # variable's name: (variable, its value as this run read it)

    def getter(self, getter, name, *args, **kwargs):  # TensorFlow passes the next getter as `getter`
        variable = getter(name, *args, **kwargs)
        # flags/config.py refuses the trainer's models that declare tables; a program's are refused here.
        if kwargs.get("partitioner") is not None:
            raise ValueError(f"--accumulate_batches: {name} is partitioned; the snapshot is for dense variables")
        if needs.is_table(variable):
            raise ValueError(f"--accumulate_batches: {name} is a table on the ps (as a canned linear model's "
                             "weights are); the snapshot is for dense variables")
        if name not in self.reads:
            with v1.device(self.device), v1.name_scope(None):
                self.reads[name] = (variable, tf.identity(variable.read_value(), name=f"snapshot/{name}"))
        return self.reads[name][1]

    def trainable(self):
        return [(variable, value) for variable, value in self.reads.values() if variable.trainable]


def reader(cluster, train) -> Snapshot:
    del train
    return Snapshot(cluster.compute_device() if cluster.is_distributed else None)


def build(ctx: StepContext) -> Step:
    grads_and_vars, result = mean_gradients(ctx.forward, ctx.reader, ctx.train.accumulate_batches, ctx.figures)
    update_ = single.make_train_op(None, ctx.optimizer, ctx.global_step, ctx.cluster, ctx.train, ctx.stop_requested,
                                   grads_and_vars)
    return update_.step(result.metrics, result.labels)


def mean_gradients(forward, snapshot, batches, figures) -> tuple[list, LoopResult]:
    """(gradients and variables: the mean over `batches` micro-batches of each trainable variable's
    gradient, each micro-batch's held back until its loss is known to be finite; the loop's result)."""
    pairs = snapshot.trainable()
    values = [value for _, value in pairs]

    def micro_batch(sums):
        output, labels = forward()
        grads = update.finite_gradients(output.loss, tf.gradients(output.loss, values))
        return Iteration([total + grad for total, grad in zip(sums, grads)], Metrics.of(output), labels)

    result = training_loop("accumulate_batches", lambda done, _: done < batches, micro_batch, figures,
                           carried=[tf.zeros_like(value) for value in values],
                           carried_shapes=[value.shape for value in values])
    return [(total / batches, variable) for total, (variable, _) in zip(result.carried, pairs)], result
