"""A lever for a program's model_fn that makes its own update: the runtime takes the optimizer it built.

An Estimator program's model_fn ends with `optimizer.minimize(loss, global_step=...)`. Under a lever
(--local_steps, --steps_per_run given by PS_TRAINER_FLAGS: ps_trainer/estimator/settings.py) the runtime
calls the model_fn as the trainer calls its own models, once outside the lever's loop (it makes the
variables) and in each of its iterations, with tf.compat.v1.train.Optimizer's minimize recorded instead of
run: the call builds no op, and the lever (training/step/) makes the update with the optimizer and the loss it
was given, as it does with --optimizer's. So the program needs no edit. A model_fn that leaves the update to
the runtime (no train_op, as under `trainer.py --model_fn`) is trained the same way with PS_TRAINER_FLAGS's
--optimizer and --learning_rate, with a lever or on the single step path.

Several minimizes of one loss, each of a var_list of its own part (the canned wide & deep's Ftrl and Adagrad),
are one update in which each optimizer updates its part (optimizers.PartsOptimizer). TF 2.x's V2 canned classes
and heads update with a Keras optimizer: each records its update with take(), as a minimize of its own
(ps_trainer/estimator/keras_optimizers.TakenByALever).

What a lever cannot take is refused in one line, naming it: an update that is not of the whole model by
minimize (several optimizers of the same variables or of different losses, a var_list of some variables,
apply_gradients of gradients the model_fn computed, an optimizer of another kind), a SyncReplicasOptimizer
(--local_steps is asynchronous; with --sync_replicas --accumulate_batches the runtime makes the rounds with its
own), batch normalization's UPDATE_OPS (the update would leave them out), an input_fn that gives tensors rather
than a tf.data.Dataset (a lever reads several batches a run; numpy_input_fn's data is read as its Dataset).

The model_fn's summaries are left out under a lever (each would read a batch of its own when the summary
hook runs it, a batch no step trains); the step's loss is summarized instead.
"""

import contextlib
from typing import Callable, NamedTuple

import tensorflow as tf
from tensorflow.python.training import optimizer as optimizer_lib  # the class tf.compat.v1.train optimizers share

from ps_trainer import model
from ps_trainer.training import optimizers, plan, schedules
from ps_trainer.training.step import LEVERS, reader_and_getter
from ps_trainer.training.step.base import Step, StepContext

v1 = tf.compat.v1


class Minimized(NamedTuple):
    """One `minimize` the model_fn called."""
    optimizer: v1.train.Optimizer
    loss: tf.Tensor
    var_list: object


class Recorded(NamedTuple):
    minimized: list  # Minimized, in call order
    applied: list  # the class names of optimizers whose apply_gradients the model_fn called itself


class LeverRefusal(ValueError):
    """What a lever cannot take of a model_fn's update, in one line."""


@contextlib.contextmanager
def recording():
    """While it is open, tf.compat.v1.train.Optimizer's minimize and apply_gradients build nothing: each call is
    recorded, and returns a no-op in place of the update."""
    record = Recorded([], [])
    base = optimizer_lib.Optimizer
    minimize, apply_gradients = base.minimize, base.apply_gradients

    def record_minimize(self, loss, global_step=None, var_list=None, *args, **kwargs):
        del global_step, args, kwargs  # the lever counts the steps; gate and aggregation are the optimizer's
        record.minimized.append(Minimized(self, loss, var_list))
        return tf.no_op(name="minimize_taken_by_the_runtime")

    def record_apply(self, grads_and_vars, global_step=None, name=None):
        del grads_and_vars, global_step, name
        record.applied.append(type(self).__name__)
        return tf.no_op(name="apply_gradients_taken_by_the_runtime")

    record_minimize.taken_by_a_lever = True  # is_recording's mark
    record_minimize.record = record  # take()'s
    base.minimize, base.apply_gradients = record_minimize, record_apply
    try:
        yield record
    finally:
        base.minimize, base.apply_gradients = minimize, apply_gradients


def is_recording() -> bool:
    """A lever is recording the model_fn's update (recording() is open): an update of another kind records itself
    with take() (TF 2.x's Keras optimizers: ps_trainer/estimator/keras_optimizers.py), or refuses itself with
    LeverRefusal."""
    return getattr(optimizer_lib.Optimizer.minimize, "taken_by_a_lever", False)


