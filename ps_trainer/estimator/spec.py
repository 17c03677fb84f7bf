"""What a model_fn returns (EstimatorSpec) and the modes it is called in (ModeKeys), as TF1 defined them."""

import collections

import tensorflow as tf


class ModeKeys:
    TRAIN = "train"
    EVAL = "eval"
    PREDICT = "infer"


TRAIN_NEEDS = "EstimatorSpec: mode TRAIN needs a loss and a train_op"
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
        for name, metric in (eval_metric_ops or {}).items():
            if not (isinstance(metric, tuple) and len(metric) == 2):
                raise TypeError(f"EstimatorSpec: eval_metric_ops[{name!r}] must be a (value, update_op) pair, as "
                                "tf.compat.v1.metrics returns")
        return super().__new__(cls, mode, predictions, loss, train_op, dict(eval_metric_ops or {}),
                               dict(export_outputs or {}), tuple(training_chief_hooks or ()),
                               tuple(training_hooks or ()), scaffold, tuple(evaluation_hooks or ()),
                               tuple(prediction_hooks or ()))
