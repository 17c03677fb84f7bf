"""The heads: what a model_fn makes of its logits (the loss, the predictions, the eval metrics, the export
outputs and the train op). `Head` serves TF1's V1 canned classes (the loss summed over the batch), TF 2.x's V2
canned classes, and TF 2.x's public heads, `tf.estimator.BinaryClassHead`, `MultiClassHead`, `MultiLabelHead`,
`RegressionHead`, `LogisticRegressionHead` and `PoissonRegressionHead`, with TF 2.15's arguments, prediction
keys, metric keys (`<key>/<name>` for a named head) and export signatures. A program hands a head to `DNNEstimator`,
`LinearEstimator` or `DNNLinearCombinedEstimator`, or calls it in its own model_fn:
`head.create_estimator_spec(features, mode, logits, labels, optimizer=..., trainable_variables=...)`, or with
a `train_op_fn`."""

import inspect

import tensorflow as tf
from tensorflow.python.saved_model.model_utils import export_output  # TF's own ExportOutput classes

from ps_trainer.estimator import keras_optimizers
from ps_trainer.model.spec import EstimatorSpec, ModeKeys
from ps_trainer.training.step import taken

v1 = tf.compat.v1
# Keras's loss reductions, as the V2 heads take them, and the tf.compat.v1.losses reduction that computes each.
REDUCTIONS = {"sum_over_batch_size": v1.losses.Reduction.SUM_OVER_BATCH_SIZE, "sum": v1.losses.Reduction.SUM,
              "auto": v1.losses.Reduction.SUM_OVER_BATCH_SIZE}
SUM_OVER_BATCH_SIZE = "sum_over_batch_size"
KERAS_AUC = "careful_interpolation"  # v1.metrics.auc's summation that Keras's AUC, the V2 heads' metric, computes
_LOSS_FN_ARGUMENTS = {"labels", "logits", "features", "loss_reduction"}


def v1_reduction_of(loss_reduction: str):
    """The tf.compat.v1.losses reduction that computes Keras's `loss_reduction`, as the V2 heads and classes take
    it; NONE and unknown names refused in TF 2.15's words."""
    if loss_reduction not in REDUCTIONS:
        raise ValueError(f"Invalid loss_reduction: {loss_reduction}. If you need to use NONE reduction, you may use "
                         "a custom head and write your own model_fn; the V2 heads take "
                         f"{', '.join(sorted(REDUCTIONS))}")
    return REDUCTIONS[loss_reduction]


