"""The canned estimators: DNN, linear, wide & deep and baseline, classifier and regressor. This module holds
TF1's V1 classes (`tf.compat.v1.estimator.<Canned>`, TF1's defaults) and the model_fn both versions share
(canned_v2.py holds TF 2.x's V2 classes, `tf.estimator.<Canned>`). Each is an Estimator whose model_fn is built
here from feature columns, a head (loss, predictions, metrics, export outputs) and optimizers; variables are
named as TensorFlow named them (dnn/hiddenlayer_0/kernel, linear/linear_model/..., baseline/bias). The V1
classes partition the input layer's and the linear model's variables over the ps tasks as TF1's did
(min_max_variable_partitioner: at most one shard per ps, shards of at least 64 MB; wide & deep's linear
part, of at least 256 KB) and update with tf.compat.v1.train optimizers, the loss summed over the batch; the
V2 classes partition nothing and update with Keras optimizers in the `training` name scope, the loss
averaged over the batch."""

import contextlib
import math
from collections.abc import Callable
from typing import NamedTuple

import tensorflow as tf

from ps_trainer.estimator.estimator import Estimator
from ps_trainer.estimator.heads import Head
from ps_trainer.model import needs
from ps_trainer.model.spec import ModeKeys

v1 = tf.compat.v1
fc = v1.feature_column

OPTIMIZERS = {"Adagrad": v1.train.AdagradOptimizer, "Adam": v1.train.AdamOptimizer, "Ftrl": v1.train.FtrlOptimizer,
              "RMSProp": v1.train.RMSPropOptimizer, "SGD": v1.train.GradientDescentOptimizer}
DNN_LEARNING_RATE = 0.05  # DNNClassifier, DNNRegressor
LINEAR_LEARNING_RATE = 0.2  # LinearClassifier, LinearRegressor: at most this, and 1/sqrt(feature columns)
COMBINED_DNN_LEARNING_RATE = 0.001  # DNNLinearCombined*
COMBINED_LINEAR_LEARNING_RATE = 0.005
BASELINE_LEARNING_RATE = 0.3  # BaselineClassifier, BaselineRegressor
MIN_SLICE_BYTES = 64 << 20
BATCH_NORM_MOMENTUM, BATCH_NORM_EPSILON = 0.999, 0.001  # the DNN classes' batch_norm=True: Keras's layer, as TF's


