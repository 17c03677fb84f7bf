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


def refuse_under_a_lever() -> None:
    if taken.is_recording():
        raise taken.LeverRefusal("PS_TRAINER_FLAGS's lever makes the update with the tf.compat.v1.train optimizer a "
                                 "model_fn builds, and TF 2.x's V2 canned classes and heads update with a Keras "
                                 "optimizer: train without the lever, or with TF1's V1 class "
                                 "(tf.compat.v1.estimator.<Canned>) or a tf.compat.v1.train optimizer")


def updates(loss, parts):
    """The train op of (Keras optimizer, variables) parts, as TF 2.x's V2 canned classes made it: the first
    optimizer's `iterations` is the global step, which its update steps; a second counts its own
    (`training/Ftrl/iter`)."""
    refuse_under_a_lever()
    parts = [(optimizer, variables) for optimizer, variables in parts if variables]
    parts[0][0].iterations = v1.train.get_or_create_global_step()
    with training_scope():
        return tf.group(*(update for optimizer, variables in parts
                          for update in optimizer.get_updates(loss, variables)))
