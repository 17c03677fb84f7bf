"""This replica's training graph: the input, the model, and the update that reaches the ps.

Variables go to the ps tasks (replica_device_setter, by bytes), everything else stays on this worker.
In sync mode the update goes through SyncReplicasOptimizer with the hooks of training/hooks.py.
"""

from typing import NamedTuple

import tensorflow as tf

import input as inputs
import model
from cluster import placement
from training import accumulate, checkpoints, local_steps, optimizers, schedules, staleness, sync, wire

v1 = tf.compat.v1

NON_FINITE_LOSS = "NonFiniteLoss"


class TrainGraph(NamedTuple):
    saver: tf.compat.v1.train.Saver
    train_op: tf.Operation
    loss: tf.Tensor
    accuracy: tf.Tensor
    hooks: list
    chief_only_hooks: list
    steps_done: tf.Tensor | None = None  # with --steps_per_run: the steps one run of train_op took
    # Asynchronous clusters: the global step as a run reads it and once its update has landed.
    step_read_and_landed: tuple[tf.Tensor, tf.Tensor] | None = None
    labels: tf.Tensor | None = None  # the (last) batch's labels, for the not-learning check
    uninitialized: tf.Tensor | None = None  # the names of the variables not initialized (yet), on the ps


def build_graph(cfg, stop_requested=None) -> TrainGraph:
    """This replica's training graph: variables on the ps tasks, everything else on this worker.
    `stop_requested()` ends a sync worker's wait for a round (see SyncReplicasHook)."""
    cluster, train = cfg.cluster, cfg.train
    v1.set_random_seed(train.seed)
    device = placement.device_setter(cluster) if cluster.is_distributed else None
    looped = train.steps_per_run > 1 or train.accumulate_batches > 1  # the model is built again in a loop
    with v1.device(device):
        global_step = v1.train.get_or_create_global_step()
        shard = inputs.Shard(cluster.replica_index, cluster.num_workers)
        batches = v1.data.make_one_shot_iterator(inputs.batches(cfg.data, shard, train.batch_size))
        # One process has no wire: --wire_dtype applies to clusters only.
        read_through = wire.read_through(wire.WIRE_DTYPES[train.wire_dtype]) if cluster.is_distributed else None
        own_device = cluster.compute_device() if cluster.is_distributed else None
        copies = snapshot = None  # flags/config.py lets at most one of the two levers on
        if train.local_steps > 1:  # the model trains worker-side copies (training/local_steps.py)
            copies = local_steps.LocalCopies(own_device, cluster.num_workers)
            read_through = copies.getter
        if train.accumulate_batches > 1:  # one read of the variables per round (training/accumulate.py)
            snapshot = accumulate.Snapshot(own_device)
            read_through = snapshot.getter

        def forward(summaries):
            features, labels = batches.get_next()
            with v1.variable_scope(v1.get_variable_scope(), custom_getter=read_through, reuse=v1.AUTO_REUSE):
                return model.build(features, labels, cfg.model, inputs.spec(cfg.data), summaries), labels

        output, labels = forward(summaries=not looped)
        learning_rate = schedules.learning_rate(global_step, train)
        v1.summary.scalar("learning_rate", learning_rate)
        optimizer = optimizers.make_optimizer(learning_rate, train)
        steps_done = None
        if copies:
            train_op, output, labels, steps_done = local_rounds(forward, output, optimizer, global_step, train, copies)
            hooks, chief_only_hooks = [v1.train.StopAtStepHook(last_step=train.train_steps)], []
        else:
            grads_and_vars = None
            if snapshot:
                grads_and_vars, metrics, labels = accumulate.mean_gradients(
                    forward, snapshot, train.accumulate_batches, output.auc is not None, finite_gradients)
                output = model.ModelOutput(None, None, *metrics, *([] if output.auc is not None else [None]))
            train_op, hooks, chief_only_hooks = make_train_op(output.loss, optimizer, global_step, cluster, train,
                                                               stop_requested, grads_and_vars)
        if looped and not copies and not snapshot:
            # --steps_per_run: the single step above made the variables and slots, which a loop body cannot
            train_op, output, labels, steps_done = repeat_steps(forward, optimizer, global_step, train,
                                                                output.auc is not None)
        if looped:
            model.summarize(output)
        asynchronous = cluster.is_distributed and not train.sync_replicas
        step_read_and_landed = staleness.steps(global_step, train_op) if asynchronous else None
    # As MonitoredTrainingSession's default saver (sharded: each ps saves its own variables), with
    # --keep_checkpoint_max.
    saver = checkpoints.LiveStateSaver(sharded=True, max_to_keep=train.keep_checkpoint_max, save_relative_paths=True)
    # Built here: a MonitoredTrainingSession that failed can leave the graph finalized.
    uninitialized = v1.report_uninitialized_variables(v1.global_variables())
    uninitialized.mark_used()  # a non-chief's wait for the chief runs it; the chief never does
    return TrainGraph(saver, train_op, output.loss, output.accuracy, hooks, chief_only_hooks, steps_done,
                      step_read_and_landed, labels, uninitialized)