class Head:
    """The loss (a tf.compat.v1.losses.Reduction of the batch's: TF1's default sums it), the predictions, the eval
    metrics and the export outputs, from logits and labels: a classifier's (`n_classes`) or a regression's
    (`label_dimension`). `auc_summation`: v1.metrics.auc's summation_method (the V2 heads' Keras AUC
    interpolates). `loss_fn(labels, logits[, features])`: the unreduced loss in place of the head's own;
    `inverse_link_fn`: a regression's predictions from its logits; `thresholds`: a binary classifier's extra
    accuracy, precision and recall, each at `logistic > threshold`."""

    _training_scope = False  # TF 2.x's public heads build the train op in the `training` name scope

    def __init__(self, n_classes=None, label_dimension=None, weight_column=None, label_vocabulary=None,
                 loss_reduction=v1.losses.Reduction.SUM, auc_summation="trapezoidal", name=None, loss_fn=None,
                 inverse_link_fn=None, thresholds=()):
        self.n_classes, self.label_dimension = n_classes, label_dimension
        self.weight_column, self.label_vocabulary, self._reduction = weight_column, label_vocabulary, loss_reduction
        self.auc_summation, self._name, self._loss_fn = auc_summation, name, loss_fn
        self._inverse_link_fn, self._thresholds = inverse_link_fn, tuple(thresholds or ())
        if n_classes is not None and n_classes < 2:
            raise ValueError(f"n_classes must be at least 2, not {n_classes}")
        if label_vocabulary is not None and len(label_vocabulary) != n_classes:
            raise ValueError(f"label_vocabulary has {len(label_vocabulary)} entries where n_classes is {n_classes}")
        if any(not 0.0 < threshold < 1.0 for threshold in self._thresholds):
            raise ValueError(f"thresholds not in (0, 1): {self._thresholds}.")
        if loss_fn is not None:
            arguments = set(inspect.signature(loss_fn).parameters)
            for required in ("labels", "logits"):
                if required not in arguments:
                    raise ValueError(f"loss_fn must contain argument: {required}. Given arguments: {sorted(arguments)}")
            if arguments - _LOSS_FN_ARGUMENTS:
                raise ValueError(f"loss_fn has unexpected args: {sorted(arguments - _LOSS_FN_ARGUMENTS)}")

    @property
    def logits_dimension(self) -> int:
        if self.n_classes is None:
            return self.label_dimension
        return 1 if self.n_classes == 2 else self.n_classes

    def _key(self, key: str) -> str:
        return f"{key}/{self._name}" if self._name else key

    def create_estimator_spec(self, features, mode, logits, labels=None, optimizer=None, trainable_variables=None,
                              train_op_fn=None, update_ops=None, regularization_losses=None) -> EstimatorSpec:
        """TF's heads' EstimatorSpec. In TRAIN, the train op is `optimizer`'s update of `trainable_variables` (a
        tf.compat.v1.train optimizer's minimize, which steps the global step; a Keras optimizer's get_updates) or
        `train_op_fn(loss)`, grouped with `update_ops`; `regularization_losses` are added to the loss."""
        predictions, outputs = self.outputs(logits)
        if mode == ModeKeys.PREDICT:
            return EstimatorSpec(mode, predictions=predictions, export_outputs=outputs)
        if mode == ModeKeys.EVAL:
            unreduced, metrics = self.eval_metrics(features, logits, labels, predictions)
            if regularization_losses is not None:
                metrics[self._key("regularization_loss")] = v1.metrics.mean(tf.add_n(list(regularization_losses)))
        else:  # a training graph builds no metric: TF's heads built none there
            unreduced, _ = self._unreduced_loss(features, logits, labels)
        loss = self._reduced(unreduced, self._weights(features), regularization_losses)
        if mode == ModeKeys.EVAL:
            return EstimatorSpec(mode, predictions=predictions, loss=loss, eval_metric_ops=metrics)
        if self._training_scope:
            with keras_optimizers.training_scope():
                train_op = _train_op(loss, optimizer, trainable_variables, train_op_fn, update_ops)
        else:
            train_op = _train_op(loss, optimizer, trainable_variables, train_op_fn, update_ops)
        return EstimatorSpec(mode, predictions=predictions, loss=loss, train_op=train_op)

    def loss(self, labels, logits, features=None, mode=None, regularization_losses=None):
        """The training loss, reduced, with `regularization_losses` added."""
        unreduced, _ = self._unreduced_loss(features or {}, logits, labels)
        return self._reduced(unreduced, self._weights(features or {}), regularization_losses)

    def predictions(self, logits, keys=None) -> dict:
        """The predictions by key (all of them, or those of `keys`)."""
        predictions, _ = self.outputs(logits)
        if not keys:
            return predictions
        unknown = [key for key in keys if key not in predictions]
        if unknown:
            raise ValueError(f"Prediction key must be in PredictionKeys, given: {unknown}. Valid prediction keys "
                             f"include {list(predictions)}.")
        return {key: predictions[key] for key in keys}

    def _reduced(self, unreduced, weights, regularization_losses):
        loss = v1.losses.compute_weighted_loss(unreduced, weights=weights, reduction=self._reduction)
        if regularization_losses is not None:
            loss += tf.add_n(list(regularization_losses))
        return loss

    def _weights(self, features):
        if self.weight_column is None:
            return 1.0
        key = self.weight_column if isinstance(self.weight_column, str) else self.weight_column.key
        return tf.reshape(tf.cast(features[key], tf.float32), [-1, 1])

    def _class_ids(self, labels):
        labels = labels.values if isinstance(labels, tf.SparseTensor) else labels
        labels = tf.reshape(labels, [-1, 1])
        if self.label_vocabulary is not None:
            labels = self._vocabulary_ids(labels)
        return tf.cast(labels, tf.int64)

    def _vocabulary_ids(self, names):
        """Class names' ids in label_vocabulary (-1 for a name not in it)."""
        table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
            list(self.label_vocabulary), list(range(self.n_classes)), tf.string, tf.int64), -1)
        return table.lookup(names)

    def _call_loss_fn(self, labels, logits, features):
        """loss_fn's unreduced loss, given the arguments it names."""
        offered = {"labels": labels, "logits": logits, "features": features}
        taken = inspect.signature(self._loss_fn).parameters
        return self._loss_fn(**{name: value for name, value in offered.items() if name in taken})

    def _unreduced_loss(self, features, logits, labels):
        """The loss of each example, [batch, 1] (a regression's [batch, label_dimension]), and the labels as the
        loss took them: class ids (floats for a binary classifier) or a regression's float targets."""
        if labels is None:
            raise ValueError("a head needs labels to train and evaluate: the input_fn gave none")
        if isinstance(labels, dict):
            raise ValueError("a head's labels are one tensor, not a dict")
        logits = tf.convert_to_tensor(logits, tf.float32)
        if self.n_classes is None:
            labels = tf.reshape(tf.cast(labels, tf.float32), [-1, self.label_dimension])
        else:
            labels = self._class_ids(labels)
            if self.n_classes == 2:
                labels = tf.cast(labels, tf.float32)
        if self._loss_fn is not None:
            return self._call_loss_fn(labels, logits, features), labels
        if self.n_classes is None:
            return tf.math.squared_difference(logits, labels), labels
        if self.n_classes == 2:
            return tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits), labels
        return tf.expand_dims(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.squeeze(labels, 1),
                                                                             logits=logits), 1), labels

    def outputs(self, logits):
        """(the predictions by key, the export outputs by signature name)."""
        logits = tf.convert_to_tensor(logits, tf.float32)
        if self.n_classes is None:
            if self._inverse_link_fn is not None:
                predictions = {"predictions": self._inverse_link_fn(logits), "logits": logits}
            else:
                predictions = {"predictions": logits}
            value = predictions["predictions"]
            regression = export_output.RegressionOutput(value=value) if self.label_dimension == 1 else None
            outputs = {"predict": export_output.PredictOutput(predictions)}
            if regression is not None:
                outputs.update({"serving_default": regression, "regression": regression})
            else:
                outputs["serving_default"] = outputs["predict"]
            return predictions, outputs
        if self.n_classes == 2:
            logistic = tf.sigmoid(logits)
            probabilities = tf.concat([1 - logistic, logistic], axis=1)
            class_ids = tf.cast(tf.greater(logits, 0), tf.int64)
        else:
            probabilities = tf.nn.softmax(logits)
            class_ids = tf.expand_dims(tf.argmax(logits, axis=1), 1)
        names = self._class_names()
        classes = tf.gather(names, class_ids)
        all_classes = tf.tile(tf.expand_dims(names, 0), [tf.shape(logits)[0], 1])
        predictions = {"logits": logits, "probabilities": probabilities, "class_ids": class_ids, "classes": classes,
                       "all_class_ids": tf.tile(tf.expand_dims(tf.range(self.n_classes), 0),
                                                [tf.shape(logits)[0], 1]),
                       "all_classes": all_classes}
        if self.n_classes == 2:
            predictions["logistic"] = logistic
        classification = export_output.ClassificationOutput(scores=probabilities, classes=all_classes)
        outputs = {"serving_default": classification, "classification": classification,
                   "predict": export_output.PredictOutput(predictions)}
        if self.n_classes == 2:
            outputs["regression"] = export_output.RegressionOutput(value=logistic)
        return predictions, outputs

    def _class_names(self):
        """Each class's name: its label_vocabulary entry, or its id as a string."""
        if self.label_vocabulary is not None:
            return tf.constant(list(self.label_vocabulary))
        return tf.strings.as_string(tf.range(self.n_classes))

    def eval_metrics(self, features, logits, labels, predictions) -> tuple:
        """(the loss of each example, the eval metrics by key)."""
        unreduced, labels = self._unreduced_loss(features, logits, labels)
        return unreduced, self._metrics(labels, unreduced, self._weights(features), predictions)

    def _metrics(self, labels, unreduced, weights, predictions) -> dict:
        """The eval metrics by key, of the labels as the loss took them."""
        key = self._key
        metrics = {key("average_loss"): v1.metrics.mean(unreduced, weights=weights)}
        if self.n_classes is None:
            return {**metrics, key("label/mean"): v1.metrics.mean(labels, weights=weights),
                    key("prediction/mean"): v1.metrics.mean(predictions["predictions"], weights=weights)}
        class_ids = tf.cast(labels, tf.int64)
        metrics[key("accuracy")] = v1.metrics.accuracy(class_ids, predictions["class_ids"], weights=weights)
        if self.n_classes > 2:
            return metrics
        logistic = predictions["logistic"]
        label_mean = v1.metrics.mean(labels, weights=weights)
        metrics.update({
            key("label/mean"): label_mean,
            key("prediction/mean"): v1.metrics.mean(logistic, weights=weights),
            key("accuracy_baseline"): (tf.maximum(label_mean[0], 1 - label_mean[0]), label_mean[1]),
            **self._aucs("", labels, logistic, weights),
            key("precision"): v1.metrics.precision(class_ids, predictions["class_ids"], weights=weights),
            key("recall"): v1.metrics.recall(class_ids, predictions["class_ids"], weights=weights),
            **self._threshold_metrics(class_ids, logistic, weights)})
        return metrics

    def _aucs(self, suffix, labels, scores, weights) -> dict:
        """The ROC and PR curves' AUCs (`auc<suffix>`, `auc_precision_recall<suffix>`) of scores in [0, 1] over
        every label given."""
        return {self._key(f"{name}{suffix}"): v1.metrics.auc(labels, scores, weights=weights, curve=curve,
                                                             num_thresholds=200, summation_method=self.auc_summation)
                for name, curve in (("auc", "ROC"), ("auc_precision_recall", "PR"))}

    def _threshold_metrics(self, labels, scores, weights) -> dict:
        """Each of `thresholds`' accuracy, precision and recall, a score above it taken for positive."""
        labels, metrics = tf.cast(labels, tf.int64), {}
        for threshold in self._thresholds:
            above = tf.cast(tf.greater(scores, threshold), tf.int64)
            metrics[self._key(f"accuracy/positive_threshold_{threshold:g}")] = v1.metrics.accuracy(
                labels, above, weights=weights)
            for name, metric in (("precision", v1.metrics.precision_at_thresholds),
                                 ("recall", v1.metrics.recall_at_thresholds)):
                value, update = metric(tf.cast(labels, tf.bool), scores, [threshold], weights=weights)
                metrics[self._key(f"{name}/positive_threshold_{threshold:g}")] = (value[0], update[0])
        return metrics


