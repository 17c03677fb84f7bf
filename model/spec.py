"""The one model contract: a model is a TF1 model_fn, `model_fn(features, labels, mode, params)`, that returns
an EstimatorSpec. The trainer's own models (model/mlp.py, cnn.py, wide_deep.py) are model_fns on it, a
user's `--model_fn` is one (model/user_fn.py), and `ps_trainer.estimator` runs Estimator programs' model_fns
with the same EstimatorSpec and ModeKeys, TF1's, field for field.

A model_fn that leaves the update to the runtime returns, in TRAIN mode, a loss and no train_op; its
`predictions` are the logits, [batch, classes], or a dict holding them under "logits". The runtime then
trains that loss with its own optimizer and levers (--local_steps, --accumulate_batches, --sync_replicas),
and judges held-out data, exports and serves by the logits.
"""

import collections
import inspect
from typing import NamedTuple

import tensorflow as tf

v1 = tf.compat.v1


class ModeKeys:
    TRAIN = "train"
    EVAL = "eval"
    PREDICT = "infer"


TRAIN_NEEDS = "EstimatorSpec: mode TRAIN needs a loss and a train_op"
# What a model_fn may take besides `features`, as TF1's Estimator offered them.
MODEL_FN_ARGUMENTS = ("labels", "mode", "params", "config")


def takes(function, argument: str) -> bool:
    """Whether a model_fn (or an input_fn) takes an argument of that name."""
    return argument in inspect.signature(function).parameters


def call_model_fn(model_fn, features, labels, mode: str, params, config):
    """model_fn(features=features, ...) with each of labels, mode, params and config that it takes: the one
    place the trainer (model/user_fn.py) and an Estimator program call a model_fn."""
    offered = dict(zip(MODEL_FN_ARGUMENTS, (labels, mode, params, config)))
    return model_fn(features=features, **{name: value for name, value in offered.items() if takes(model_fn, name)})
_FIELDS = ("mode", "predictions", "loss", "train_op", "eval_metric_ops", "export_outputs", "training_chief_hooks",
           "training_hooks", "scaffold", "evaluation_hooks", "prediction_hooks")


class EstimatorSpec(collections.namedtuple("EstimatorSpec", _FIELDS)):
    """TF1's EstimatorSpec, field for field and in TF1's order (positional arguments mean what they meant);
    checked as TF1 checked it: TRAIN needs a loss, EVAL a loss, PREDICT predictions. TF1 refused a TRAIN
    spec without a train_op here; Estimator.train refuses it, in the same words, and `trainer.py
    --model_fn` takes it as the model_fn leaving the update to the runtime (model/user_fn.py)."""

    def __new__(cls, mode, predictions=None, loss=None, train_op=None, eval_metric_ops=None, export_outputs=None,
                training_chief_hooks=None, training_hooks=None, scaffold=None, evaluation_hooks=None,
                prediction_hooks=None):
        if mode not in (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT):
            raise ValueError(f"EstimatorSpec: mode {mode!r} is not one of ModeKeys.TRAIN, EVAL, PREDICT")
        if mode == ModeKeys.TRAIN and loss is None:
            raise ValueError(TRAIN_NEEDS)
        if mode == ModeKeys.EVAL and loss is None:
            raise ValueError("EstimatorSpec: mode EVAL needs a loss")
        if mode == ModeKeys.PREDICT and predictions is None:
            raise ValueError("EstimatorSpec: mode PREDICT needs predictions")
        if loss is not None and tf.convert_to_tensor(loss).shape.rank not in (None, 0):
            raise ValueError(f"EstimatorSpec: the loss must be a scalar, not of shape {loss.shape}")
        eval_metric_ops = {name: _metric_pair(name, metric) for name, metric in (eval_metric_ops or {}).items()}
        return super().__new__(cls, mode, predictions, loss, train_op, eval_metric_ops,
                               dict(export_outputs or {}), tuple(training_chief_hooks or ()),
                               tuple(training_hooks or ()), scaffold, tuple(evaluation_hooks or ()),
                               tuple(prediction_hooks or ()))


