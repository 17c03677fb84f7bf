"""--steps_per_run=K (asynchronous): up to K whole training steps in one session.run.

Each iteration is a whole step (next batch, forward, gradients, update, global step + 1): the
session's and the hooks' cost per run is paid once per K steps. The loop also ends at
--train_steps, so the last run stops there.
"""

import tensorflow as tf

from ps_trainer.training.step import single, update
from ps_trainer.training.step.base import Step, StepContext
from ps_trainer.training.step.loop import Iteration, Metrics, training_loop

reader = None  # the model reads the variables through the wire (training/step/wire.py)


def build(ctx: StepContext) -> Step:
    train = ctx.train
    # A single step's update, built first, makes the optimizer's slots, which a loop body cannot; its
    # hooks (StopAtStepHook) are the loop's.
    single_update = single.make_train_op(ctx.first.loss, ctx.optimizer, ctx.global_step, ctx.cluster, train)

    # The global step is carried from each update to the next check: a read in the loop's condition
    # could run before the previous iteration's increment and let the loop pass --train_steps.
    def keep_going(done, carried):
        step_reached, = carried
        return tf.logical_and(done < train.step_path.steps_per_run, step_reached < train.train_steps)

    def one_step(carried):
        del carried
        output, labels = ctx.forward()
        applied = update.apply_update(output.loss, ctx.optimizer, ctx.global_step, train.clip_gradient_norm,
                                      summaries=False)
        with tf.control_dependencies([applied]):
            step_reached = ctx.global_step.read_value()
        return Iteration([step_reached], Metrics.of(output), labels, applied)

    result = training_loop("steps_per_run", keep_going, one_step, ctx.figures,
                           carried=[ctx.global_step.read_value()], carried_shapes=[tf.TensorShape([])])
    return single_update.step(result.metrics, result.labels, result.done, train_op=result.done.op)