def local_rounds(forward, output, optimizer, global_step, train, copies):
    """--local_steps: the round op of training/local_steps.py. The single step's update built here
    makes the optimizer's slots of the copies (a loop body cannot), as local variables."""
    with v1.variable_creator_scope(local_steps.slots_stay_local):
        apply_update(output.loss, optimizer, None, train.clip_gradient_norm, summaries=False,
                     var_list=copies.local_variables)
        train_op, metrics, labels, steps_done = local_steps.round_op(
            forward, optimizer, global_step, train, copies, apply_update, output.auc is not None)
    loss, accuracy, *auc = metrics
    return train_op, model.ModelOutput(None, None, loss, accuracy, auc[0] if auc else None), labels, steps_done


def repeat_steps(forward, optimizer, global_step, train, with_auc):
    """--steps_per_run: up to that many training steps in one tf.while_loop, so in one session.run.

    Each iteration is a whole step (next batch, forward, gradients, update, global step + 1); the
    loop also ends at --train_steps, so the last run stops there. Returns the loop's op, the last
    step's loss and metrics (for logging and summaries, between runs), its labels and the steps it took.
    """
    # The global step is carried from each update to the next check: a read in the loop's condition
    # could run before the previous iteration's increment and let the loop pass --train_steps.
    def keep_going(done, step_reached, *_):
        return tf.logical_and(done < train.steps_per_run, step_reached < train.train_steps)

    def step(done, step_reached, labels, *_):
        output, labels = forward(summaries=False)
        with tf.control_dependencies([apply_update(output.loss, optimizer, global_step, train.clip_gradient_norm,
                                                   summaries=False)]):
            metrics = [output.loss, output.accuracy] + ([output.auc] if with_auc else [])
            return [done + 1, global_step.read_value(), tf.identity(labels)] + [tf.identity(m) for m in metrics]

    no_labels = tf.zeros([0], tf.int64)
    start = [tf.constant(0), global_step.read_value(), no_labels] + [tf.constant(0.0)] * (3 if with_auc else 2)
    invariants = [tf.TensorShape([]), tf.TensorShape([]), tf.TensorShape([None])] + [tf.TensorShape([])] * (
        3 if with_auc else 2)
    done, _, labels, loss, accuracy, *auc = tf.while_loop(keep_going, step, start, shape_invariants=invariants,
                                                          name="steps_per_run")
    output = model.ModelOutput(None, None, loss, accuracy, auc[0] if auc else None)
    return done.op, output, labels, done


def make_train_op(loss, optimizer, global_step, cluster, train, stop_requested=None, grads_and_vars=None):
    """The update op, plus the hooks it needs on every worker and on the chief only.

    With train.sync_replicas, gradients go through SyncReplicasOptimizer (training/sync.py);
    `stop_requested()` ends a worker's wait for a round that is missing a peer's gradient.
    `grads_and_vars`: gradients computed already (--accumulate_batches), instead of the loss's.
    """
    hooks, chief_only_hooks = [], []
    if train.sync_replicas:
        optimizer = sync.wrap_optimizer(optimizer, cluster, train)
    train_op = apply_update(loss, optimizer, global_step, train.clip_gradient_norm, grads_and_vars=grads_and_vars)
    if train.sync_replicas:
        hooks, chief_only_hooks = sync.hooks(optimizer, train_op, cluster, train, stop_requested)
    hooks.append(v1.train.StopAtStepHook(last_step=train.train_steps))
    return train_op, hooks, chief_only_hooks


def apply_update(loss, optimizer, global_step, clip_norm=None, summaries=True, var_list=None, grads_and_vars=None):
    """Gradients of the loss (or grads_and_vars, if given), clipped to clip_norm by their global norm,
    applied to the variables (var_list, default the trainable ones), global step + 1 unless it is None;
    the gradients' global norm, before clipping, as a summary."""
    if grads_and_vars is None:
        # Colocated: the gradient of an op on the ps (a wire cast, an embedding gather) is computed there.
        grads_and_vars = guard_finite(loss, optimizer.compute_gradients(loss, var_list=var_list,
                                                                        colocate_gradients_with_ops=True))
    grads, variables = zip(*grads_and_vars)
    norm = tf.linalg.global_norm(grads, name="global_norm_of_gradients")  # not the tag: that would be "_1"
    if summaries:
        v1.summary.scalar("gradient_global_norm", norm)
    if clip_norm:
        grads, _ = tf.clip_by_global_norm(grads, clip_norm, use_norm=norm)
    return optimizer.apply_gradients(list(zip(grads, variables)), global_step=global_step)


def guard_finite(loss, grads_and_vars):
    """Makes every gradient wait for a check that the loss is finite.

    A NaN or Inf loss then fails the step before any update reaches the ps, so the variables and the
    latest checkpoint stay the last good ones.
    """
    with tf.control_dependencies([_finite_check(loss)]):
        return [(_identity(grad), var) for grad, var in grads_and_vars if grad is not None]


def finite_gradients(loss, grads):
    """guard_finite for a list of dense gradients, in their order."""
    with tf.control_dependencies([_finite_check(loss)]):
        return [tf.identity(grad) for grad in grads]


def _finite_check(loss):
    return tf.debugging.assert_all_finite(loss, f"{NON_FINITE_LOSS}: the loss is NaN or Inf")


def _identity(grad):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(tf.identity(grad.values), grad.indices, grad.dense_shape)
    return tf.identity(grad)