def get_optimizer_instance(optimizer, learning_rate=None):
    """An optimizer as TF1's canned estimators took one (TF1's canned/optimizers.get_optimizer_instance): a
    name (with a learning rate), an instance, or a callable that returns one."""
    if isinstance(optimizer, str):
        if learning_rate is None:
            raise ValueError(f"learning_rate must be given with the optimizer's name ({optimizer!r})")
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer {optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
        return OPTIMIZERS[optimizer](learning_rate=learning_rate)
    if callable(optimizer) and not isinstance(optimizer, v1.train.Optimizer):
        optimizer = optimizer()
    if not isinstance(optimizer, v1.train.Optimizer):
        raise ValueError(f"optimizer must be a tf.compat.v1.train.Optimizer, a name or a callable, not {optimizer!r}")
    return optimizer


def _linear_learning_rate(num_columns: int, most: float) -> float:
    return min(most, 1.0 / math.sqrt(num_columns))


def _partitioner(config):
    return v1.min_max_variable_partitioner(max_partitions=max(1, config.num_ps_replicas),
                                           min_slice_size=MIN_SLICE_BYTES)


def _dnn_logits(features, columns, hidden_units, units, activation_fn, dropout, partitioner, training, batch_norm,
                updates):
    with v1.variable_scope("input_from_feature_columns", partitioner=partitioner):
        net = fc.input_layer(features, columns)
    for index, width in enumerate(list(hidden_units) + [units]):
        last = index == len(hidden_units)
        with v1.variable_scope("logits" if last else f"hiddenlayer_{index}"):
            kernel = v1.get_variable("kernel", [net.shape[-1], width], initializer=v1.glorot_uniform_initializer())
            bias = v1.get_variable("bias", [width], initializer=v1.zeros_initializer())
            net = tf.nn.bias_add(tf.matmul(net, kernel), bias)
            if not last:
                net = activation_fn(net)
                if dropout and training:
                    net = tf.nn.dropout(net, rate=dropout)
                if batch_norm:
                    net = _batch_normalized(net, index, training, updates)
    return net


def _batch_normalized(net, index, training, updates):
    """Keras's BatchNormalization as TF's DNN classes applied it after each hidden layer (momentum 0.999, epsilon
    0.001): in training, the batch's mean and (biased) variance, whose moving averages its update ops keep (added
    to `updates` and to UPDATE_OPS, as TF1's layers added them); in evaluation and prediction, the moving ones."""
    width = net.shape[-1]
    with v1.variable_scope(f"batchnorm_{index}"):
        gamma = v1.get_variable("gamma", [width], initializer=v1.ones_initializer())
        beta = v1.get_variable("beta", [width], initializer=v1.zeros_initializer())
        moving_mean = v1.get_variable("moving_mean", [width], initializer=v1.zeros_initializer(), trainable=False)
        moving_variance = v1.get_variable("moving_variance", [width], initializer=v1.ones_initializer(),
                                          trainable=False)
    if not training:
        return tf.nn.batch_normalization(net, moving_mean, moving_variance, beta, gamma, BATCH_NORM_EPSILON)
    mean, variance = tf.nn.moments(net, axes=[0])
    for moving, value in ((moving_mean, mean), (moving_variance, variance)):
        update = v1.assign_sub(moving, (moving - value) * (1 - BATCH_NORM_MOMENTUM))
        updates.append(update)
        v1.add_to_collection(v1.GraphKeys.UPDATE_OPS, update)
    return tf.nn.batch_normalization(net, mean, variance, beta, gamma, BATCH_NORM_EPSILON)


def _linear_logits(features, columns, units, sparse_combiner):
    return fc.linear_model(features, columns, units=units, sparse_combiner=sparse_combiner)


def dnn_logit_fn_builder(units, hidden_units, feature_columns, activation_fn, dropout, input_layer_partitioner,
                         batch_norm):
    """TF's experimental.dnn_logit_fn_builder: `logit_fn(features, mode)`, the DNN classes' logits (their layers
    and variable names, in the caller's variable scope; batch normalization's updates in UPDATE_OPS)."""
    if not isinstance(units, int):
        raise ValueError(f"units must be an int.  Given type: {type(units)}")

    def dnn_logit_fn(features, mode):
        return _dnn_logits(features, feature_columns, hidden_units, units, activation_fn, dropout,
                           input_layer_partitioner, mode == ModeKeys.TRAIN, batch_norm, [])

    return dnn_logit_fn


def linear_logit_fn_builder(units, feature_columns, sparse_combiner="sum"):
    """TF's experimental.linear_logit_fn_builder: `logit_fn(features)`, the linear classes' logits
    (`linear_model/<column>/weights`, in the caller's variable scope)."""
    if not isinstance(units, int):
        raise ValueError(f"units must be an int.  Given type: {type(units)}")

    def linear_logit_fn(features):
        return _linear_logits(features, feature_columns, units, sparse_combiner)

    return linear_logit_fn


def _minimize(loss, parts):
    """The train op of (optimizer, variables) parts: one part's minimize steps the global step (a
    SyncReplicasOptimizer works so, its hook the program's); two parts update, then step it once."""
    global_step = v1.train.get_global_step()
    parts = [(optimizer, variables) for optimizer, variables in parts if variables]
    if len(parts) == 1:
        [(optimizer, variables)] = parts
        return optimizer.minimize(loss, global_step=global_step, var_list=variables)
    if any(isinstance(optimizer, v1.train.SyncReplicasOptimizer) for optimizer, _ in parts):
        raise ValueError("SyncReplicasOptimizer does not support multi optimizers case. Therefore, it is not "
                         "supported in DNNLinearCombined model. If you want to use this optimizer, please use either "
                         "DNN or Linear model.")
    updates = [optimizer.minimize(loss, var_list=variables) for optimizer, variables in parts]
    with tf.control_dependencies(updates):
        return v1.assign_add(global_step, 1).op


def _scope_variables(scope):
    return v1.get_collection(v1.GraphKeys.TRAINABLE_VARIABLES, scope=scope + "/")


class Version(NamedTuple):
    """What differs between the V1 and the V2 classes' model_fn."""
    partitions: bool  # the input layer's and the linear model's variables are partitioned over the ps tasks
    optimizer: Callable  # (the optimizer given: a name, an instance or a callable; default learning rate) -> one
    update: Callable  # (loss, [(optimizer, variables)]) -> the train op, which steps the global step once


V1 = Version(partitions=True, optimizer=get_optimizer_instance, update=_minimize)


def _baseline_logits(features, units):
    """A bias per output, for every example of the batch (its size: any feature's first dimension)."""
    if not features:
        raise ValueError("a baseline needs at least one feature to know the batch's size")
    first = next(iter(features.values())) if isinstance(features, dict) else features
    size = first.dense_shape[0] if isinstance(first, tf.SparseTensor) else tf.shape(first, out_type=tf.int64)[0]
    with v1.variable_scope("baseline"):
        bias = v1.get_variable("bias", [units], initializer=v1.zeros_initializer())
    return bias * tf.ones(tf.stack([size, units]))


def model_fn_of(head, dnn=None, linear=None, baseline=None, version=V1):
    """A canned model_fn: the sum of a DNN's and a linear model's logits (either may be absent), or a
    baseline's bias. The DNN's batch normalization updates go to the head as its update_ops."""

    def model_fn(features, labels, mode, config):
        training = mode == ModeKeys.TRAIN
        logits, parts, updates = 0, [], []
        if dnn is not None:
            partitioner = (dnn["input_layer_partitioner"] or _partitioner(config)) if version.partitions else None
            with v1.variable_scope("dnn"):
                logits += _dnn_logits(features, dnn["feature_columns"], dnn["hidden_units"], head.logits_dimension,
                                      dnn["activation_fn"], dnn["dropout"], partitioner, training, dnn["batch_norm"],
                                      updates)
        if linear is not None:
            partitioner = None
            if version.partitions:  # wide & deep's linear part: TF1's default smallest shard (256 KB)
                partitioner = linear["partitioner"] or (
                    v1.min_max_variable_partitioner(max_partitions=max(1, config.num_ps_replicas))
                    if dnn is not None else _partitioner(config))
            # The linear model's weights are a table: TF1's partitioned; TF 2.x's made whole, in table_part() (a
            # lever keeps them on the ps, where its optimizer's slots stay too: FTRL's weights follow from them).
            with v1.variable_scope("linear", partitioner=partitioner), (
                    contextlib.nullcontext() if version.partitions else needs.table_part()):
                logits += _linear_logits(features, linear["feature_columns"], head.logits_dimension,
                                         linear["sparse_combiner"])
        if baseline is not None:
            logits = _baseline_logits(features, head.logits_dimension)

        def train_op_fn(loss):
            for scope, part in (("dnn", dnn), ("linear", linear), ("baseline", baseline)):
                if part is not None:
                    parts.append((version.optimizer(part["optimizer"], part["learning_rate"]),
                                  _scope_variables(scope)))
            return version.update(loss, parts)

        batch_norm = {"update_ops": updates} if updates else {}  # (a library's head may take no update_ops)
        return head.create_estimator_spec(features=features, mode=mode, logits=logits, labels=labels,
                                          train_op_fn=train_op_fn, **batch_norm)

    return model_fn


def dnn_part(hidden_units, feature_columns, optimizer, activation_fn, dropout, input_layer_partitioner,
             learning_rate, batch_norm=False):
    if not feature_columns:
        raise ValueError("a DNN needs feature_columns")
    return dict(hidden_units=tuple(hidden_units), feature_columns=list(feature_columns), optimizer=optimizer,
                activation_fn=activation_fn, dropout=dropout, input_layer_partitioner=input_layer_partitioner,
                learning_rate=learning_rate, batch_norm=batch_norm)


def linear_part(feature_columns, optimizer, partitioner, sparse_combiner, learning_rate=None, most=None):
    """A linear part; its default learning rate is `learning_rate`, or at most `most` and 1/sqrt(columns)."""
    if not feature_columns:
        raise ValueError("a linear model needs feature_columns")
    if learning_rate is None:
        learning_rate = _linear_learning_rate(len(feature_columns), most)
    return dict(feature_columns=list(feature_columns), optimizer=optimizer, partitioner=partitioner,
                sparse_combiner=sparse_combiner, learning_rate=learning_rate)


class DNNClassifier(Estimator):
    def __init__(self, hidden_units, feature_columns, model_dir=None, n_classes=2, weight_column=None,
                 label_vocabulary=None, optimizer="Adagrad", activation_fn=tf.nn.relu, dropout=None,
                 input_layer_partitioner=None, config=None, warm_start_from=None,
                 loss_reduction=v1.losses.Reduction.SUM, batch_norm=False):
        head = Head(n_classes=n_classes, weight_column=weight_column, label_vocabulary=label_vocabulary,
                    loss_reduction=loss_reduction)
        dnn = dnn_part(hidden_units, feature_columns, optimizer, activation_fn, dropout, input_layer_partitioner,
                       DNN_LEARNING_RATE, batch_norm)
        super().__init__(model_fn_of(head, dnn=dnn), model_dir, config, warm_start_from=warm_start_from)


class DNNRegressor(Estimator):
    def __init__(self, hidden_units, feature_columns, model_dir=None, label_dimension=1, weight_column=None,
                 optimizer="Adagrad", activation_fn=tf.nn.relu, dropout=None, input_layer_partitioner=None,
                 config=None, warm_start_from=None, loss_reduction=v1.losses.Reduction.SUM, batch_norm=False):
        head = Head(label_dimension=label_dimension, weight_column=weight_column, loss_reduction=loss_reduction)
        dnn = dnn_part(hidden_units, feature_columns, optimizer, activation_fn, dropout, input_layer_partitioner,
                       DNN_LEARNING_RATE, batch_norm)
        super().__init__(model_fn_of(head, dnn=dnn), model_dir, config, warm_start_from=warm_start_from)


class LinearClassifier(Estimator):
    def __init__(self, feature_columns, model_dir=None, n_classes=2, weight_column=None, label_vocabulary=None,
                 optimizer="Ftrl", config=None, partitioner=None, warm_start_from=None,
                 loss_reduction=v1.losses.Reduction.SUM, sparse_combiner="sum"):
        head = Head(n_classes=n_classes, weight_column=weight_column, label_vocabulary=label_vocabulary,
                    loss_reduction=loss_reduction)
        linear = linear_part(feature_columns, optimizer, partitioner, sparse_combiner, most=LINEAR_LEARNING_RATE)
        super().__init__(model_fn_of(head, linear=linear), model_dir, config, warm_start_from=warm_start_from)


class LinearRegressor(Estimator):
    def __init__(self, feature_columns, model_dir=None, label_dimension=1, weight_column=None, optimizer="Ftrl",
                 config=None, partitioner=None, warm_start_from=None, loss_reduction=v1.losses.Reduction.SUM,
                 sparse_combiner="sum"):
        head = Head(label_dimension=label_dimension, weight_column=weight_column, loss_reduction=loss_reduction)
        linear = linear_part(feature_columns, optimizer, partitioner, sparse_combiner, most=LINEAR_LEARNING_RATE)
        super().__init__(model_fn_of(head, linear=linear), model_dir, config, warm_start_from=warm_start_from)


class DNNEstimator(Estimator):
    """A DNN over a head of the program's (TF 2.x's heads, heads.py): its loss, predictions, metrics and exports."""

    def __init__(self, head, hidden_units, feature_columns, model_dir=None, optimizer="Adagrad",
                 activation_fn=tf.nn.relu, dropout=None, input_layer_partitioner=None, config=None,
                 warm_start_from=None, batch_norm=False):
        dnn = dnn_part(hidden_units, feature_columns, optimizer, activation_fn, dropout, input_layer_partitioner,
                       DNN_LEARNING_RATE, batch_norm)
        super().__init__(model_fn_of(head, dnn=dnn), model_dir, config, warm_start_from=warm_start_from)


class LinearEstimator(Estimator):
    """A linear model over a head of the program's."""

    def __init__(self, head, feature_columns, model_dir=None, optimizer="Ftrl", config=None, partitioner=None,
                 sparse_combiner="sum", warm_start_from=None):
        linear = linear_part(feature_columns, optimizer, partitioner, sparse_combiner, most=LINEAR_LEARNING_RATE)
        super().__init__(model_fn_of(head, linear=linear), model_dir, config, warm_start_from=warm_start_from)


def combined_model_fn(head, linear_feature_columns, linear_optimizer, dnn_feature_columns, dnn_optimizer,
                      dnn_hidden_units, dnn_activation_fn, dnn_dropout, input_layer_partitioner, linear_sparse_combiner,
                      batch_norm=False, version=V1):
    if not linear_feature_columns and not dnn_feature_columns:
        raise ValueError("Either linear_feature_columns or dnn_feature_columns must be defined.")
    if dnn_feature_columns and not dnn_hidden_units:
        raise ValueError("dnn_hidden_units must be defined when dnn_feature_columns is specified.")
    dnn = linear = None
    if dnn_feature_columns:
        dnn = dnn_part(dnn_hidden_units, dnn_feature_columns, dnn_optimizer, dnn_activation_fn, dnn_dropout,
                       input_layer_partitioner, COMBINED_DNN_LEARNING_RATE, batch_norm)
    if linear_feature_columns:
        linear = linear_part(linear_feature_columns, linear_optimizer, None, linear_sparse_combiner,
                             most=COMBINED_LINEAR_LEARNING_RATE)
    return model_fn_of(head, dnn=dnn, linear=linear, version=version)


class DNNLinearCombinedClassifier(Estimator):
    def __init__(self, model_dir=None, linear_feature_columns=None, linear_optimizer="Ftrl",
                 dnn_feature_columns=None, dnn_optimizer="Adagrad", dnn_hidden_units=None,
                 dnn_activation_fn=tf.nn.relu, dnn_dropout=None, n_classes=2, weight_column=None,
                 label_vocabulary=None, input_layer_partitioner=None, config=None, warm_start_from=None,
                 loss_reduction=v1.losses.Reduction.SUM, batch_norm=False, linear_sparse_combiner="sum"):
        head = Head(n_classes=n_classes, weight_column=weight_column, label_vocabulary=label_vocabulary,
                    loss_reduction=loss_reduction)
        model_fn = combined_model_fn(head, linear_feature_columns, linear_optimizer, dnn_feature_columns,
                                     dnn_optimizer, dnn_hidden_units, dnn_activation_fn, dnn_dropout,
                                     input_layer_partitioner, linear_sparse_combiner, batch_norm)
        super().__init__(model_fn, model_dir, config, warm_start_from=warm_start_from)


class DNNLinearCombinedRegressor(Estimator):
    def __init__(self, model_dir=None, linear_feature_columns=None, linear_optimizer="Ftrl",
                 dnn_feature_columns=None, dnn_optimizer="Adagrad", dnn_hidden_units=None,
                 dnn_activation_fn=tf.nn.relu, dnn_dropout=None, label_dimension=1, weight_column=None,
                 input_layer_partitioner=None, config=None, warm_start_from=None,
                 loss_reduction=v1.losses.Reduction.SUM, batch_norm=False, linear_sparse_combiner="sum"):
        head = Head(label_dimension=label_dimension, weight_column=weight_column, loss_reduction=loss_reduction)
        model_fn = combined_model_fn(head, linear_feature_columns, linear_optimizer, dnn_feature_columns,
                                     dnn_optimizer, dnn_hidden_units, dnn_activation_fn, dnn_dropout,
                                     input_layer_partitioner, linear_sparse_combiner, batch_norm)
        super().__init__(model_fn, model_dir, config, warm_start_from=warm_start_from)


class DNNLinearCombinedEstimator(Estimator):
    """Wide & deep over a head of the program's."""

    def __init__(self, head, model_dir=None, linear_feature_columns=None, linear_optimizer="Ftrl",
                 dnn_feature_columns=None, dnn_optimizer="Adagrad", dnn_hidden_units=None,
                 dnn_activation_fn=tf.nn.relu, dnn_dropout=None, input_layer_partitioner=None, config=None,
                 batch_norm=False, linear_sparse_combiner="sum"):
        model_fn = combined_model_fn(head, linear_feature_columns, linear_optimizer, dnn_feature_columns,
                                     dnn_optimizer, dnn_hidden_units, dnn_activation_fn, dnn_dropout,
                                     input_layer_partitioner, linear_sparse_combiner, batch_norm)
        super().__init__(model_fn, model_dir, config)


def baseline_part(optimizer):
    return dict(optimizer=optimizer, learning_rate=BASELINE_LEARNING_RATE)


class BaselineClassifier(Estimator):
    """Learns each class's share of the labels and predicts it for every example, whatever its features."""

    def __init__(self, model_dir=None, n_classes=2, weight_column=None, label_vocabulary=None, optimizer="Ftrl",
                 config=None, loss_reduction=v1.losses.Reduction.SUM):
        head = Head(n_classes=n_classes, weight_column=weight_column, label_vocabulary=label_vocabulary,
                    loss_reduction=loss_reduction)
        super().__init__(model_fn_of(head, baseline=baseline_part(optimizer)), model_dir, config)


class BaselineRegressor(Estimator):
    """Learns the labels' mean and predicts it for every example, whatever its features."""

    def __init__(self, model_dir=None, label_dimension=1, weight_column=None, optimizer="Ftrl", config=None,
                 loss_reduction=v1.losses.Reduction.SUM):
        head = Head(label_dimension=label_dimension, weight_column=weight_column, loss_reduction=loss_reduction)
        super().__init__(model_fn_of(head, baseline=baseline_part(optimizer)), model_dir, config)