def take(optimizer: v1.train.Optimizer, loss, var_list) -> tf.Operation:
    """While recording(): records an update of `loss` over var_list by `optimizer` as a minimize, and returns the
    no-op that stands for it."""
    optimizer_lib.Optimizer.minimize.record.minimized.append(Minimized(optimizer, loss, var_list))
    return tf.no_op(name="minimize_taken_by_the_runtime")


def _the_update(record: Recorded, spec, lever_flag: str, runtime_optimizer: bool, sync: bool,
                origin=lambda variable: variable) -> Minimized:
    """The update of the whole model the model_fn made: its one minimize, or its minimizes of one loss that each
    update a part of it (origin(variable): the variable a lever's copy stands for); runtime_optimizer: none, its
    loss the update's with the runtime's optimizer. Else LeverRefusal."""
    train_op = spec.train_op
    if runtime_optimizer:
        if record.minimized or record.applied or train_op is not None:
            raise LeverRefusal("PS_TRAINER_FLAGS --optimizer makes the update, and the model_fn makes its own (its "
                               "EstimatorSpec has a train_op): return the loss alone, or drop --optimizer")
        return Minimized(None, spec.loss, None)
    said = f"{lever_flag} makes the update with the optimizer the model_fn built"
    if not record.minimized and not record.applied and train_op is None:
        raise LeverRefusal(f"{lever_flag}: the model_fn leaves the update to the runtime (its EstimatorSpec has no "
                           "train_op): give PS_TRAINER_FLAGS --optimizer (and --learning_rate) too")
    if record.applied:
        raise LeverRefusal(f"{said}, but the model_fn applies gradients it computed itself "
                           f"({record.applied[0]}.apply_gradients): call the optimizer's minimize(loss), or train "
                           f"without {lever_flag}")
    if not record.minimized:
        kind = "" if train_op is None else ": its train_op was made otherwise (a Keras optimizer?)"
        raise LeverRefusal(f"{said}, but the model_fn called no tf.compat.v1.train optimizer's minimize{kind}; "
                           f"train without {lever_flag}")
    for taken in record.minimized:
        if isinstance(taken.optimizer, v1.train.SyncReplicasOptimizer):
            if sync:
                raise LeverRefusal(f"{lever_flag}: the runtime makes the synchronous rounds, and the "
                                   "model_fn's optimizer is a SyncReplicasOptimizer of its own: give its minimize the "
                                   "optimizer it wraps")
            raise LeverRefusal(f"{lever_flag} is for asynchronous training, and the model_fn's optimizer is a "
                               "SyncReplicasOptimizer: drop one of the two")
    taken = record.minimized[0] if len(record.minimized) == 1 else _parts(record.minimized, said, lever_flag, origin)
    if taken.var_list is not None:
        trainable = {variable.ref() for variable in v1.trainable_variables()}
        if not trainable <= {origin(variable).ref() for variable in taken.var_list}:
            raise LeverRefusal(f"{said}, of every trainable variable, and the model_fn's minimize names a var_list "
                               f"of {len(taken.var_list)} of the {len(trainable)}: train without {lever_flag}")
    return taken


def _parts(minimized: list, said: str, lever_flag: str, origin) -> Minimized:
    """Several minimizes of one loss, each of a var_list of its own (the canned wide & deep's, of its linear part
    and of its DNN), as one update of their var_lists (optimizers.PartsOptimizer), or LeverRefusal."""
    runs = (f"the model_fn's train_op runs {len(minimized)} "
            f"({', '.join(optimizers.named(taken.optimizer) for taken in minimized)})")
    if any(taken.loss is not minimized[0].loss for taken in minimized):
        raise LeverRefusal(f"{said}, of one loss, and {runs} of different losses: train without {lever_flag}")
    owned = [{origin(variable).ref() for variable in taken.var_list} if taken.var_list is not None else None
             for taken in minimized]
    if None in owned or sum(map(len, owned)) != len(set().union(*owned)):
        raise LeverRefusal(f"{said}, one per variable, and {runs} of the same variables: train without {lever_flag}")
    optimizer = optimizers.PartsOptimizer([(taken.optimizer, taken.var_list) for taken in minimized], origin)
    return Minimized(optimizer, minimized[0].loss, [variable for taken in minimized for variable in taken.var_list])


