"""A user's TF1 model_fn trained by trainer.py (--model_fn=FILE.py:FUNCTION, model/user_fn.py): on the trainer's
own input, with its optimizer and levers, on a real cluster; and the model_fn that breaks the contract, or a
flag that cannot be, refused in one line."""

import re

import pytest
import tensorflow as tf
from absl import app

from ps_trainer import input as inputs
from ps_trainer import model
from ps_trainer.model import user_fn
from tests.support import ROOT, describe, finished, read_flags

PROGRAM = ROOT / "tests" / "programs" / "clicks_model_fn.py"
CLICKS = ["--dataset=clicks", "--model_dir=/tmp/unused"]


@pytest.mark.pure
def test_model_fn_flags_name_the_model_and_their_params_and_what_cannot_be_is_refused_in_one_line(tmp_path,
                                                                                                  monkeypatch):
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "0")  # this process's own, which loading a model_fn would set
    cfg = read_flags(f"--model_fn={PROGRAM}:model_fn", "--model_fn_params=dimension=4,hidden_units=[8],name=x",
                     *CLICKS)
    assert (cfg.model.name, cfg.model.model_fn) == ("model_fn", f"{PROGRAM}:model_fn")
    assert user_fn.params_of(cfg.model.model_fn_params) == {"dimension": 4, "hidden_units": [8], "name": "x"}
    missing = tmp_path / "missing.py"
    for args, message in (
            ([f"--model_fn={missing}:model_fn"], f"--model_fn={missing}:model_fn: {missing} is not a file"),
            ([f"--model_fn={PROGRAM}"], f"--model_fn={PROGRAM}: give the file and the function"),
            ([f"--model_fn={PROGRAM}:other"], f"--model_fn={PROGRAM}:other: {PROGRAM} has no function other"),
            ([f"--model_fn={PROGRAM}:model_fn", "--model=wide_deep"], "is the model: drop --model=wide_deep"),
            (["--model=model_fn"], "--model=model_fn needs --model_fn=FILE.py:FUNCTION"),
            ([f"--model_fn={PROGRAM}:model_fn", "--model_fn_params=dimension"], "'dimension' is not key=value")):
        with pytest.raises(app.UsageError, match=re.escape(message)):
            read_flags(*args, *CLICKS)


def spec_with(**fields):
    """A model_fn returning an EstimatorSpec-like value with `fields` over a one-layer model."""
    def model_fn(features, labels, mode):
        weights = tf.compat.v1.get_variable("weights", [2, 2])
        logits = tf.matmul(tf.stack([features["price"], features["hour"]], axis=1), weights)
        loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits) if labels is not None else None
        made = {"predictions": {"logits": logits}, "loss": loss, "train_op": None, "mode": mode}
        made.update({key: value(logits, loss) for key, value in fields.items()})
        return type("Spec", (), made)
    return model_fn


@pytest.mark.inprocess
@pytest.mark.parametrize("fields, message", [
    ({"train_op": lambda logits, loss: tf.no_op()}, "its EstimatorSpec has a train_op"),
    ({"predictions": lambda logits, loss: {"probabilities": logits}}, "predictions are not the logits"),
    ({"loss": lambda logits, loss: None}, "its EstimatorSpec has no loss in train mode"),
])
def test_a_model_fn_that_breaks_the_contract_is_refused_naming_what(monkeypatch, fields, message):
    monkeypatch.setattr(user_fn, "load", lambda location: spec_with(**fields))
    model_cfg = model.ModelConfig(name="model_fn", model_fn="f.py:model_fn")
    data_spec = inputs.spec(inputs.DataConfig(name="clicks"))
    with tf.Graph().as_default(), pytest.raises(user_fn.ModelFnError, match=re.escape(message)):
        model.build({"price": tf.zeros([4]), "hour": tf.zeros([4])}, tf.zeros([4], tf.int64), model_cfg, data_spec,
                    training=True)


@pytest.mark.e2e
def test_a_model_fn_trains_on_a_cluster_with_local_steps_on_every_worker_and_learns(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=2, trainer_args=[
        f"--model_fn={PROGRAM}:model_fn", "--dataset=clicks", "--model_fn_params=dimension=8",
        "--optimizer=adam", "--learning_rate=0.01", "--local_steps=10", "--train_steps=3000",
        "--synthetic_examples=60000"])  # 30,000 a worker: 4,000 (the suite's default) it learns by heart
    cluster.start_all()
    codes = cluster.wait(timeout=240)
    assert set(codes.values()) == {0}, describe(cluster)
    chief, other = (finished(cluster.log("worker", index)) for index in (0, 1))
    assert int(chief["global_step"]) >= 3000 and int(chief["local_steps"]) > 0, chief
    assert int(other["local_steps"]) > 0, other  # the other worker trained too
    # Held-out, not a batch: the clicks' labels follow from the IDs (chance is 0.5; measured 0.73).
    assert float(chief["heldout_auc"]) > 0.65, chief
    step = int(chief["global_step"])
    assert (cluster.model_dir / "export" / str(step) / "saved_model.pb").is_file()
