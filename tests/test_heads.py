"""TF 2.x's heads (ps_trainer/estimator/heads.py) in a program's model_fn and in the *Estimator classes: their loss
as TF 2.15 computed it, their predictions, and what they refuse. The fixtures (tests/test_estimator_fixtures.py)
check them against checkpoints, figures and exports of the real Estimator on TF 2.15."""

import re

import numpy as np
import pytest


def _session_values(fetches):
    import tensorflow as tf

    from tests.support import tf_session
    with tf_session() as session:
        session.run(tf.compat.v1.tables_initializer())
        return session.run(fetches)


@pytest.mark.inprocess
def test_a_heads_loss_is_tf215s_weighted_mean_or_sum_plus_regularization_and_its_predictions_follow_its_link():
    import tensorflow as tf

    import ps_trainer.estimator  # noqa: F401  (the one line a program adds)
    logits = np.array([[2.0], [-1.0], [0.5], [0.0]], np.float32)
    labels = np.array([[1], [0], [0], [1]], np.int64)
    weights = np.array([[1.0], [2.0], [0.5], [0.0]], np.float32)
    cross_entropy = np.maximum(logits, 0) - logits * labels + np.log1p(np.exp(-np.abs(logits)))
    with tf.Graph().as_default():
        features = {"w": tf.constant(weights)}
        mean = tf.estimator.BinaryClassHead(weight_column="w").loss(labels, logits, features)
        summed = tf.estimator.BinaryClassHead(weight_column="w", loss_reduction="sum").loss(
            labels, logits, features, regularization_losses=[tf.constant(0.5)])
        counts = np.array([[3.0], [0.0], [1.0], [2.0]], np.float32)
        poisson = tf.estimator.PoissonRegressionHead(compute_full_loss=False)
        predicted = poisson.predictions(logits)
        poisson_loss = poisson.loss(counts, logits)
        multi = tf.estimator.MultiClassHead(3, label_vocabulary=["a", "b", "c"]).predictions(
            np.array([[0.1, 2.0, -1.0]], np.float32), keys=["class_ids", "classes"])
        values = _session_values((mean, summed, predicted, poisson_loss, multi))
    mean, summed, predicted, poisson_loss, multi = values
    # SUM_OVER_BATCH_SIZE: the weighted losses' sum over the batch's size (4), as Keras reduced it.
    assert mean == pytest.approx(float(np.sum(cross_entropy * weights) / 4), rel=1e-5)
    assert summed == pytest.approx(float(np.sum(cross_entropy * weights)) + 0.5, rel=1e-5)
    assert sorted(predicted) == ["logits", "predictions"]
    np.testing.assert_allclose(predicted["predictions"], np.exp(logits), rtol=1e-5)
    assert poisson_loss == pytest.approx(float(np.mean(np.exp(logits) - counts * logits)), rel=1e-5)
    assert sorted(multi) == ["class_ids", "classes"] and multi["classes"].tolist() == [[b"b"]]


