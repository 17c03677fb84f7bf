"""Estimators spelled as TF 2.x programs spelled TF1's V1 classes (`tf.compat.v1.estimator.<Canned>`) and a
custom model_fn, on one small numeric dataset: the cases whose checkpoints the real Estimator wrote on
TF 2.15 (`scripts/make_tf215_fixtures.py`, into tests/data/tf215/) and this project continues
(tests/test_estimator_fixtures.py). The module imports nothing of the project's: it runs on either side.
"""

import numpy as np
import tensorflow as tf

v1 = tf.compat.v1
STEPS = 20  # the fixtures' global step
COLUMNS = [tf.feature_column.numeric_column("x", shape=[3])]


def data(examples: int = 256, seed: int = 0):
    rng = np.random.RandomState(seed)
    x = rng.normal(size=(examples, 3)).astype(np.float32)
    return {"x": x}, (x @ np.array([1.0, -2.0, 0.5]) > 0).astype(np.int64)


def input_fn(regression: bool, epochs=None):
    features, labels = data()
    labels = labels.astype(np.float32)[:, None] if regression else labels
    return v1.estimator.inputs.numpy_input_fn(features, labels, batch_size=32, num_epochs=epochs,
                                              shuffle=epochs is None)


def custom_model_fn(features, labels, mode):
    logits = v1.layers.dense(features["x"], 2, name="logits")
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == v1.estimator.ModeKeys.EVAL:
        return v1.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops={
            "accuracy": v1.metrics.accuracy(labels, tf.argmax(logits, 1))})
    train_op = v1.train.AdagradOptimizer(0.1).minimize(loss, v1.train.get_global_step())
    return v1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


# name: (whether its labels are numbers to regress, estimator of a model_dir)
CASES = {
    "v1_dnn_classifier": (False, lambda d: v1.estimator.DNNClassifier([8], COLUMNS, model_dir=d)),
    "v1_dnn_regressor": (True, lambda d: v1.estimator.DNNRegressor([8], COLUMNS, model_dir=d)),
    "v1_linear_classifier": (False, lambda d: v1.estimator.LinearClassifier(COLUMNS, model_dir=d)),
    "v1_linear_regressor": (True, lambda d: v1.estimator.LinearRegressor(COLUMNS, model_dir=d)),
    "v1_dnn_linear_combined_classifier": (False, lambda d: v1.estimator.DNNLinearCombinedClassifier(
        model_dir=d, linear_feature_columns=COLUMNS, dnn_feature_columns=COLUMNS, dnn_hidden_units=[8])),
    "v1_dnn_linear_combined_regressor": (True, lambda d: v1.estimator.DNNLinearCombinedRegressor(
        model_dir=d, linear_feature_columns=COLUMNS, dnn_feature_columns=COLUMNS, dnn_hidden_units=[8])),
    "custom_model_fn": (False, lambda d: v1.estimator.Estimator(custom_model_fn, model_dir=d)),
}
