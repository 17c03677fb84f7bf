"""--accumulate_batches=K: a synchronous worker sends one gradient per K batches to each round.

The worker reads the variables once per round (a snapshot on the worker), runs K micro-batches
through the model in a tf.while_loop, sums their gradients with respect to that snapshot, and hands
the mean to SyncReplicasOptimizer as its one contribution. Per example, the variables cross the wire
K times less often and so do the gradients; the round's update is the mean over K x replicas batches,
as one K-times larger batch would give, with the memory of one micro-batch. A global step is still
one round (one update); each round now covers batch_size x K x replicas_to_aggregate examples.
"""

import tensorflow as tf

v1 = tf.compat.v1


class Snapshot:
    """A variable_scope custom_getter: the model reads each dense variable through one worker-side
    read per session.run, made the first time the getter sees it (outside any loop)."""

    def __init__(self, device):
        self.device = device
        self.reads = {}  # variable's name: (variable, its value as this run read it)

    def getter(self, getter, name, *args, **kwargs):  # TensorFlow passes the next getter as `getter`
        variable = getter(name, *args, **kwargs)
        if kwargs.get("partitioner") is not None:  # flags/config.py refuses such models first
            raise ValueError(f"--accumulate_batches: {name} is partitioned; the snapshot is for dense variables")
        if name not in self.reads:
            with v1.device(self.device), v1.name_scope(None):
                self.reads[name] = (variable, tf.identity(variable.read_value(), name=f"snapshot/{name}"))
        return self.reads[name][1]

    def trainable(self):
        return [(variable, value) for variable, value in self.reads.values() if variable.trainable]


def mean_gradients(forward, snapshot, batches, with_auc, check_finite):
    """(gradients and variables: the mean over `batches` micro-batches of each trainable variable's
    gradient, the last micro-batch's loss/accuracy/auc, its labels). `check_finite(loss, grads)`
    makes each micro-batch's gradients wait for a check of its loss."""
    pairs = snapshot.trainable()
    values = [value for _, value in pairs]

    def step(done, labels, sums, *_):
        output, labels = forward(summaries=False)
        grads = check_finite(output.loss, tf.gradients(output.loss, values))
        metrics = [output.loss, output.accuracy] + ([output.auc] if with_auc else [])
        return [done + 1, labels, [s + g for s, g in zip(sums, grads)]] + metrics

    start = [tf.constant(0), tf.zeros([0], tf.int64), [tf.zeros_like(v) for v in values]] + [
        tf.constant(0.0)] * (3 if with_auc else 2)
    invariants = [tf.TensorShape([]), tf.TensorShape([None]), [v.shape for v in values]] + [
        tf.TensorShape([])] * (3 if with_auc else 2)
    _, labels, sums, *metrics = tf.while_loop(lambda done, *_: done < batches, step, start,
                                              shape_invariants=invariants, name="accumulate_batches")
    grads_and_vars = [(total / batches, variable) for total, (variable, _) in zip(sums, pairs)]
    return grads_and_vars, metrics, labels