def _train_op(loss, optimizer, trainable_variables, train_op_fn, update_ops):
    if optimizer is not None and train_op_fn is not None:
        raise ValueError("train_op_fn and optimizer cannot both be set.")
    if optimizer is None and train_op_fn is None:
        raise ValueError("train_op_fn and optimizer cannot both be None.")
    if optimizer is None:
        train_op = train_op_fn(loss)
    elif isinstance(optimizer, v1.train.Optimizer):  # TF1's heads: minimize, which steps the global step
        train_op = optimizer.minimize(loss, global_step=v1.train.get_global_step(), var_list=trainable_variables)
    else:  # TF 2.x's: a Keras optimizer, whose `iterations` the model_fn may have made the global step
        optimizer = keras_optimizers.get_optimizer_instance_v2(optimizer)
        if not isinstance(trainable_variables, list | tuple):
            raise ValueError("trainable_variables should be a list or a tuple. Given type: "
                             f"{type(trainable_variables)}.")
        if taken.is_recording():  # a lever makes the update with it, stepping the global step itself
            train_op = taken.take(keras_optimizers.TakenByALever(optimizer, False), loss, list(trainable_variables))
        else:
            train_op = optimizer.get_updates(loss, list(trainable_variables))[0]
    if update_ops:
        train_op = tf.group(train_op, *update_ops)
    return train_op


