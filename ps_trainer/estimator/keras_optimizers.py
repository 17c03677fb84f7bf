"""TF 2.x's Keras optimizers in an Estimator's graph, as tensorflow-estimator 2.15 used them: by name or
instance (tf_keras.optimizers.legacy), each updating through `get_updates` in the `training` name scope at the
graph's top, so that its slots are `training/<Optimizer>/<variable>/<slot>` and its hyper-parameters
`training/<Optimizer>/<name>`. TF 2.x's V2 canned classes (canned_v2.py) and heads (heads.py) update so."""

import contextlib
import re

import tensorflow as tf

from ps_trainer.training.step import taken

v1 = tf.compat.v1
OPTIMIZERS = ("Adagrad", "Adam", "Ftrl", "RMSProp", "SGD")  # names of tf_keras.optimizers.legacy classes
_CLASS_OF_NAME = {"RMSProp": "RMSprop"}


def get_optimizer_instance_v2(optimizer, learning_rate=None):
    """An optimizer as the V2 classes take one (TF 2.x's canned/optimizers.get_optimizer_instance_v2): a name
    (with `learning_rate`, or the optimizer's own default), a tf_keras.optimizers.legacy instance, or a callable
    that returns one."""
    # tf_keras loads only for a V2 class's training: programs of V1 classes and model_fns do not pay its import.
    import tf_keras  # noqa: PLC0415
    legacy = tf_keras.optimizers.legacy
    if isinstance(optimizer, str):
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"Unsupported optimizer name: {optimizer}. Supported names are: {OPTIMIZERS}")
        make = getattr(legacy, _CLASS_OF_NAME.get(optimizer, optimizer))
        return make(learning_rate=learning_rate) if learning_rate else make()
    if callable(optimizer) and not isinstance(optimizer, tf_keras.optimizers.Optimizer | legacy.Optimizer):
        optimizer = optimizer()
    if isinstance(optimizer, legacy.Optimizer):
        return optimizer
    if isinstance(optimizer, tf_keras.optimizers.Optimizer):
        raise ValueError("Please set your optimizer as an instance of `tf.keras.optimizers.legacy.Optimizer`, e.g., "
                         f"`tf.keras.optimizers.legacy.{type(optimizer).__name__}`. Received optimizer type: "
                         f"{type(optimizer)}.")
    hint = (": a tf.compat.v1.train optimizer goes with TF1's V1 classes, tf.compat.v1.estimator.<Canned>"
            if isinstance(optimizer, v1.train.Optimizer) else "")
    raise ValueError(f"The given object is not a tf.keras.optimizers.Optimizer instance. Given: {optimizer}{hint}")


@contextlib.contextmanager
def training_scope():
    """The `training` name scope at the graph's top, where TF 2.x's heads built their train op (or the one open:
    a V2 class's update inside its head's)."""
    graph = v1.get_default_graph()
    if re.fullmatch(r"training(_\d+)?", graph.get_name_scope()):
        yield
        return
    with graph.name_scope(None), v1.name_scope("training"):
        yield


class TakenByALever(v1.train.Optimizer):
    """A Keras optimizer as a lever takes the update of a model_fn (training/step/taken.py): TF1's
    compute_gradients, then the Keras optimizer's own apply_gradients in the `training` name scope its update
    would have had, so that its slots and hyper-parameters keep the V2 class's names
    (`training/Adagrad/<variable>/accumulator`; those of a lever's worker-side copies are the worker's own). The
    lever counts the global step: the optimizer that the V2 class (or the model_fn) made step it as its
    `iterations` (`counts_global_step`) counts this worker's updates instead, in a local variable beside the first
    it updates (`training/Adagrad_updates_here`: never saved); another keeps its own (`training/Ftrl/iter`)."""

    def __init__(self, keras_optimizer, counts_global_step: bool):
        super().__init__(use_locking=False, name=keras_optimizer._name)  # noqa: SLF001  (Keras's name of its scope)
        step = v1.train.get_global_step()
        if step is not None and keras_optimizer._iterations is step:  # noqa: SLF001  (set, not yet used: unset)
            keras_optimizer._iterations = None  # noqa: SLF001
            counts_global_step = True
        self._keras, self._counts_global_step = keras_optimizer, counts_global_step
        # The `training` scope the model_fn's own update would have been built in (a MultiHead's: `training_<n>`).
        scope = v1.get_default_graph().get_name_scope()
        self._scope = scope if re.fullmatch(r"training(_\d+)?", scope) else "training"

    def __str__(self):
        return type(self._keras).__name__

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        pairs = [(grad, variable) for grad, variable in grads_and_vars if grad is not None]
        graph = v1.get_default_graph()
        # That scope itself, re-entered (the model_fn's head opened it as the lever called the model_fn).
        with graph.name_scope(None), graph.name_scope(self._scope + "/"):
            if self._counts_global_step and self._keras._iterations is None:  # noqa: SLF001  (not made yet)
                with v1.colocate_with(pairs[0][1]):  # beside its scope: Keras's own name_scope opens it next
                    self._keras.iterations = v1.Variable(0, dtype=tf.int64, trainable=False,
                                                         name=f"{self._name}_updates_here",
                                                         collections=[v1.GraphKeys.LOCAL_VARIABLES])
            update = self._keras.apply_gradients(pairs)
        self._slots_of_local_variables_stay_local([variable for _, variable in pairs])
        if global_step is None:
            return update
        with tf.control_dependencies([update]), v1.colocate_with(global_step):
            return v1.assign_add(global_step, 1, name=name).op

    def _slots_of_local_variables_stay_local(self, variables) -> None:
        """Keras makes each slot a global variable: that of a local variable (a lever's worker-side copy) is moved to
        the local ones, as TF1's optimizers make it (each worker's own, initialized by its own session, never
        saved; a global variable on a worker would wait for the chief to initialize it)."""
        local = {variable.ref() for variable in v1.local_variables()}
        slots = {slot.ref() for variable in variables if variable.ref() in local
                 for name in self.get_slot_names() if (slot := self.get_slot(variable, name)) is not None}
        global_variables = v1.get_collection_ref(v1.GraphKeys.GLOBAL_VARIABLES)
        moved = [variable for variable in global_variables if variable.ref() in slots]
        global_variables[:] = [variable for variable in global_variables if variable.ref() not in slots]
        for slot in moved:
            v1.add_to_collection(v1.GraphKeys.LOCAL_VARIABLES, slot)

    def get_slot(self, var, name):
        try:
            return self._keras.get_slot(var, name)
        except KeyError:
            return None

    def get_slot_names(self):
        return self._keras.get_slot_names()


def updates(loss, parts):
    """The train op of (Keras optimizer, variables) parts, as TF 2.x's V2 canned classes made it: the first
    optimizer's `iterations` is the global step, which its update steps; a second counts its own
    (`training/Ftrl/iter`). Under a lever, each part is recorded for the lever's update (TakenByALever)."""
    parts = [(optimizer, variables) for optimizer, variables in parts if variables]
    if taken.is_recording():
        return tf.group(*(taken.take(TakenByALever(optimizer, index == 0), loss, list(variables))
                          for index, (optimizer, variables) in enumerate(parts)))
    parts[0][0].iterations = v1.train.get_or_create_global_step()
    with training_scope():
        return tf.group(*(update for optimizer, variables in parts
                          for update in optimizer.get_updates(loss, variables)))
