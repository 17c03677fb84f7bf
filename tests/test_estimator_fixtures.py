"""Checkpoints the real Estimator wrote on TensorFlow 2.15 (tests/data/tf215/, made by
scripts/make_tf215_fixtures.py from tests/programs/tf215_cases.py) continue here, for each canned class as the V2
class (`tf.estimator.<Canned>`) and as TF1's V1 class (`tf.compat.v1.estimator.<Canned>`) and a custom model_fn:
a program moved with its model_dir evaluates its checkpoint to the figures TF 2.15 gave, trains on from the
global step and the optimizer state it had, and exports the trained model with the signatures TF 2.15 exported."""

import json
import shutil
import sys

import numpy as np
import pytest

from tests.support import ROOT, tf_session

FIXTURES = ROOT / "tests" / "data" / "tf215"
sys.path.insert(0, str(ROOT / "tests" / "programs"))
CASES = sorted(path.name for path in FIXTURES.iterdir() if path.is_dir())
SLOTS = ("Adagrad", "Ftrl", "accumulator")  # V1's slots are <variable>/<Optimizer>, V2's <variable>/accumulator


def slots(model_dir) -> dict[str, np.ndarray]:
    """The optimizer's accumulators in the latest checkpoint (Adagrad's; Ftrl's first), by their name in TF1's
    layout (TF 2.x's V1 classes wrote <variable>/t_0/<slot> and <variable>/part_0/<slot>, which the chief reads
    and saves as <variable>/<slot>)."""
    import tensorflow as tf
    reader = tf.train.load_checkpoint(str(model_dir))
    return {"/".join(part for part in name.split("/") if part not in ("t_0", "part_0")): reader.get_tensor(name)
            for name in reader.get_variable_to_shape_map() if name.split("/")[-1] in SLOTS}


@pytest.mark.pure
def test_the_fixtures_cover_every_canned_class_in_both_spellings_batch_norm_a_custom_model_fn_and_tf2s_heads():
    kinds = ("dnn_classifier", "dnn_regressor", "linear_classifier", "linear_regressor",
             "dnn_linear_combined_classifier", "dnn_linear_combined_regressor", "baseline_classifier",
             "baseline_regressor")
    others = ("v1_dnn_classifier_batch_norm", "v2_dnn_regressor_batch_norm", "v2_dnn_estimator_multi_class_head",
              "v2_linear_estimator_poisson_head", "v2_dnn_linear_combined_estimator_named_head", "head_model_fn",
              "v2_dnn_estimator_multi_head", "v2_dnn_estimator_multi_label_head")
    assert CASES == sorted([f"v{version}_{kind}" for version in (1, 2) for kind in kinds] + ["custom_model_fn",
                                                                                           *others])


@pytest.mark.inprocess
@pytest.mark.parametrize("case", CASES)
def test_a_tf215_checkpoint_evaluates_as_there_trains_on_from_its_state_and_exports_its_signatures(case, tmp_path):
    import ps_trainer.estimator  # noqa: F401  (the one line a program adds)
    import tf215_cases

    model_dir = tmp_path / "model"
    shutil.copytree(FIXTURES / case, model_dir)
    regression, make = tf215_cases.CASES[case]
    estimator = make(str(model_dir))
    # TF 2.15's evaluation of the same checkpoint on the same data: the same keys and figures (the V2 classes'
    # loss is the batch's mean, the V1 classes' its sum).
    reference = json.loads((FIXTURES / case / "metrics.json").read_text())
    evaluated = estimator.evaluate(tf215_cases.input_fn(regression, epochs=1))
    assert sorted(evaluated) == sorted(reference)
    for key, value in reference.items():
        assert evaluated[key] == pytest.approx(value, rel=1e-3, abs=1e-4), key

    before = slots(model_dir)
    estimator.train(tf215_cases.input_fn(regression), max_steps=tf215_cases.STEPS + 10)
    assert estimator.get_variable_value("global_step") == tf215_cases.STEPS + 10
    # The accumulators went on from TF 2.15's: each only grows, so every one is at least what it was (a
    # fresh start, from the initial accumulator value, would be below TF 2.15's after 10 steps of 20).
    after = slots(model_dir)
    assert set(after) == set(before) and before, (sorted(before), sorted(after))
    for name, value in before.items():
        assert after[name].shape == value.shape and np.all(after[name] >= value - 1e-6), name
        assert np.any(after[name] > value), name  # and it trained on
    exported = estimator.export_saved_model(str(tmp_path / "export"), tf215_cases.serving_input_receiver_fn)
    assert tf215_cases.signatures(exported.decode()) == json.loads((FIXTURES / case / "signatures.json").read_text())