def _metric_pair(name: str, metric) -> tuple:
    """An eval_metric_ops value as the (value, update_op) pair tf.compat.v1.metrics returns. A Keras metric object
    (TF 2.x's EstimatorSpec took them) whose update_state the model_fn called gives its result and its update; its
    variables go into the LOCAL_VARIABLES collection, so that each evaluation starts them at zero, and
    METRIC_VARIABLES, as TF 2.x's did."""
    if isinstance(metric, tuple) and len(metric) == 2:
        return metric
    if not (callable(getattr(metric, "update_state", None)) and callable(getattr(metric, "result", None))):
        raise TypeError(f"EstimatorSpec: eval_metric_ops[{name!r}] must be a (value, update_op) pair, as "
                        "tf.compat.v1.metrics returns, or a Keras metric object")
    updates = list(getattr(metric, "updates", ()))  # tf-keras records each update_state's op in graph mode
    if not updates:
        raise ValueError(f'Please call update_state(...) on the "{metric.name}" metric')
    for collection in (tf.compat.v1.GraphKeys.LOCAL_VARIABLES, tf.compat.v1.GraphKeys.METRIC_VARIABLES):
        held = {id(variable) for variable in tf.compat.v1.get_collection(collection)}
        for variable in metric.variables:
            if id(variable) not in held:
                tf.compat.v1.add_to_collection(collection, variable)
    return metric.result(), updates[0]


class OwnUpdate(NamedTuple):
    """A model_fn's own update, which the runtime runs as written: its EstimatorSpec's train_op and the hooks
    of its training."""
    train_op: object
    hooks: tuple = ()
    chief_hooks: tuple = ()


def own_update(model_spec) -> OwnUpdate | None:
    """The update a model_fn's TRAIN spec makes itself, or None: it leaves the update to the runtime."""
    if getattr(model_spec, "train_op", None) is None:
        return None
    return OwnUpdate(model_spec.train_op, tuple(getattr(model_spec, "training_hooks", ()) or ()),
                     tuple(getattr(model_spec, "training_chief_hooks", ()) or ()))


class Params(NamedTuple):
    """What the trainer gives one of its own models' model_fns as `params`."""
    model_cfg: object  # model.ModelConfig
    data_spec: object  # input.DataSpec: the features' names, dtypes and shapes, and the classes
    graph_tables: object  # model/graph_tables.GraphTables: where the model's embedding tables are recorded


def classifier(logits):
    """The model_fn of one of the trainer's own classifiers, from its forward pass
    `logits(features, model_cfg, data_spec, training)` (and `graph_tables=`, params.graph_tables, if it takes
    it: a model with embedding tables records them there), built inside the model's variable scope (its name,
    which its checkpoints' variables carry). Its predictions are the logits and, given labels, its loss is
    the mean cross-entropy: 0 for an empty batch, with no gradient (a sync worker with nothing to read in a
    round sends one, input/work_queue.py: a share that adds nothing)."""

    def model_fn(features, labels, mode: str, params: Params) -> EstimatorSpec:
        tables = {"graph_tables": params.graph_tables} if takes(logits, "graph_tables") else {}
        with v1.variable_scope(params.model_cfg.name):
            logits_ = logits(features, params.model_cfg, params.data_spec, mode == ModeKeys.TRAIN, **tables)
        loss = None
        if labels is not None:
            count = tf.cast(tf.size(labels), tf.float32)
            losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits_)
            loss = tf.math.divide_no_nan(tf.reduce_sum(losses), count, name="cross_entropy")
        return EstimatorSpec(mode, predictions={"logits": logits_}, loss=loss)

    return model_fn


def logits_of(spec: EstimatorSpec) -> tf.Tensor:
    """The logits a spec on the contract predicts."""
    predictions = spec.predictions
    return predictions["logits"] if isinstance(predictions, dict) else predictions