class Lever(NamedTuple):
    step: Step  # what the lever built
    spec: object  # the model_fn's EstimatorSpec of its first call: its hooks and scaffold
    said: str  # what makes the update, as the logs say it
    optimizer: v1.train.Optimizer  # the update's: the model_fn's, or the runtime's


def build(call_model_fn: Callable, next_batch: Callable, from_dataset: bool, global_step, cluster, train,
          runtime_optimizer: bool = False, graph_tables=None) -> Lever:
    """The step of the path train.step_path names, with the update the model_fn built (runtime_optimizer: with
    train.optimizer's, over the loss of a model_fn that leaves the update to the runtime).
    call_model_fn(features, labels) -> EstimatorSpec in TRAIN mode, its dynamic tables recorded in
    `graph_tables` (model/graph_tables.py), which the runtime's update is handed; next_batch() -> (features,
    labels) of the input_fn's next batch (from_dataset: a tf.data.Dataset's, made anew at each call; else the
    same tensors)."""
    path = train.step_path.name
    single = "sync_replicas" if train.sync_replicas and not runtime_optimizer else "optimizer"
    lever_flag = "PS_TRAINER_FLAGS --" + {plan.ROUNDS: plan.LOCAL_STEPS, plan.SINGLE: single}.get(path, path)
    if not from_dataset and path != plan.SINGLE:
        raise LeverRefusal(f"{lever_flag} reads several batches a session.run: the input_fn must return a "
                           "tf.data.Dataset, and this one returns tensors")
    lever = LEVERS[train.step_path.name]
    reader, getter = reader_and_getter(lever, cluster, train)
    summaries = list(v1.get_collection(v1.GraphKeys.SUMMARIES))
    specs = []

    def forward(batch=None):
        features, labels = batch or next_batch()
        with v1.variable_scope(v1.get_variable_scope(), custom_getter=getter, reuse=v1.AUTO_REUSE), \
                recording() as record:
            spec = call_model_fn(features, labels)
        taken = _the_update(record, spec, lever_flag, runtime_optimizer, train.sync_replicas,
                            getattr(reader, "origin", lambda variable: variable))
        specs.append((spec, taken))
        # The program's labels are its own: the runtime's not-learning check reads none.
        return model.ModelOutput(None, None, taken.loss, None, None, graph_tables=graph_tables), tf.zeros([0], tf.int64)

    first, no_labels = forward()
    if v1.get_collection(v1.GraphKeys.UPDATE_OPS):
        raise LeverRefusal(f"{lever_flag}: the model_fn has UPDATE_OPS (batch normalization's moving averages), "
                           "which the runtime's update would leave out: train without it")
    spec, taken = specs[0]
    if runtime_optimizer:
        optimizer = optimizers.make_optimizer(schedules.learning_rate(global_step, train), train, graph_tables)
        said = (f"PS_TRAINER_FLAGS --optimizer={train.optimizer} --learning_rate={train.learning_rate}: the runtime "
                "makes the update")
    else:
        optimizer = taken.optimizer
        said = f"the lever makes the update with the model_fn's {optimizers.named(optimizer)}"
    if path == plan.SINGLE and train.sync_replicas and not runtime_optimizer:
        said = f"{lever_flag}: {said}, in the runtime's synchronous rounds"
    elif path != plan.SINGLE:
        value = train.accumulate_batches if path == plan.ACCUMULATE else max(train.local_steps,
                                                                               train.step_path.steps_per_run)
        said = f"{lever_flag}={value}: {said}"
    built: Step = lever.build(StepContext(forward, first, no_labels, optimizer, global_step, cluster, train,
                                          reader, None, next_batch))
    if path != plan.SINGLE:  # the single step is the first forward pass: its summaries read the step's batch
        v1.get_collection_ref(v1.GraphKeys.SUMMARIES)[:] = summaries
    v1.summary.scalar("loss", built.metrics.loss)
    return Lever(built, spec, said, optimizer)
