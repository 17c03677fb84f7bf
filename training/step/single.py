"""One training step a session.run, asynchronous or synchronous: the step with no lever on."""

import tensorflow as tf

from training.step import sync, update
from training.step.base import Step, StepContext
from training.step.loop import Metrics

v1 = tf.compat.v1


def build(ctx: StepContext) -> Step:
    train_op, hooks, chief_only_hooks = make_train_op(ctx.first.loss, ctx.optimizer, ctx.global_step, ctx.cluster,
                                                      ctx.train, ctx.stop_requested)
    return Step(train_op, Metrics.of(ctx.first), ctx.first_labels, None, tuple(hooks), tuple(chief_only_hooks))


def make_train_op(loss, optimizer, global_step, cluster, train, stop_requested=None, grads_and_vars=None):
    """The update op, plus the hooks it needs on every worker and on the chief only.

    With train.sync_replicas, gradients go through SyncReplicasOptimizer (training/step/sync.py);
    `stop_requested()` ends a worker's wait for a round that is missing a peer's gradient.
    `grads_and_vars`: gradients computed already (--accumulate_batches), instead of the loss's.
    """
    hooks, chief_only_hooks = [], []
    if train.sync_replicas:
        optimizer = sync.wrap_optimizer(optimizer, cluster, train)
    train_op = update.apply_update(loss, optimizer, global_step, train.clip_gradient_norm,
                                   grads_and_vars=grads_and_vars)
    if train.sync_replicas:
        hooks, chief_only_hooks = sync.hooks(optimizer, train_op, cluster, train, stop_requested)
    hooks.append(v1.train.StopAtStepHook(last_step=train.train_steps))
    return train_op, hooks, chief_only_hooks
