"""One training step a session.run, asynchronous or synchronous: the step with no lever on."""

from typing import Callable, NamedTuple

import tensorflow as tf

from ps_trainer.training.step import sync, update
from ps_trainer.training.step.base import Step, StepContext
from ps_trainer.training.step.loop import Metrics

v1 = tf.compat.v1
reader = None  # the model reads the variables through the wire (training/step/wire.py)


class Update(NamedTuple):
    train_op: tf.Operation
    hooks: tuple  # of every worker
    chief_only_hooks: tuple
    end_op: tf.Operation | None = None  # synchronous: Step.end_op
    drops_next_push: Callable[[], bool] | None = None  # synchronous: Step.drops_next_push
    counted: tf.Operation | None = None  # asynchronous: train_op, the optimizer's assign_add to the global step
    round_applied: Callable[[], int | None] | None = None  # synchronous: Step.round_applied

    def step(self, metrics, labels, steps_done=None, train_op=None) -> Step:
        """The Step of this update (`train_op`: the lever's own op that runs it, if not the update's; the run then
        counts its steps in that op, not in `counted`)."""
        own_op = train_op is None
        return Step(self.train_op if own_op else train_op, metrics, labels, steps_done, self.hooks,
                    self.chief_only_hooks, self.end_op, self.drops_next_push, self.counted if own_op else None,
                    self.round_applied)


def build(ctx: StepContext) -> Step:
    own = ctx.first.own_update
    if own is not None:  # a model_fn's own train_op: the update as written (training/graph.py checked the path)
        update_ = Update(own.train_op, (*own.hooks, v1.train.StopAtStepHook(last_step=ctx.train.train_steps)),
                         own.chief_hooks)
    else:
        update_ = make_train_op(ctx.first.loss, ctx.optimizer, ctx.global_step, ctx.cluster, ctx.train,
                                ctx.stop_requested)
    return update_.step(Metrics.of(ctx.first), ctx.first_labels)


def make_train_op(loss, optimizer, global_step, cluster, train, stop_requested=None, grads_and_vars=None) -> Update:
    """The update op, plus the hooks it needs on every worker and on the chief only.

    With train.sync_replicas, gradients go through SyncReplicasOptimizer (training/step/sync.py);
    `stop_requested()` ends a worker's wait for a round that is missing a peer's gradient.
    `grads_and_vars`: gradients computed already (--accumulate_batches), instead of the loss's.
    """
    hooks, chief_only_hooks, end_op, drops_next_push, round_applied = [], [], None, None, None
    if train.sync_replicas:
        optimizer = sync.wrap_optimizer(optimizer, cluster, train)
    train_op = update.apply_update(loss, optimizer, global_step, train.clip_gradient_norm,
                                   grads_and_vars=grads_and_vars)
    if train.sync_replicas:
        hooks, chief_only_hooks = sync.hooks(optimizer, train_op, cluster, train, stop_requested)
        # (both read after the sync hook's after_run)
        end_op, drops_next_push, round_applied = (hooks[0].close_token_queue, lambda: hooks[0].drops_next_push,
                                                  lambda: hooks[0].round_applied)
    hooks.append(v1.train.StopAtStepHook(last_step=train.train_steps))
    counted = None if train.sync_replicas else train_op  # apply_gradients' op is its assign_add to the global step
    return Update(train_op, tuple(hooks), tuple(chief_only_hooks), end_op, drops_next_push, counted, round_applied)
