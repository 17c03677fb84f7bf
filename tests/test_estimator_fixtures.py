"""Checkpoints the real Estimator wrote on TensorFlow 2.15 (tests/data/tf215/, made by
scripts/make_tf215_fixtures.py from tests/programs/tf215_cases.py) continue here: a program moved with its
model_dir trains on from the global step and the optimizer state it had, and evaluates."""

import shutil
import sys

import numpy as np
import pytest

from tests.support import ROOT

FIXTURES = ROOT / "tests" / "data" / "tf215"
sys.path.insert(0, str(ROOT / "tests" / "programs"))


def slots(model_dir) -> dict[str, np.ndarray]:
    """The optimizer's accumulators in the latest checkpoint (Adagrad's; Ftrl's first), by their variable."""
    import tensorflow as tf
    reader = tf.train.load_checkpoint(str(model_dir))
    found = {}
    for name in reader.get_variable_to_shape_map():
        parts = name.split("/")
        if parts[-1] in ("Adagrad", "Ftrl"):
            found["/".join(part for part in parts[:-1] if part not in ("t_0", "part_0"))] = reader.get_tensor(name)
    return found


@pytest.mark.inprocess
@pytest.mark.parametrize("case", ["v1_dnn_classifier", "v1_dnn_regressor", "v1_linear_classifier",
                                  "v1_linear_regressor", "v1_dnn_linear_combined_classifier",
                                  "v1_dnn_linear_combined_regressor", "custom_model_fn"])
def test_a_tf215_checkpoint_trains_on_from_its_step_and_optimizer_state_and_evaluates(case, tmp_path):
    import ps_trainer.estimator  # noqa: F401  (the one line a program adds)
    import tf215_cases

    model_dir = tmp_path / "model"
    shutil.copytree(FIXTURES / case, model_dir)
    before = slots(model_dir)
    regression, make = tf215_cases.CASES[case]
    estimator = make(str(model_dir))
    estimator.train(tf215_cases.input_fn(regression), max_steps=tf215_cases.STEPS + 10)
    assert estimator.get_variable_value("global_step") == tf215_cases.STEPS + 10
    # The accumulators went on from TF 2.15's: each only grows, so every one is at least what it was (a
    # fresh start, from the initial accumulator value, would be below TF 2.15's after 10 steps of 20).
    after = slots(model_dir)
    assert set(after) == set(before) and before, (sorted(before), sorted(after))
    for name, value in before.items():
        assert after[name].shape == value.shape and np.all(after[name] >= value - 1e-6), name
        assert np.any(after[name] > value), name  # and it trained on
    metrics = estimator.evaluate(tf215_cases.input_fn(regression, epochs=1))
    assert metrics["global_step"] == tf215_cases.STEPS + 10 and np.isfinite(metrics["loss"])
