"""The smaller names of TF's tf.estimator: the session hooks it re-exported from tf.compat.v1.train (TF 2.x code
spells them tf.estimator.SessionRunHook and so on), the parsing specs of the canned classes' tf.Example input
(`classifier_parse_example_spec`, `regressor_parse_example_spec`), and `add_metrics`."""

import inspect

import tensorflow as tf
from tensorflow.python.feature_column import feature_column_v2  # NumericColumn: the class of both spellings' columns

from ps_trainer.model import spec

# TF's tf.estimator.X for these was tf.compat.v1.train.X itself.
HOOKS = ("CheckpointSaverHook", "CheckpointSaverListener", "FeedFnHook", "FinalOpsHook", "GlobalStepWaiterHook",
         "LoggingTensorHook", "NanLossDuringTrainingError", "NanTensorHook", "ProfilerHook", "SecondOrStepTimer",
         "SessionRunArgs", "SessionRunContext", "SessionRunHook", "SessionRunValues", "StepCounterHook",
         "StopAtStepHook", "SummarySaverHook")
_METRIC_FN_ARGS = {"features", "labels", "predictions", "config"}


def _with_label_and_weight(parsing_spec: dict, label_key, label_spec, weight_column) -> dict:
    """The features' parsing spec with the label's and the weight's added, refused as TF refused them."""
    if label_key is None:
        raise ValueError("label_key must be given")
    if label_key in parsing_spec:
        raise ValueError(f"label should not be used as feature. label_key: {label_key}, features: "
                         f"{parsing_spec.keys()}")
    parsing_spec[label_key] = label_spec
    if weight_column is None:
        return parsing_spec
    if isinstance(weight_column, str):
        weight_column = tf.feature_column.numeric_column(weight_column)
    if not isinstance(weight_column, feature_column_v2.NumericColumn):
        raise ValueError("weight_column should be an instance of tf.feature_column.numeric_column. Given type: "
                         f"{type(weight_column)} value: {weight_column}")
    if weight_column.key in parsing_spec:
        raise ValueError(f"weight_column should not be used as feature. weight_column: {weight_column.key}, "
                         f"features: {parsing_spec.keys()}")
    parsing_spec.update(weight_column.parse_example_spec)
    return parsing_spec


def parse_example_specs(make_parse_example_spec):
    """(classifier_parse_example_spec, regressor_parse_example_spec) over `make_parse_example_spec` (the feature
    columns' own: tf.compat.v1.feature_column's for tf.compat.v1.estimator, v2's for tf.estimator)."""

    def classifier_parse_example_spec(feature_columns, label_key, label_dtype=tf.int64, label_default=None,
                                      weight_column=None):
        """The tf.io.parse_example spec of a classifier's features, its label (one value) and its weight."""
        return _with_label_and_weight(make_parse_example_spec(feature_columns), label_key,
                                      tf.io.FixedLenFeature((1,), label_dtype, label_default), weight_column)

    def regressor_parse_example_spec(feature_columns, label_key, label_dtype=tf.float32, label_default=None,
                                     label_dimension=1, weight_column=None):
        """The tf.io.parse_example spec of a regressor's features, its label (label_dimension values) and its
        weight."""
        return _with_label_and_weight(make_parse_example_spec(feature_columns), label_key,
                                      tf.io.FixedLenFeature((label_dimension,), label_dtype, label_default),
                                      weight_column)

    return classifier_parse_example_spec, regressor_parse_example_spec


def add_metrics(estimator, metric_fn):
    """TF's add_metrics: a new Estimator (same model_dir, config and warm start) whose evaluation also reports
    metric_fn's metrics, a dict of (value, update_op) pairs by name (one of the estimator's own of that name gives
    way). metric_fn takes any of predictions, features, labels and config."""
    from ps_trainer.estimator.estimator import Estimator  # noqa: PLC0415  (the package imports this module first)
    taken = list(inspect.signature(metric_fn).parameters)
    invalid = [name for name in taken if name not in _METRIC_FN_ARGS]
    if invalid:
        raise ValueError(f"metric_fn ({metric_fn}) has following not expected args: {invalid}")

    def model_fn(features, labels, mode, config):
        model = spec.call_model_fn(estimator.model_fn, features, labels, mode, estimator.params, config)
        if mode != spec.ModeKeys.EVAL:
            return model
        given = {"features": features, "labels": labels, "predictions": model.predictions, "config": config}
        added = metric_fn(**{name: given[name] for name in taken})
        # Made anew (not _replace), so that the added metrics are checked as a model_fn's are.
        return spec.EstimatorSpec(**{**model._asdict(), "eval_metric_ops": {**model.eval_metric_ops, **added}})

    return Estimator(model_fn, estimator.model_dir, estimator.config,
                     warm_start_from=estimator._warm_start)  # noqa: SLF001  (as TF's add_metrics copied it)