@pytest.mark.inprocess
@pytest.mark.parametrize("case", ["v2_dnn_linear_combined_classifier", "v1_dnn_linear_combined_classifier"])
def test_warm_start_from_a_tf215_checkpoint_loads_its_weights_into_a_new_model_dir(case, tmp_path):
    import tensorflow as tf

    import ps_trainer.estimator  # noqa: F401  (the one line a program adds)
    import tf215_cases
    v1 = tf.compat.v1
    # The fixture's class with plain gradient descent at a learning rate of 0: the weights stay as warm start
    # loaded them, so the evaluation after a step is TF 2.15's of its checkpoint.
    if case.startswith("v2_"):
        import tf_keras
        make = tf.estimator.DNNLinearCombinedClassifier
        optimizers = {"linear_optimizer": tf_keras.optimizers.legacy.SGD(0.0),
                      "dnn_optimizer": tf_keras.optimizers.legacy.SGD(0.0)}
    else:
        make = v1.estimator.DNNLinearCombinedClassifier
        optimizers = {"linear_optimizer": v1.train.GradientDescentOptimizer(0.0),
                      "dnn_optimizer": v1.train.GradientDescentOptimizer(0.0)}
    estimator = make(model_dir=str(tmp_path / "new"), linear_feature_columns=tf215_cases.COLUMNS,
                     dnn_feature_columns=tf215_cases.COLUMNS, dnn_hidden_units=[8],
                     warm_start_from=str(FIXTURES / case), **optimizers)
    estimator.train(tf215_cases.input_fn(False), max_steps=1)
    assert estimator.get_variable_value("global_step") == 1  # warm start loads weights, not the run's step
    reference = json.loads((FIXTURES / case / "metrics.json").read_text())
    evaluated = estimator.evaluate(tf215_cases.input_fn(False, epochs=1))
    for key in ("accuracy", "auc", "average_loss"):
        assert evaluated[key] == pytest.approx(reference[key], rel=1e-3, abs=1e-4), key


@pytest.mark.inprocess
def test_a_v2_class_refuses_in_one_line_what_tf215s_refused():
    import tensorflow as tf

    import ps_trainer.estimator  # noqa: F401  (the one line a program adds)
    v1 = tf.compat.v1
    numeric = [tf.feature_column.numeric_column("x")]
    with tf.Graph().as_default():  # TF1's shared embedding columns are made in a graph only
        tf1_only = v1.feature_column.shared_embedding_columns([v1.feature_column.categorical_column_with_identity(
            "a", 10)], 4)
    refusals = {
        "Invalid loss_reduction: none": lambda: tf.estimator.LinearClassifier(numeric, loss_reduction="none"),
        "Received a feature column from TensorFlow v1, but this is a TensorFlow v2 Estimator":
            lambda: tf.estimator.DNNClassifier([4], tf1_only)}
    for said, make in refusals.items():
        with pytest.raises((ValueError, NotImplementedError)) as refused:
            make()
        assert said in str(refused.value) and "\n" not in str(refused.value), str(refused.value)
    tf.estimator.DNNClassifier([4], numeric, loss_reduction="sum")  # Keras's other reduction is taken


@pytest.mark.inprocess
def test_batch_norm_trains_and_keeps_its_moving_averages_as_keras_batchnormalization_does():
    import tensorflow as tf
    import tf_keras

    from ps_trainer.estimator import canned
    v1 = tf.compat.v1
    batches = [np.random.RandomState(seed).normal(2.0, 3.0, size=(16, 4)).astype(np.float32) for seed in range(3)]
    with tf.Graph().as_default():
        given = v1.placeholder(tf.float32, [None, 4])
        keras = tf_keras.layers.BatchNormalization(momentum=canned.BATCH_NORM_MOMENTUM,
                                                   epsilon=canned.BATCH_NORM_EPSILON)
        keras_training, keras_serving = keras(given, training=True), keras(given, training=False)
        updates = []
        with v1.variable_scope("dnn"):
            training = canned._batch_normalized(given, 0, True, updates)  # noqa: SLF001  (the layer alone)
        with v1.variable_scope("dnn", reuse=True):
            serving = canned._batch_normalized(given, 0, False, [])  # noqa: SLF001
        assert len(updates) == 2 and set(updates) <= set(v1.get_collection(v1.GraphKeys.UPDATE_OPS))
        with tf_session() as session:
            session.run(v1.global_variables_initializer())
            for batch in batches:
                ours, theirs = session.run((training, keras_training), {given: batch})
                np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
                session.run([*updates, *keras.updates], {given: batch})
            ours, theirs = session.run((serving, keras_serving), {given: batches[0]})
            np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
            [ours_moving] = v1.global_variables("dnn/batchnorm_0/moving_mean")
            ours_moving, theirs_moving = session.run((ours_moving, keras.moving_mean))
    np.testing.assert_allclose(ours_moving, theirs_moving, rtol=1e-5)
    assert np.all(ours_moving > 0.004)  # three updates of 0.001 toward the batches' mean, about 2