class _V2Head(Head):
    """TF 2.x's head interface: `name`, `logits_dimension`, `loss_reduction` (Keras's), `loss`, `predictions`,
    `metrics` and `update_metrics` (TF 2.15's eval metrics as Keras metric objects, for a model_fn that evaluates
    with them; create_estimator_spec's are the same figures) and `create_estimator_spec`, whose train op is built
    in the `training` name scope."""

    _training_scope = True

    def __init__(self, loss_reduction, name, **head):
        self._keras_reduction = loss_reduction
        super().__init__(loss_reduction=v1_reduction_of(loss_reduction), auc_summation=KERAS_AUC, name=name, **head)

    @property
    def name(self):
        return self._name

    @property
    def loss_reduction(self):
        return self._keras_reduction

    def metrics(self, regularization_losses=None) -> dict:
        """The eval metrics by key, each a Keras metric object (tf_keras's) that update_metrics updates."""
        import tf_keras  # noqa: PLC0415  (Keras 2 loads only for a program that asks for Keras metric objects)
        keras = tf_keras.metrics
        with v1.name_scope("metrics"):
            found = {"average_loss": keras.Mean(name="average_loss"), **self._keras_metrics(tf_keras)}
            found.update(self._keras_threshold_metrics(keras))
            if regularization_losses is not None:
                found["regularization_loss"] = keras.Mean(name="regularization_loss")
        return {self._key(key): metric for key, metric in found.items()}

    def _keras_metrics(self, tf_keras) -> dict:
        keras = tf_keras.metrics
        if self.n_classes is None:
            return {"prediction/mean": keras.Mean(name="prediction/mean"), "label/mean": keras.Mean(name="label/mean")}
        found = {"accuracy": keras.Accuracy(name="accuracy")}
        if self.n_classes == 2:
            found.update({"precision": keras.Precision(name="precision"), "recall": keras.Recall(name="recall"),
                          "prediction/mean": keras.Mean(name="prediction/mean"),
                          "label/mean": keras.Mean(name="label/mean"), **self._keras_aucs(keras, "")})
            found["accuracy_baseline"] = _accuracy_baseline_class(tf_keras)(found["label/mean"])
        return found

    def update_metrics(self, eval_metrics, features, logits, labels, mode=None, regularization_losses=None) -> dict:
        """eval_metrics (metrics()'s) updated with the batch; returns them."""
        del mode  # the same in every mode, as TF 2.15's
        unreduced, taken = self._unreduced_loss(features, logits, labels)
        weights, predictions = self._weights(features), self.outputs(logits)[0]
        metric = {key: eval_metrics[self._key(key)] for key in self._plain_keys(eval_metrics)}
        metric["average_loss"].update_state(unreduced, sample_weight=_or_none(weights))
        self._update_keras(metric, taken, weights, predictions)
        if regularization_losses is not None:
            metric["regularization_loss"].update_state(tf.add_n(list(regularization_losses)))
        return eval_metrics

    def _update_keras(self, metric, labels, weights, predictions) -> None:
        """Updates the metrics of _keras_metrics and the thresholds' with the labels as the loss took them."""
        if self.n_classes is None:
            value = predictions["predictions"]
            metric["prediction/mean"].update_state(value, sample_weight=_broadcast(weights, value))
            metric["label/mean"].update_state(labels, sample_weight=_broadcast(weights, labels))
            return
        metric["accuracy"].update_state(labels, predictions["class_ids"], sample_weight=_or_none(weights))
        if self.n_classes > 2:
            return
        logistic = predictions["logistic"]
        for key in ("precision", "recall"):
            metric[key].update_state(labels, predictions["class_ids"], sample_weight=_or_none(weights))
        metric["prediction/mean"].update_state(logistic, sample_weight=_broadcast(weights, logistic))
        metric["label/mean"].update_state(labels, sample_weight=_broadcast(weights, labels))
        metric["accuracy_baseline"].add_update(tf.no_op())  # its update is label/mean's; EstimatorSpec runs one each
        self._update_keras_aucs(metric, "", labels, logistic, weights)
        self._update_threshold_metrics(metric, labels, logistic, weights)

    def _plain_keys(self, eval_metrics) -> list:
        """The keys of eval_metrics without this head's name."""
        suffix = f"/{self._name}" if self._name else ""
        return [key[:len(key) - len(suffix)] if suffix else key for key in eval_metrics
                if not suffix or key.endswith(suffix)]

    def _keras_aucs(self, keras, suffix) -> dict:
        return {f"auc{suffix}": keras.AUC(name=f"auc{suffix}"),
                f"auc_precision_recall{suffix}": keras.AUC(curve="PR", name=f"auc_precision_recall{suffix}")}

    def _update_keras_aucs(self, metric, suffix, labels, scores, weights) -> None:
        for key in (f"auc{suffix}", f"auc_precision_recall{suffix}"):
            metric[key].update_state(labels, scores, sample_weight=_broadcast(weights, scores))

    def _keras_threshold_metrics(self, keras) -> dict:
        found = {}
        for threshold in self._thresholds:
            names = [f"{name}/positive_threshold_{threshold:g}" for name in ("accuracy", "precision", "recall")]
            found.update({names[0]: keras.BinaryAccuracy(name=names[0], threshold=threshold),
                          names[1]: keras.Precision(name=names[1], thresholds=threshold),
                          names[2]: keras.Recall(name=names[2], thresholds=threshold)})
        return found

    def _update_threshold_metrics(self, metric, labels, scores, weights) -> None:
        for threshold in self._thresholds:
            for name in ("accuracy", "precision", "recall"):
                metric[f"{name}/positive_threshold_{threshold:g}"].update_state(labels, scores,
                                                                                sample_weight=_or_none(weights))