@pytest.mark.inprocess
def test_a_multi_label_heads_loss_averages_each_classs_cross_entropy_whatever_form_its_labels_take():
    import tensorflow as tf

    import ps_trainer.estimator  # noqa: F401  (the one line a program adds)
    logits = np.array([[2.0, -1.0, 0.5], [0.0, 1.5, -2.0]], np.float32)
    multi_hot = np.array([[1, 0, 1], [0, 0, 1]], np.int64)
    weights = np.array([[1.0], [3.0]], np.float32)
    cross_entropy = np.maximum(logits, 0) - logits * multi_hot + np.log1p(np.exp(-np.abs(logits)))
    expected = float(np.sum(cross_entropy.mean(axis=1, keepdims=True) * weights) / 2)
    with tf.Graph().as_default():
        features = {"w": tf.constant(weights)}
        ids = tf.SparseTensor([[0, 0], [0, 1], [1, 0]], tf.constant([0, 2, 2], tf.int64), [2, 2])
        names = tf.SparseTensor([[0, 0], [0, 1], [1, 0]], tf.constant(["a", "c", "c"]), [2, 2])
        losses = [tf.estimator.MultiLabelHead(3, weight_column="w").loss(multi_hot, logits, features),
                  tf.estimator.MultiLabelHead(3, weight_column="w").loss(ids, logits, features),
                  tf.estimator.MultiLabelHead(3, weight_column="w", label_vocabulary=["a", "b", "c"]).loss(
                      names, logits, features)]
        predicted = tf.estimator.MultiLabelHead(3, label_vocabulary=["a", "b", "c"]).predictions(logits)
        out_of_range = tf.estimator.MultiLabelHead(3).loss(np.array([[2, 0, 1]], np.int64), logits[:1])
        values = _session_values((losses, predicted))
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"indicator Tensor with values in \[0, 1\]"):
            _session_values(out_of_range)
    losses, predicted = values
    assert losses == pytest.approx([expected] * 3, rel=1e-5)
    assert sorted(predicted) == ["classes", "logits", "probabilities"]
    np.testing.assert_allclose(predicted["probabilities"], 1 / (1 + np.exp(-logits)), rtol=1e-5)
    assert predicted["classes"].tolist() == [[b"a", b"b", b"c"]] * 2
    for said, make in {
            "n_classes must be > 1 for multi-label classification. Given: 1": lambda: tf.estimator.MultiLabelHead(1),
            "label_vocabulary must be provided when classes_for_class_based_metrics are strings.":
                lambda: tf.estimator.MultiLabelHead(3, classes_for_class_based_metrics=["a"]),
            "All classes_for_class_based_metrics must be in range [0, 2]. Given: 3":
                lambda: tf.estimator.MultiLabelHead(3, classes_for_class_based_metrics=[3])}.items():
        with pytest.raises(ValueError, match=re.escape(said)):
            make()


@pytest.mark.inprocess
def test_a_head_refuses_in_tf215s_words_what_tf215_refused():
    import tensorflow as tf

    import ps_trainer.estimator  # noqa: F401  (the one line a program adds)
    refusals = {
        "n_classes must be > 2: 2.": lambda: tf.estimator.MultiClassHead(2),
        "thresholds not in (0, 1)": lambda: tf.estimator.BinaryClassHead(thresholds=[1.0]),
        "loss_fn must contain argument: labels": lambda: tf.estimator.RegressionHead(loss_fn=lambda logits: logits),
        "loss_fn has unexpected args: ['weights']":
            lambda: tf.estimator.RegressionHead(loss_fn=lambda labels, logits, weights: logits),
        "Invalid loss_reduction: none": lambda: tf.estimator.BinaryClassHead(loss_reduction="none"),
        "label_vocabulary should be a list or a tuple": lambda: tf.estimator.BinaryClassHead(label_vocabulary="ab"),
        "Invalid label_dimension 0.": lambda: tf.estimator.RegressionHead(label_dimension=0)}
    for said, make in refusals.items():
        with pytest.raises(ValueError) as refused:
            make()
        assert said in str(refused.value) and "\n" not in str(refused.value), str(refused.value)
    head = tf.estimator.RegressionHead()
    with tf.Graph().as_default():
        logits, labels = tf.zeros([2, 1]), tf.ones([2, 1])
        for said, given in (("train_op_fn and optimizer cannot both be set.",
                             {"optimizer": tf.compat.v1.train.GradientDescentOptimizer(0.1), "train_op_fn": tf.no_op}),
                            ("train_op_fn and optimizer cannot both be None.", {})):
            with pytest.raises(ValueError, match=said):
                head.create_estimator_spec({}, tf.estimator.ModeKeys.TRAIN, logits, labels, **given)


