"""Estimators spelled as TF 2.x programs spelled them: each canned class as the V2 class (`tf.estimator.<Canned>`)
and as TF1's V1 class (`tf.compat.v1.estimator.<Canned>`), and a custom model_fn, on one small numeric dataset:
the cases whose checkpoints and exports the real Estimator wrote on TF 2.15 (`scripts/make_tf215_fixtures.py`,
into tests/data/tf215/) and this project continues (tests/test_estimator_fixtures.py). The module imports nothing
of the project's: it runs on either side.
"""

import json

import numpy as np
import tensorflow as tf

v1 = tf.compat.v1
STEPS = 20  # the fixtures' global step
COLUMNS = [tf.feature_column.numeric_column("x", shape=[3])]


def data(examples: int = 256, seed: int = 0):
    rng = np.random.RandomState(seed)
    x = rng.normal(size=(examples, 3)).astype(np.float32)
    return {"x": x}, (x @ np.array([1.0, -2.0, 0.5]) > 0).astype(np.int64)


def input_fn(regression, epochs=None):
    """The data's input_fn: its labels as classes, as numbers to regress (regression=True), both, by the names of
    a MultiHead's heads (regression="multi"), or three classes an example may have any of (regression="labels")."""
    features, labels = data()
    if regression == "multi":
        labels = {"click": labels, "value": labels.astype(np.float32)[:, None] * 2.0}
    elif regression == "labels":
        x = features["x"]
        labels = np.stack([labels, x[:, 0] > 0, x[:, 2] > 0.5], axis=1).astype(np.int64)
    elif regression:
        labels = labels.astype(np.float32)[:, None]
    return v1.estimator.inputs.numpy_input_fn(features, labels, batch_size=32, num_epochs=epochs,
                                              shuffle=epochs is None)


def custom_model_fn(features, labels, mode):
    logits = v1.layers.dense(features["x"], 2, name="logits")
    if mode == v1.estimator.ModeKeys.PREDICT:
        return v1.estimator.EstimatorSpec(mode, predictions={"class_ids": tf.argmax(logits, 1),
                                                             "probabilities": tf.nn.softmax(logits)})
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == v1.estimator.ModeKeys.EVAL:
        return v1.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops={
            "accuracy": v1.metrics.accuracy(labels, tf.argmax(logits, 1))})
    train_op = v1.train.AdagradOptimizer(0.1).minimize(loss, v1.train.get_global_step())
    return v1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def head_model_fn(features, labels, mode):
    """TF 2.x's way: a head makes the spec, and a Keras optimizer whose `iterations` is the global step updates."""
    logits = v1.layers.dense(features["x"], 1, name="logits")
    optimizer = tf.keras.optimizers.legacy.Adagrad(0.1)
    optimizer.iterations = v1.train.get_or_create_global_step()
    return tf.estimator.LogisticRegressionHead().create_estimator_spec(
        features, mode, logits, labels, optimizer=optimizer, trainable_variables=v1.trainable_variables())


def serving_input_receiver_fn():
    """Serialized tf.Examples, as a model is served: every canned signature (classify, regress, predict)."""
    return v1.estimator.export.build_parsing_serving_input_receiver_fn(
        tf.feature_column.make_parse_example_spec(COLUMNS))()


def signatures(export_dir: str) -> dict:
    """Each signature of a SavedModel: its method and the keys of its inputs and outputs."""
    with tf.Graph().as_default(), v1.Session() as session:
        meta_graph = v1.saved_model.loader.load(session, [v1.saved_model.tag_constants.SERVING], export_dir)
    return {name: {"method": signature.method_name, "inputs": sorted(signature.inputs),
                   "outputs": sorted(signature.outputs)}
            for name, signature in sorted(meta_graph.signature_def.items())}


def write_signatures(export_dir: str, path: str) -> None:
    with open(path, "w") as out:
        json.dump(signatures(export_dir), out, indent=1, sort_keys=True)
        out.write("\n")


def write_metrics(metrics: dict, path: str) -> None:
    with open(path, "w") as out:
        json.dump({key: float(value) for key, value in metrics.items()}, out, indent=1, sort_keys=True)
        out.write("\n")


def _v2(name: str, regression: bool, **kwargs):
    return regression, lambda d: getattr(tf.estimator, name)(model_dir=d, **kwargs)