def _or_none(weights):
    """A head's weights as a Keras metric takes them: None for every example weighing 1."""
    return None if isinstance(weights, float) else weights


def _broadcast(weights, values):
    """A head's weights ([batch, 1], or 1.0) broadcast to values' shape, as TF 2.15's heads gave a metric them."""
    return None if isinstance(weights, float) else weights * tf.ones_like(tf.cast(values, tf.float32))


_ACCURACY_BASELINE = {}


def _accuracy_baseline_class(tf_keras):
    """The Keras metric of accuracy_baseline: max(label mean, 1 - label mean) of a label/mean metric, what always
    predicting the one class scores (TF 2.15's, which set a Mean's total and count from the label mean's)."""
    if "class" not in _ACCURACY_BASELINE:
        class AccuracyBaseline(tf_keras.metrics.Metric):
            def __init__(self, label_mean):
                super().__init__(name="accuracy_baseline")
                self._label_mean = label_mean

            def update_state(self, *args, **kwargs):
                del args, kwargs  # label/mean's own update counts the labels

            def result(self):
                mean = self._label_mean.result()
                return tf.maximum(mean, 1 - mean)

            def reset_state(self):
                pass  # label/mean's own reset

        _ACCURACY_BASELINE["class"] = AccuracyBaseline
    return _ACCURACY_BASELINE["class"]


class BinaryClassHead(_V2Head):
    """Binary classification: a logit per example, sigmoid cross entropy."""

    def __init__(self, weight_column=None, thresholds=None, label_vocabulary=None,
                 loss_reduction=SUM_OVER_BATCH_SIZE, loss_fn=None, name=None):
        if label_vocabulary is not None and not isinstance(label_vocabulary, list | tuple):
            raise ValueError(f"label_vocabulary should be a list or a tuple. Given type: {type(label_vocabulary)}")
        super().__init__(loss_reduction, name, n_classes=2, weight_column=weight_column,
                         label_vocabulary=label_vocabulary, loss_fn=loss_fn, thresholds=thresholds)


class MultiClassHead(_V2Head):
    """Classification into `n_classes` (more than 2): softmax cross entropy."""

    def __init__(self, n_classes, weight_column=None, label_vocabulary=None, loss_reduction=SUM_OVER_BATCH_SIZE,
                 loss_fn=None, name=None):
        if n_classes is None or n_classes <= 2:
            raise ValueError(f"n_classes must be > 2: {n_classes}.")
        if label_vocabulary is not None and not isinstance(label_vocabulary, list | tuple):
            raise ValueError(f"label_vocabulary should be a list or tuple. Given type: {type(label_vocabulary)}")
        super().__init__(loss_reduction, name, n_classes=n_classes, weight_column=weight_column,
                         label_vocabulary=label_vocabulary, loss_fn=loss_fn)