@pytest.mark.inprocess
def test_tf1s_estimator_classes_take_a_tf2_head_and_train_with_tf1s_optimizers(tmp_path):
    import tensorflow as tf

    import ps_trainer.estimator  # noqa: F401  (the one line a program adds)
    v1 = tf.compat.v1
    rng = np.random.RandomState(0)
    x = rng.normal(size=(512, 3)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5], np.float32))[:, None]
    columns = [tf.feature_column.numeric_column("x", shape=[3])]
    # TF 2.15's V1 class passed its tf.compat.v1.train optimizer to the head, which a V2 head refused; here the
    # V1 class updates with it (Ftrl at min(0.2, 1/sqrt(columns)), TF1's slots <variable>/Ftrl).
    model = v1.estimator.LinearEstimator(tf.estimator.RegressionHead(), columns, model_dir=str(tmp_path),
                                         optimizer=lambda: v1.train.FtrlOptimizer(0.5))

    def input_fn(epochs):
        return v1.estimator.inputs.numpy_input_fn({"x": x}, y, batch_size=64, num_epochs=epochs, shuffle=epochs is None)

    model.train(input_fn(None), max_steps=5)
    early = model.evaluate(input_fn(1))["average_loss"]
    model.train(input_fn(None), max_steps=200)
    late = model.evaluate(input_fn(1))
    assert late["global_step"] == 200 and late["average_loss"] < 0.2 * early, (early, late)
    assert sorted(late) == ["average_loss", "global_step", "label/mean", "loss", "prediction/mean"]
    names = {name for name, _ in tf.train.list_variables(str(tmp_path))}
    assert {"linear/linear_model/x/weights", "linear/linear_model/x/weights/Ftrl"} <= names


@pytest.mark.inprocess
def test_a_multi_head_predicts_by_head_and_key_and_refuses_an_unnamed_head_or_logits_of_another_width(tmp_path):
    import itertools
    import shutil
    import sys

    import tensorflow as tf

    import ps_trainer.estimator  # noqa: F401  (the one line a program adds)
    from tests.support import ROOT
    sys.path.insert(0, str(ROOT / "tests" / "programs"))
    import tf215_cases

    # TF 2.15's checkpoint of a DNNEstimator over a MultiHead (tests/data/tf215/), predicted here.
    shutil.copytree(ROOT / "tests" / "data" / "tf215" / "v2_dnn_estimator_multi_head", tmp_path / "model")
    _, make = tf215_cases.CASES["v2_dnn_estimator_multi_head"]
    predictions = list(itertools.islice(make(str(tmp_path / "model")).predict(
        tf215_cases.input_fn("multi", epochs=1)), 3))
    assert len(predictions) == 3 and ("value", "predictions") in predictions[0]
    assert {key for key in predictions[0] if key[0] == "click"} == {
        ("click", key) for key in ("logits", "logistic", "probabilities", "class_ids", "classes", "all_class_ids",
                                   "all_classes")}
    assert predictions[0]["click", "probabilities"].sum() == pytest.approx(1.0, rel=1e-5)
    with pytest.raises(ValueError, match="All given heads must have name specified"):
        tf.estimator.MultiHead([tf.estimator.BinaryClassHead(name="a"), tf.estimator.RegressionHead()])
    head = tf.estimator.MultiHead([tf.estimator.BinaryClassHead(name="a"), tf.estimator.MultiClassHead(3, name="b")])
    assert head.logits_dimension == 4 and head.name == "a_b"
    with tf.Graph().as_default(), pytest.raises(ValueError, match="should equal 4 but is 3"):
        head.predictions(tf.zeros([2, 3]))


