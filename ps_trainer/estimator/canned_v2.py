"""TF 2.x's V2 canned estimators, `tf.estimator.<Canned>` in a TF 2.x program (canned.py holds TF1's V1 classes,
`tf.compat.v1.estimator.<Canned>`, and the model_fn both share). As tensorflow-estimator 2.15 built them: Keras
optimizers (tf_keras.optimizers.legacy, by name or instance) that update in the `training` name scope, the first
one stepping the global step as its `iterations`; the loss averaged over the batch (SUM_OVER_BATCH_SIZE);
TF 2.x's feature columns; no partitioned variables. A checkpoint of TensorFlow 2.15's V2 class restores here:
the weights, the global step and the optimizer's slots and hyper-parameters
(`training/Adagrad/<variable>/accumulator`, `training/Adagrad/learning_rate`)."""

import tensorflow as tf
from tensorflow.python.feature_column import feature_column_v2  # is_feature_column_v2: the V2 classes' check

from ps_trainer.estimator import canned, keras_optimizers
from ps_trainer.estimator.estimator import Estimator
from ps_trainer.estimator.heads import KERAS_AUC, SUM_OVER_BATCH_SIZE, Head, v1_reduction_of

v1 = tf.compat.v1
DNN_LEARNING_RATE = 0.05  # DNNClassifier, DNNRegressor
LINEAR_LEARNING_RATE = 0.2  # LinearClassifier, LinearRegressor (the V1 classes' 1/sqrt(columns) cap is not applied)
V2 = canned.Version(partitions=False, optimizer=keras_optimizers.get_optimizer_instance_v2,
                    update=keras_optimizers.updates)


def _head(loss_reduction, **head):
    """A V2 class's head: Keras's loss reduction (SUM_OVER_BATCH_SIZE or SUM), its AUC's interpolating summation."""
    return Head(loss_reduction=v1_reduction_of(loss_reduction), auc_summation=KERAS_AUC, **head)


def _v2_columns(feature_columns):
    if feature_columns and not feature_column_v2.is_feature_column_v2(feature_columns):
        raise ValueError("Received a feature column from TensorFlow v1, but this is a TensorFlow v2 Estimator. Please "
                         "either use v2 feature columns (accessible via tf.feature_column.* in TF 2.x) with this "
                         "Estimator, or switch to a v1 Estimator for use with v1 feature columns (accessible via "
                         "tf.compat.v1.estimator.* and tf.compat.v1.feature_column.*, respectively.")
    return feature_columns


def _dnn(hidden_units, feature_columns, optimizer, activation_fn, dropout, batch_norm):
    return canned.dnn_part(hidden_units, _v2_columns(feature_columns), optimizer, activation_fn, dropout, None,
                           DNN_LEARNING_RATE, batch_norm)


def _linear(feature_columns, optimizer, sparse_combiner, **learning_rate):
    return canned.linear_part(_v2_columns(feature_columns), optimizer, None, sparse_combiner, **learning_rate)


class DNNClassifier(Estimator):
    def __init__(self, hidden_units, feature_columns, model_dir=None, n_classes=2, weight_column=None,
                 label_vocabulary=None, optimizer="Adagrad", activation_fn=tf.nn.relu, dropout=None, config=None,
                 warm_start_from=None, loss_reduction=SUM_OVER_BATCH_SIZE, batch_norm=False):
        head = _head(loss_reduction, n_classes=n_classes, weight_column=weight_column,
                     label_vocabulary=label_vocabulary)
        dnn = _dnn(hidden_units, feature_columns, optimizer, activation_fn, dropout, batch_norm)
        super().__init__(canned.model_fn_of(head, dnn=dnn, version=V2), model_dir, config,
                         warm_start_from=warm_start_from)


class DNNRegressor(Estimator):
    def __init__(self, hidden_units, feature_columns, model_dir=None, label_dimension=1, weight_column=None,
                 optimizer="Adagrad", activation_fn=tf.nn.relu, dropout=None, config=None, warm_start_from=None,
                 loss_reduction=SUM_OVER_BATCH_SIZE, batch_norm=False):
        head = _head(loss_reduction, label_dimension=label_dimension, weight_column=weight_column)
        dnn = _dnn(hidden_units, feature_columns, optimizer, activation_fn, dropout, batch_norm)
        super().__init__(canned.model_fn_of(head, dnn=dnn, version=V2), model_dir, config,
                         warm_start_from=warm_start_from)


class LinearClassifier(Estimator):
    def __init__(self, feature_columns, model_dir=None, n_classes=2, weight_column=None, label_vocabulary=None,
                 optimizer="Ftrl", config=None, warm_start_from=None, loss_reduction=SUM_OVER_BATCH_SIZE,
                 sparse_combiner="sum"):
        head = _head(loss_reduction, n_classes=n_classes, weight_column=weight_column,
                     label_vocabulary=label_vocabulary)
        linear = _linear(feature_columns, optimizer, sparse_combiner, learning_rate=LINEAR_LEARNING_RATE)
        super().__init__(canned.model_fn_of(head, linear=linear, version=V2), model_dir, config,
                         warm_start_from=warm_start_from)


class LinearRegressor(Estimator):
    def __init__(self, feature_columns, model_dir=None, label_dimension=1, weight_column=None, optimizer="Ftrl",
                 config=None, warm_start_from=None, loss_reduction=SUM_OVER_BATCH_SIZE, sparse_combiner="sum"):
        head = _head(loss_reduction, label_dimension=label_dimension, weight_column=weight_column)
        linear = _linear(feature_columns, optimizer, sparse_combiner, learning_rate=LINEAR_LEARNING_RATE)
        super().__init__(canned.model_fn_of(head, linear=linear, version=V2), model_dir, config,
                         warm_start_from=warm_start_from)