@pytest.mark.inprocess
@pytest.mark.parametrize("case, optimizers", [("v2_dnn_linear_combined_classifier", "Adagrad and Ftrl"),
                                              ("head_model_fn", "Adagrad"),
                                              ("v2_dnn_estimator_multi_head", "Adagrad")])
def test_a_tf215_v2_checkpoint_trains_on_under_a_lever_with_its_keras_optimizers(case, optimizers, tmp_path,
                                                                                  monkeypatch, caplog):
    # PS_TRAINER_FLAGS="--local_steps=5" in one process: the lever takes the Keras optimizers TF 2.x's V2 class (or
    # a head's model_fn, or a MultiHead's, whose scope is `training_<n>`) built, and counts the global step itself;
    # the second optimizer's own count (Ftrl's) goes on from TF 2.15's; the worker-side copies' slots are never
    # saved.
    import tensorflow as tf

    import ps_trainer.estimator  # noqa: F401  (the one line a program adds)
    import tf215_cases
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setenv("PS_TRAINER_FLAGS", "--local_steps=5")
    caplog.set_level("INFO", logger="tensorflow")  # tf.compat.v1.logging's, where the Estimator logs
    model_dir = tmp_path / "model"
    shutil.copytree(FIXTURES / case, model_dir)
    regression, make = tf215_cases.CASES[case]
    estimator = make(str(model_dir))
    start = tf.train.load_checkpoint(str(FIXTURES / case))
    estimator.train(tf215_cases.input_fn(regression), max_steps=tf215_cases.STEPS + 100)
    assert f"PS_TRAINER_FLAGS --local_steps=5: the lever makes the update with the model_fn's {optimizers}" in (
        caplog.text)
    trained = tf.train.load_checkpoint(str(model_dir))
    assert trained.get_tensor("global_step") == tf215_cases.STEPS + 100
    saved = set(trained.get_variable_to_shape_map())
    assert not [name for name in saved if "local_copy" in name or "updates_here" in name], sorted(saved)
    weights = [name for name in saved if name.endswith(("kernel", "weights", "bias"))]
    assert weights and all(np.any(trained.get_tensor(name) != start.get_tensor(name)) for name in weights), weights
    if "training/Ftrl/iter" in saved:  # the linear model, a table on the ps: FTRL's state goes on from TF 2.15's
        assert trained.get_tensor("training/Ftrl/iter") == start.get_tensor("training/Ftrl/iter") + 100
        accumulator = "training/Ftrl/linear/linear_model/x/weights/accumulator"
        assert np.all(trained.get_tensor(accumulator) > start.get_tensor(accumulator)), accumulator
    # It learned on from TF 2.15's weights, at least as the same 100 steps without the lever do (the worker-side
    # copies' slots are the worker's own, started afresh: an Adagrad accumulator from its initial value).
    reference = json.loads((FIXTURES / case / "metrics.json").read_text())
    evaluated = estimator.evaluate(tf215_cases.input_fn(regression, epochs=1))
    monkeypatch.delenv("PS_TRAINER_FLAGS")
    shutil.copytree(FIXTURES / case, tmp_path / "plain")
    plain = make(str(tmp_path / "plain"))
    plain.train(tf215_cases.input_fn(regression), max_steps=tf215_cases.STEPS + 100)
    plainly = plain.evaluate(tf215_cases.input_fn(regression, epochs=1))
    assert evaluated["loss"] < reference["loss"] - 0.02, (evaluated, reference)
    assert evaluated["loss"] < plainly["loss"] * 1.05, (evaluated, plainly)