@pytest.mark.inprocess
def test_tf1s_logit_fn_builders_give_the_canned_classes_logits_by_their_variable_names(tmp_path):
    import shutil
    import sys

    import tensorflow as tf

    import ps_trainer.estimator  # noqa: F401  (the one line a program adds)
    from tests.support import ROOT
    sys.path.insert(0, str(ROOT / "tests" / "programs"))
    import tf215_cases
    v1 = tf.compat.v1
    experimental = v1.estimator.experimental
    dnn_logits = experimental.dnn_logit_fn_builder(1, [8], tf215_cases.COLUMNS, tf.nn.relu, None, None, False)
    linear_logits = experimental.linear_logit_fn_builder(1, tf215_cases.COLUMNS)

    def model_fn(features, labels, mode):
        with v1.variable_scope("dnn"):
            logits = dnn_logits(features, mode)
        with v1.variable_scope("linear"):
            logits += linear_logits(features)
        return tf.estimator.BinaryClassHead(loss_reduction="sum").create_estimator_spec(
            features, mode, logits, labels, train_op_fn=lambda loss: v1.assign_add(v1.train.get_global_step(), 1))

    # TF 2.15's checkpoint of TF1's wide & deep class, evaluated by a model_fn of the builders: TF 2.15's figures.
    shutil.copytree(ROOT / "tests" / "data" / "tf215" / "v1_dnn_linear_combined_classifier", tmp_path / "model")
    evaluated = tf.estimator.Estimator(model_fn, str(tmp_path / "model")).evaluate(tf215_cases.input_fn(False, 1))
    reference = tf215_cases.json.loads(
        (ROOT / "tests" / "data" / "tf215" / "v1_dnn_linear_combined_classifier" / "metrics.json").read_text())
    for key in ("accuracy", "auc", "average_loss", "loss"):
        assert evaluated[key] == pytest.approx(reference[key], rel=1e-3), key
    with pytest.raises(ValueError, match="units must be an int"):
        experimental.linear_logit_fn_builder(1.0, tf215_cases.COLUMNS)


@pytest.mark.inprocess
def test_a_programs_own_head_subclasses_tf_estimator_head_and_trains_in_a_canned_estimator(tmp_path):
    # TF 2.x's tf.estimator.Head: the abstract interface a program's own head implements (every member, metrics()
    # and update_metrics() too, as TF 2.15 asked), which the heads of tf.estimator are instances of.
    import tensorflow as tf

    import ps_trainer.estimator  # noqa: F401  (the one line a program adds)
    v1 = tf.compat.v1
    assert isinstance(tf.estimator.RegressionHead(), tf.estimator.Head) and tf.compat.v1.estimator.Head is (
        tf.estimator.Head)

    class Incomplete(tf.estimator.Head):
        name, logits_dimension, loss_reduction = None, 1, "sum_over_batch_size"

        def loss(self, labels, logits, features=None, mode=None, regularization_losses=None):
            return tf.reduce_mean(tf.square(logits - labels))

        def predictions(self, logits, keys=None):
            return {"predictions": logits}

        def create_estimator_spec(self, features, mode, logits, labels=None, optimizer=None, trainable_variables=None,
                                  train_op_fn=None, update_ops=None, regularization_losses=None):
            raise NotImplementedError

    with pytest.raises(TypeError, match="metrics"):
        Incomplete()

    class Doubled(Incomplete):
        """A regression of twice the logits, by the heads of tf.estimator."""

        def __init__(self):
            self._regression = tf.estimator.RegressionHead()

        def metrics(self, regularization_losses=None):
            raise NotImplementedError

        def update_metrics(self, eval_metrics, features, logits, labels, mode=None, regularization_losses=None):
            raise NotImplementedError

        def create_estimator_spec(self, features, mode, logits, labels=None, optimizer=None, trainable_variables=None,
                                  train_op_fn=None, update_ops=None, regularization_losses=None):
            return self._regression.create_estimator_spec(features, mode, 2 * logits, labels, optimizer,
                                                          trainable_variables, train_op_fn, update_ops)

    rng = np.random.RandomState(0)
    x = rng.normal(size=(512, 3)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5], np.float32))[:, None]
    model = v1.estimator.LinearEstimator(Doubled(), [tf.feature_column.numeric_column("x", shape=[3])],
                                         model_dir=str(tmp_path), optimizer=lambda: v1.train.FtrlOptimizer(0.5))

    def input_fn(epochs):
        return v1.estimator.inputs.numpy_input_fn({"x": x}, y, batch_size=64, num_epochs=epochs, shuffle=epochs is None)

    model.train(input_fn(None), max_steps=200)
    assert model.evaluate(input_fn(1))["average_loss"] < 0.1
    weights = model.get_variable_value("linear/linear_model/x/weights")[:, 0]
    np.testing.assert_allclose(weights, [0.5, -1.0, 0.25], atol=0.1)  # half of y's: the head doubles the logits