class DNNEstimator(Estimator):
    """A DNN over a head of the program's (TF 2.x's heads, heads.py): its loss, predictions, metrics and exports."""

    def __init__(self, head, hidden_units, feature_columns, model_dir=None, optimizer="Adagrad",
                 activation_fn=tf.nn.relu, dropout=None, config=None, warm_start_from=None, batch_norm=False):
        dnn = _dnn(hidden_units, feature_columns, optimizer, activation_fn, dropout, batch_norm)
        super().__init__(canned.model_fn_of(head, dnn=dnn, version=V2), model_dir, config,
                         warm_start_from=warm_start_from)


class LinearEstimator(Estimator):
    """A linear model over a head of the program's."""

    def __init__(self, head, feature_columns, model_dir=None, optimizer="Ftrl", config=None, sparse_combiner="sum",
                 warm_start_from=None):
        linear = _linear(feature_columns, optimizer, sparse_combiner, learning_rate=LINEAR_LEARNING_RATE)
        super().__init__(canned.model_fn_of(head, linear=linear, version=V2), model_dir, config,
                         warm_start_from=warm_start_from)


def _combined(head, linear_feature_columns, linear_optimizer, dnn_feature_columns, dnn_optimizer,
              dnn_hidden_units, dnn_activation_fn, dnn_dropout, linear_sparse_combiner, batch_norm):
    return canned.combined_model_fn(head, _v2_columns(linear_feature_columns), linear_optimizer,
                                    _v2_columns(dnn_feature_columns), dnn_optimizer, dnn_hidden_units,
                                    dnn_activation_fn, dnn_dropout, None, linear_sparse_combiner, batch_norm,
                                    version=V2)


class DNNLinearCombinedClassifier(Estimator):
    def __init__(self, model_dir=None, linear_feature_columns=None, linear_optimizer="Ftrl",
                 dnn_feature_columns=None, dnn_optimizer="Adagrad", dnn_hidden_units=None,
                 dnn_activation_fn=tf.nn.relu, dnn_dropout=None, n_classes=2, weight_column=None,
                 label_vocabulary=None, config=None, warm_start_from=None, loss_reduction=SUM_OVER_BATCH_SIZE,
                 batch_norm=False, linear_sparse_combiner="sum"):
        head = _head(loss_reduction, n_classes=n_classes, weight_column=weight_column,
                     label_vocabulary=label_vocabulary)
        super().__init__(_combined(head, linear_feature_columns, linear_optimizer, dnn_feature_columns, dnn_optimizer,
                                   dnn_hidden_units, dnn_activation_fn, dnn_dropout, linear_sparse_combiner,
                                   batch_norm),
                         model_dir, config, warm_start_from=warm_start_from)


class DNNLinearCombinedRegressor(Estimator):
    def __init__(self, model_dir=None, linear_feature_columns=None, linear_optimizer="Ftrl",
                 dnn_feature_columns=None, dnn_optimizer="Adagrad", dnn_hidden_units=None,
                 dnn_activation_fn=tf.nn.relu, dnn_dropout=None, label_dimension=1, weight_column=None, config=None,
                 warm_start_from=None, loss_reduction=SUM_OVER_BATCH_SIZE, batch_norm=False,
                 linear_sparse_combiner="sum"):
        head = _head(loss_reduction, label_dimension=label_dimension, weight_column=weight_column)
        super().__init__(_combined(head, linear_feature_columns, linear_optimizer, dnn_feature_columns, dnn_optimizer,
                                   dnn_hidden_units, dnn_activation_fn, dnn_dropout, linear_sparse_combiner,
                                   batch_norm),
                         model_dir, config, warm_start_from=warm_start_from)


class DNNLinearCombinedEstimator(Estimator):
    """Wide & deep over a head of the program's."""

    def __init__(self, head, model_dir=None, linear_feature_columns=None, linear_optimizer="Ftrl",
                 dnn_feature_columns=None, dnn_optimizer="Adagrad", dnn_hidden_units=None,
                 dnn_activation_fn=tf.nn.relu, dnn_dropout=None, config=None, batch_norm=False,
                 linear_sparse_combiner="sum"):
        super().__init__(_combined(head, linear_feature_columns, linear_optimizer, dnn_feature_columns, dnn_optimizer,
                                   dnn_hidden_units, dnn_activation_fn, dnn_dropout, linear_sparse_combiner,
                                   batch_norm),
                         model_dir, config)


class BaselineClassifier(Estimator):
    """Learns each class's share of the labels and predicts it for every example, whatever its features."""

    def __init__(self, model_dir=None, n_classes=2, weight_column=None, label_vocabulary=None, optimizer="Ftrl",
                 config=None, loss_reduction=SUM_OVER_BATCH_SIZE):
        head = _head(loss_reduction, n_classes=n_classes, weight_column=weight_column,
                     label_vocabulary=label_vocabulary)
        model_fn = canned.model_fn_of(head, baseline=canned.baseline_part(optimizer), version=V2)
        super().__init__(model_fn, model_dir, config)


class BaselineRegressor(Estimator):
    """Learns the labels' mean and predicts it for every example, whatever its features."""

    def __init__(self, model_dir=None, label_dimension=1, weight_column=None, optimizer="Ftrl", config=None,
                 loss_reduction=SUM_OVER_BATCH_SIZE):
        head = _head(loss_reduction, label_dimension=label_dimension, weight_column=weight_column)
        model_fn = canned.model_fn_of(head, baseline=canned.baseline_part(optimizer), version=V2)
        super().__init__(model_fn, model_dir, config)