class RegressionHead(_V2Head):
    """Regression of `label_dimension` values: squared error, or `loss_fn`; the predictions are the logits, or
    `inverse_link_fn(logits)`."""

    def __init__(self, label_dimension=1, weight_column=None, loss_reduction=SUM_OVER_BATCH_SIZE, loss_fn=None,
                 inverse_link_fn=None, name=None):
        if label_dimension < 1:
            raise ValueError(f"Invalid label_dimension {label_dimension}.")
        super().__init__(loss_reduction, name, label_dimension=label_dimension, weight_column=weight_column,
                         loss_fn=loss_fn, inverse_link_fn=inverse_link_fn)


class PoissonRegressionHead(RegressionHead):
    """Poisson regression: the logits are log rates, the loss tf.nn.log_poisson_loss, the predictions exp(logits)."""

    def __init__(self, label_dimension=1, weight_column=None, loss_reduction=SUM_OVER_BATCH_SIZE,
                 compute_full_loss=True, name=None):
        def poisson_loss(labels, logits):
            return tf.nn.log_poisson_loss(targets=labels, log_input=logits, compute_full_loss=compute_full_loss)

        super().__init__(label_dimension, weight_column, loss_reduction, poisson_loss, tf.math.exp, name)


class LogisticRegressionHead(RegressionHead):
    """Regression of a value in [0, 1]: sigmoid cross entropy, the predictions sigmoid(logits)."""

    def __init__(self, weight_column=None, loss_reduction=SUM_OVER_BATCH_SIZE, name=None):
        def logistic_loss(labels, logits):
            in_range = tf.debugging.assert_less_equal(tf.abs(labels - 0.5), 0.5,
                                                      message="Labels must be in range [0, 1]")
            with tf.control_dependencies([in_range]):
                return tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)

        super().__init__(1, weight_column, loss_reduction, logistic_loss, tf.math.sigmoid, name)


class MultiLabelHead(_V2Head):
    """Multi-label classification: an example has any number of the `n_classes` classes. Its labels are multi-hot
    ([batch, n_classes] of 0 and 1), or a SparseTensor of class ids, or of names in `label_vocabulary`; the loss is
    each class's sigmoid cross entropy, averaged over the classes. The metrics are the AUCs over every (example,
    class), each threshold's accuracy, precision and recall, and for `classes_for_class_based_metrics` (ids, or
    names in label_vocabulary) each class's mean probability and AUCs."""

    def __init__(self, n_classes, weight_column=None, thresholds=None, label_vocabulary=None,
                 loss_reduction=SUM_OVER_BATCH_SIZE, loss_fn=None, classes_for_class_based_metrics=None, name=None):
        if n_classes is None or n_classes < 2:
            raise ValueError(f"n_classes must be > 1 for multi-label classification. Given: {n_classes}")
        if label_vocabulary is not None and not isinstance(label_vocabulary, list | tuple):
            raise ValueError(f"label_vocabulary must be a list or tuple. Given type: {type(label_vocabulary)}")
        super().__init__(loss_reduction, name, n_classes=n_classes, weight_column=weight_column,
                         label_vocabulary=label_vocabulary, loss_fn=loss_fn, thresholds=thresholds)
        self._metric_classes = tuple(self._class_id(given) for given in classes_for_class_based_metrics or ())

    def _class_id(self, given) -> int:
        if isinstance(given, str):
            if not self.label_vocabulary:
                raise ValueError("label_vocabulary must be provided when classes_for_class_based_metrics are strings.")
            return list(self.label_vocabulary).index(given)
        if not 0 <= given < self.n_classes:
            raise ValueError(f"All classes_for_class_based_metrics must be in range [0, {self.n_classes - 1}]. "
                             f"Given: {given}")
        return given

    @property
    def logits_dimension(self) -> int:
        return self.n_classes

    def _indicator(self, labels):
        """The labels as [batch, n_classes] floats of 0 and 1."""
        if isinstance(labels, tf.SparseTensor):
            ids = labels.values
            if ids.dtype == tf.string:
                if self.label_vocabulary is None:
                    raise ValueError("string labels need label_vocabulary")
                ids = self._vocabulary_ids(ids)
            elif not ids.dtype.is_integer:
                raise ValueError(f"Labels dtype should be integer. Instead got {ids.dtype}.")
            in_range = tf.debugging.assert_equal(
                tf.reduce_all((ids >= 0) & (ids < self.n_classes)), True,
                message=f"labels must be an integer SparseTensor with values in [0, {self.n_classes})")
            with tf.control_dependencies([in_range]):
                dense = tf.sparse.to_indicator(tf.SparseTensor(labels.indices, tf.cast(ids, tf.int64),
                                                               labels.dense_shape), self.n_classes)
        else:
            dense = tf.convert_to_tensor(labels)
            in_range = tf.debugging.assert_equal(
                tf.reduce_all((dense >= 0) & (dense <= 1)), True,
                message="labels must be an integer indicator Tensor with values in [0, 1]")
            with tf.control_dependencies([in_range]):
                dense = tf.identity(dense)
        return tf.reshape(tf.cast(dense, tf.float32), [-1, self.n_classes])

    def _unreduced_loss(self, features, logits, labels):
        if labels is None:
            raise ValueError("a head needs labels to train and evaluate: the input_fn gave none")
        logits = tf.convert_to_tensor(logits, tf.float32)
        labels = self._indicator(labels)
        if self._loss_fn is not None:
            return self._call_loss_fn(labels, logits, features), labels
        loss = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
        return tf.reduce_mean(loss, axis=-1, keepdims=True), labels

    def outputs(self, logits):
        logits = tf.convert_to_tensor(logits, tf.float32)
        probabilities = tf.sigmoid(logits)
        classes = tf.tile(tf.expand_dims(self._class_names(), 0), [tf.shape(logits)[0], 1])
        predictions = {"logits": logits, "probabilities": probabilities, "classes": classes}
        classification = export_output.ClassificationOutput(scores=probabilities, classes=classes)
        return predictions, {"serving_default": classification, "classification": classification,
                             "predict": export_output.PredictOutput(predictions)}

    def _metrics(self, labels, unreduced, weights, predictions) -> dict:
        key, probabilities = self._key, predictions["probabilities"]
        metrics = {key("average_loss"): v1.metrics.mean(unreduced, weights=weights),
                   **self._aucs("", labels, probabilities, weights),
                   **self._threshold_metrics(labels, probabilities, weights)}
        for class_id in self._metric_classes:
            named = self._metric_class_name(class_id)
            of = probabilities[:, class_id:class_id + 1]
            metrics[key(f"probability_mean/{named}")] = v1.metrics.mean(of, weights=weights)
            metrics.update(self._aucs(f"/{named}", labels[:, class_id:class_id + 1], of, weights))
        return metrics

    def _metric_class_name(self, class_id: int) -> str:
        return f"class{class_id}" if self.label_vocabulary is None else self.label_vocabulary[class_id]

    def _keras_metrics(self, tf_keras) -> dict:
        keras = tf_keras.metrics
        found = self._keras_aucs(keras, "")
        for class_id in self._metric_classes:
            named = self._metric_class_name(class_id)
            found.update({f"probability_mean/{named}": keras.Mean(name=f"probability_mean/{named}"),
                          **self._keras_aucs(keras, f"/{named}")})
        return found

    def _update_keras(self, metric, labels, weights, predictions) -> None:
        probabilities = predictions["probabilities"]
        self._update_keras_aucs(metric, "", labels, probabilities, weights)
        self._update_threshold_metrics(metric, labels, probabilities, weights)
        for class_id in self._metric_classes:
            named, of = self._metric_class_name(class_id), probabilities[:, class_id:class_id + 1]
            metric[f"probability_mean/{named}"].update_state(of, sample_weight=_broadcast(weights, of))
            self._update_keras_aucs(metric, f"/{named}", labels[:, class_id:class_id + 1], of, weights)