@pytest.mark.inprocess
def test_a_heads_keras_metric_objects_give_the_keys_and_figures_of_its_own_evaluation():
    # TF 2.x's head.metrics() and update_metrics(): Keras metric objects a model_fn puts in its eval_metric_ops, with
    # the keys and, over the same batches, the figures of the evaluation create_estimator_spec builds.
    import tensorflow as tf

    import ps_trainer.estimator  # noqa: F401  (the one line a program adds)
    from ps_trainer.estimator import heads
    from tests.support import tf_session
    v1 = tf.compat.v1
    rng = np.random.RandomState(0)
    batch = 64
    weights = rng.uniform(0.5, 2.0, size=(batch, 1)).astype(np.float32)
    cases = {
        "binary": (tf.estimator.BinaryClassHead(weight_column="w", thresholds=[0.3, 0.7]), 1,
                   rng.randint(0, 2, size=(batch, 1))),
        "named_multi_class": (tf.estimator.MultiClassHead(3, name="kind"), 3, rng.randint(0, 3, size=(batch, 1))),
        "regression": (tf.estimator.RegressionHead(label_dimension=2, weight_column="w"), 2,
                       rng.normal(size=(batch, 2)).astype(np.float32)),
        "multi_label": (tf.estimator.MultiLabelHead(3, thresholds=[0.5], classes_for_class_based_metrics=[1]), 3,
                        rng.randint(0, 2, size=(batch, 3))),
        "multi_head": (tf.estimator.MultiHead([tf.estimator.BinaryClassHead(name="click"),
                                               tf.estimator.RegressionHead(name="dwell")]), 2,
                       {"click": rng.randint(0, 2, size=(batch, 1)),
                        "dwell": rng.normal(size=(batch, 1)).astype(np.float32)}),
    }
    for case, (head, width, labels) in cases.items():
        with tf.Graph().as_default():
            logits = tf.constant(rng.normal(size=(batch, width)).astype(np.float32))
            features = {"w": tf.constant(weights)}
            regularization = [tf.constant(0.25)]
            spec = head.create_estimator_spec(features, tf.estimator.ModeKeys.EVAL, logits, labels,
                                              regularization_losses=regularization)
            updated = head.update_metrics(head.metrics(regularization_losses=regularization), features, logits, labels,
                                          regularization_losses=regularization)
            keras = tf.estimator.EstimatorSpec(tf.estimator.ModeKeys.EVAL, loss=spec.loss,
                                               eval_metric_ops=updated).eval_metric_ops
            assert sorted(keras) == sorted(spec.eval_metric_ops), case
            assert all(not isinstance(metric, tuple) for metric in updated.values()), case
            with tf_session() as session:
                session.run([v1.local_variables_initializer(), v1.tables_initializer()])
                session.run([update for _, update in [*spec.eval_metric_ops.values(), *keras.values()]])
                figures = session.run({key: value for key, (value, _) in spec.eval_metric_ops.items()})
                from_keras = session.run({key: value for key, (value, _) in keras.items()})
        for key, figure in figures.items():
            np.testing.assert_allclose(from_keras[key], figure, rtol=1e-4, atol=1e-6, err_msg=f"{case}: {key}")
    assert issubclass(heads.BinaryClassHead, tf.estimator.Head)