# name: (its labels: input_fn's `regression`, estimator of a model_dir)
CASES = {
    "v1_dnn_classifier": (False, lambda d: v1.estimator.DNNClassifier([8], COLUMNS, model_dir=d)),
    "v1_dnn_regressor": (True, lambda d: v1.estimator.DNNRegressor([8], COLUMNS, model_dir=d)),
    "v1_linear_classifier": (False, lambda d: v1.estimator.LinearClassifier(COLUMNS, model_dir=d)),
    "v1_linear_regressor": (True, lambda d: v1.estimator.LinearRegressor(COLUMNS, model_dir=d)),
    "v1_dnn_linear_combined_classifier": (False, lambda d: v1.estimator.DNNLinearCombinedClassifier(
        model_dir=d, linear_feature_columns=COLUMNS, dnn_feature_columns=COLUMNS, dnn_hidden_units=[8])),
    "v1_dnn_linear_combined_regressor": (True, lambda d: v1.estimator.DNNLinearCombinedRegressor(
        model_dir=d, linear_feature_columns=COLUMNS, dnn_feature_columns=COLUMNS, dnn_hidden_units=[8])),
    "v1_baseline_classifier": (False, lambda d: v1.estimator.BaselineClassifier(model_dir=d)),
    "v1_baseline_regressor": (True, lambda d: v1.estimator.BaselineRegressor(model_dir=d)),
    "custom_model_fn": (False, lambda d: v1.estimator.Estimator(custom_model_fn, model_dir=d)),
    "v2_dnn_classifier": _v2("DNNClassifier", False, hidden_units=[8], feature_columns=COLUMNS),
    "v2_dnn_regressor": _v2("DNNRegressor", True, hidden_units=[8], feature_columns=COLUMNS),
    "v2_linear_classifier": _v2("LinearClassifier", False, feature_columns=COLUMNS),
    "v2_linear_regressor": _v2("LinearRegressor", True, feature_columns=COLUMNS),
    "v2_dnn_linear_combined_classifier": _v2("DNNLinearCombinedClassifier", False, linear_feature_columns=COLUMNS,
                                             dnn_feature_columns=COLUMNS, dnn_hidden_units=[8]),
    "v2_dnn_linear_combined_regressor": _v2("DNNLinearCombinedRegressor", True, linear_feature_columns=COLUMNS,
                                            dnn_feature_columns=COLUMNS, dnn_hidden_units=[8]),
    "v2_baseline_classifier": _v2("BaselineClassifier", False),
    "v2_baseline_regressor": _v2("BaselineRegressor", True),
    # Batch normalization after each hidden layer.
    "v1_dnn_classifier_batch_norm": (False, lambda d: v1.estimator.DNNClassifier([8, 4], COLUMNS, model_dir=d,
                                                                                 batch_norm=True)),
    "v2_dnn_regressor_batch_norm": _v2("DNNRegressor", True, hidden_units=[8, 4], feature_columns=COLUMNS,
                                       batch_norm=True),
    # TF 2.x's heads, in the classes that take one and in a model_fn.
    "v2_dnn_estimator_multi_class_head": (False, lambda d: tf.estimator.DNNEstimator(
        tf.estimator.MultiClassHead(3), [8], COLUMNS, model_dir=d)),
    "v2_linear_estimator_poisson_head": (True, lambda d: tf.estimator.LinearEstimator(
        tf.estimator.PoissonRegressionHead(), COLUMNS, model_dir=d)),
    "v2_dnn_linear_combined_estimator_named_head": (False, lambda d: tf.estimator.DNNLinearCombinedEstimator(
        tf.estimator.BinaryClassHead(thresholds=[0.3], name="click"), model_dir=d, linear_feature_columns=COLUMNS,
        dnn_feature_columns=COLUMNS, dnn_hidden_units=[8])),
    "head_model_fn": (True, lambda d: tf.estimator.Estimator(head_model_fn, model_dir=d)),
    "v2_dnn_estimator_multi_head": ("multi", lambda d: tf.estimator.DNNEstimator(tf.estimator.MultiHead(
        [tf.estimator.BinaryClassHead(name="click"), tf.estimator.RegressionHead(name="value")], [1.0, 0.5]), [8],
        COLUMNS, model_dir=d)),
    "v2_dnn_estimator_multi_label_head": ("labels", lambda d: tf.estimator.DNNEstimator(tf.estimator.MultiLabelHead(
        3, thresholds=[0.4], classes_for_class_based_metrics=[1]), [8], COLUMNS, model_dir=d)),
}