class MultiHead:
    """TF 2.x's MultiHead: named heads trained as one model (multi-task). The logits are a dict by head name, or
    one tensor whose last dimension the heads share in their order; the labels a dict by head name. The loss is
    the heads' losses (each as its head reduces it), weighted by `head_weights`, summed; the predictions are
    keyed (head name, key); the eval metrics are each head's (named: `<key>/<name>`) and `loss/<name>`; the
    export has the first head's default signature as `serving_default`, each head's signatures under
    `<name>` (its default) and `<name>/<key>`, and `predict` with every head's outputs as `<name>/<key>`."""

    def __init__(self, heads, head_weights=None):
        if not heads:
            raise ValueError(f"Must specify heads. Given: {heads}")
        if head_weights and len(head_weights) != len(heads):
            raise ValueError("heads and head_weights must have the same size. Given len(heads): "
                             f"{len(heads)}. Given len(head_weights): {len(head_weights)}.")
        for head in heads:
            if not isinstance(head, _V2Head):
                raise ValueError(f"MultiHead takes the heads of tf.estimator (BinaryClassHead, ...). Given: {head}")
            if head.name is None:
                raise ValueError(f"All given heads must have name specified. Given: {head}")
        self._heads, self._head_weights = tuple(heads), tuple(head_weights or ())

    @property
    def name(self) -> str:
        return "_".join(head.name for head in self._heads)

    @property
    def logits_dimension(self) -> int:
        return sum(head.logits_dimension for head in self._heads)

    @property
    def loss_reduction(self):
        reductions = [head.loss_reduction for head in self._heads]
        if len(set(reductions)) > 1:
            raise ValueError(f"The loss_reduction must be the same for different heads. Given: {reductions}")
        return reductions[0]

    def _by_head(self, logits, labels=None) -> dict:
        names = [head.name for head in self._heads]
        if labels is not None:
            if not isinstance(labels, dict):
                raise ValueError(f"labels must be a dict. Given: {labels}")
            if set(names) - set(labels):
                raise ValueError(f"labels has missing values for head(s): {sorted(set(names) - set(labels))}")
        if isinstance(logits, dict):
            if set(names) - set(logits):
                raise ValueError(f"logits has missing values for head(s): {sorted(set(names) - set(logits))}")
            return logits
        logits = tf.convert_to_tensor(logits, tf.float32)
        sizes = [head.logits_dimension for head in self._heads]
        if logits.shape[-1] is not None and logits.shape[-1] != sum(sizes):
            raise ValueError(f"Could not split logits of shape {logits.shape.as_list()} among the heads with "
                             f"individual logits dimensions: {sizes}. The last dimension of the logits tensor "
                             f"should equal {sum(sizes)} but is {logits.shape[-1]}.")
        return dict(zip(names, tf.split(logits, sizes, axis=-1)))

    def _losses(self, features, logits_by, labels) -> list:
        return [head.loss(labels[head.name], logits_by[head.name], features) for head in self._heads]

    def _merged(self, losses, regularization_losses):
        if self._head_weights:
            losses = [loss * weight for loss, weight in zip(losses, self._head_weights)]
        loss = tf.add_n(losses)
        if regularization_losses is not None:
            loss += tf.add_n(list(regularization_losses))
        return loss

    def loss(self, labels, logits, features=None, mode=None, regularization_losses=None):
        logits_by = self._by_head(logits, labels)
        return self._merged(self._losses(features or {}, logits_by, labels), regularization_losses)

    def predictions(self, logits, keys=None) -> dict:
        logits_by = self._by_head(logits)
        return {(head.name, key): value for head in self._heads
                for key, value in head.predictions(logits_by[head.name]).items()}

    def metrics(self, regularization_losses=None) -> dict:
        """Each head's `loss/<name>` (and `regularization_loss/<name>`) as Keras metric objects: update_metrics adds
        each head's own metrics, as TF 2.15's did."""
        import tf_keras  # noqa: PLC0415  (Keras 2 loads only for a program that asks for Keras metric objects)
        found = {f"loss/{head.name}": tf_keras.metrics.Mean(name=f"loss/{head.name}") for head in self._heads}
        if regularization_losses is not None:
            found[f"regularization_loss/{self.name}"] = tf_keras.metrics.Mean(name="regularization_loss")
        return found

    def update_metrics(self, eval_metrics, features, logits, labels, mode=None, regularization_losses=None) -> dict:
        """eval_metrics (metrics()'s) updated with the batch, each head's own metrics added and updated."""
        del mode
        logits_by = self._by_head(logits, labels)
        if regularization_losses is not None:
            eval_metrics[f"regularization_loss/{self.name}"].update_state(tf.add_n(list(regularization_losses)))
        for head in self._heads:
            eval_metrics[f"loss/{head.name}"].update_state(head.loss(labels[head.name], logits_by[head.name],
                                                                     features))
            eval_metrics.update(head.update_metrics(head.metrics(), features, logits_by[head.name], labels[head.name]))
        return eval_metrics

    def create_estimator_spec(self, features, mode, logits, labels=None, optimizer=None, trainable_variables=None,
                              train_op_fn=None, update_ops=None, regularization_losses=None) -> EstimatorSpec:
        logits_by = self._by_head(logits, labels if mode != ModeKeys.PREDICT else None)
        predictions, outputs = {}, {}
        for head in self._heads:
            head_predictions, head_outputs = head.outputs(logits_by[head.name])
            predictions.update({(head.name, key): value for key, value in head_predictions.items()})
            outputs.setdefault("serving_default", head_outputs["serving_default"])
            outputs.update({head.name if key == "serving_default" else f"{head.name}/{key}": output
                            for key, output in head_outputs.items()})
        if mode == ModeKeys.PREDICT:
            merged = {f"{name}/{key}": value for (name, key), value in predictions.items()}
            outputs["predict"] = export_output.PredictOutput(merged)
            return EstimatorSpec(mode, predictions=predictions, export_outputs=outputs)
        losses = self._losses(features, logits_by, labels)
        loss = self._merged(losses, regularization_losses)
        if mode == ModeKeys.EVAL:
            metrics = {}
            for head, head_loss in zip(self._heads, losses):
                metrics[f"loss/{head.name}"] = v1.metrics.mean(head_loss)
                head_predictions = {key: predictions[head.name, key] for name, key in predictions if name == head.name}
                metrics.update(head.eval_metrics(features, logits_by[head.name], labels[head.name],
                                                 head_predictions)[1])
            if regularization_losses is not None:
                metrics[f"regularization_loss/{self.name}"] = v1.metrics.mean(tf.add_n(list(regularization_losses)))
            return EstimatorSpec(mode, predictions=predictions, loss=loss, eval_metric_ops=metrics)
        # TF 2.x built each head's own (no-op) train op in a `training` name scope of its own first: the update's
        # scope, and so its Keras optimizer's variables, come after them (`training_<heads>/Adagrad/...`).
        for _ in self._heads:
            with keras_optimizers.training_scope():
                pass
        with keras_optimizers.training_scope():
            train_op = _train_op(loss, optimizer, trainable_variables, train_op_fn, update_ops)
        return EstimatorSpec(mode, predictions=predictions, loss=loss, train_op=train_op)
