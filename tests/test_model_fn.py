"""A user's TF1 model_fn trained by trainer.py (--model_fn=FILE.py:FUNCTION, model/user_fn.py): on the trainer's
own input, with its optimizer and levers, on a real cluster; and the model_fn that breaks the contract, or a
flag that cannot be, refused in one line."""

import os
import re

import numpy as np
import pytest
import tensorflow as tf
from absl import app

from ps_trainer import input as inputs
from ps_trainer import model
from ps_trainer.launch.forked import ForkedTask
from ps_trainer.model import user_fn
from ps_trainer.model.graph_tables import GraphTables
from ps_trainer.model.dynamic import storage as table_storage
from ps_trainer.training import graph as train_graph
from tests.support import (ROOT, describe, finished, read_flags, run_trainer, stop_process_group, tf_session,
                           write_click_csvs)

PROGRAM = ROOT / "tests" / "programs" / "clicks_model_fn.py"
DYNAMIC = ROOT / "tests" / "programs" / "clicks_dynamic_model_fn.py"  # user and item in dynamic tables
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
    flagged = tmp_path / "flagged.py"  # a program whose flags are defined where it is imported
    flagged.write_text("from absl import flags\n\nflags.DEFINE_string('model_dir', None, 'Where.')\n\n\n"
                       "def model_fn(features, labels, mode):\n    pass\n")
    for args, message in (
            ([f"--model_fn={flagged}:model_fn"], f"--model_fn={flagged}:model_fn: {flagged} defines an absl flag "
             "trainer.py defines too (--model_dir): define the program's flags where it runs as a program"),
            ([f"--model_fn={missing}:model_fn"], f"--model_fn={missing}:model_fn: {missing} is not a file"),
            ([f"--model_fn={PROGRAM}"], f"--model_fn={PROGRAM}: give the file and the function"),
            ([f"--model_fn={PROGRAM}:other"], f"--model_fn={PROGRAM}:other: {PROGRAM} has no function other"),
            ([f"--model_fn={PROGRAM}:model_fn", "--model=wide_deep"], "is the model: drop --model=wide_deep"),
            (["--model=model_fn"], "--model=model_fn needs --model_fn=FILE.py:FUNCTION"),
            ([f"--model_fn={PROGRAM}:model_fn", "--model_fn_params=dimension"], "'dimension' is not key=value"),
            ([f"--model_fn={PROGRAM}:model_fn", "--embedding_growth"], "--embedding_growth sets embedding tables: a "
             "model_fn has them with --embedding=dynamic (its dynamic_embedding_columns)"),
            ([f"--model_fn={DYNAMIC}:model_fn", "--embedding=dynamic", "--embedding_dim=4"],
             "--embedding_dim: a model_fn's dynamic_embedding_column says its own dimension")):
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


def linear_model_fn(columns, width: int, seen: dict | None = None):
    """A program's model_fn with no Keras layer (this process runs Keras 3): logits of two classes from the
    input layer of columns() (`width` values); `seen`, if given, gets the features it was handed."""
    def model_fn(features, labels, mode):
        if seen is not None:
            seen.update(features)
        net = tf.compat.v1.feature_column.input_layer(features, columns())
        logits = tf.matmul(net, tf.compat.v1.get_variable("weights", [width, 2]))
        loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
        return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits}, loss=loss)

    return model_fn


@pytest.mark.inprocess
def test_dynamic_columns_of_a_model_fn_are_the_runs_dynamic_tables_and_refuse_to_build_elsewhere(tmp_path,
                                                                                                 monkeypatch):
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "0")  # this process's own, which loading a model_fn would set
    from ps_trainer.estimator.feature_column import dynamic_embedding_column
    cfg = read_flags(f"--model_fn={DYNAMIC}:model_fn", "--dataset=clicks", f"--model_dir={tmp_path}",
                     "--embedding=dynamic", "--embedding_growth", "--embedding_capacity=5000", "--batch_size=64",
                     "--optimizer=adagrad")
    model_fn = linear_model_fn(lambda: [dynamic_embedding_column(name, 4) for name in ("user", "item")], 8)
    monkeypatch.setattr(user_fn, "load", lambda location: model_fn)
    with tf.Graph().as_default() as graph:
        train = train_graph.build_graph(cfg)
        trained = sorted({name for name, _ in train.graph_tables.of(graph).trained_shards})
        assert trained == ["model_fn/input_layer/item_dynamic_embedding", "model_fn/input_layer/user_dynamic_embedding"]
        live = graph.get_collection(table_storage.LIVE_ROWS)
        with tf_session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            for _ in range(3):
                sess.run(train.step.train_op)
            rows = sess.run(live)
    assert all(0 < count <= 3 * 64 for count in rows), rows  # the IDs the 3 batches met, a row each
    # Without the runtime's tables (a plain graph) the column names itself.
    with tf.Graph().as_default(), pytest.raises(ValueError, match=re.escape(
            "dynamic_embedding_column('user'): its table is the runtime's dynamic tables': give "
            "--embedding=dynamic (trainer.py --model_fn=FILE.py:FUNCTION --embedding=dynamic, or an Estimator "
            "program's PS_TRAINER_FLAGS)")):
        tf.compat.v1.feature_column.input_layer({"user": tf.constant(["u1", "u2"])},
                                                [dynamic_embedding_column("user", 4)])


@pytest.mark.inprocess
def test_a_dynamic_column_of_several_values_per_example_combines_each_examples_rows_by_its_combiner():
    # A user's history, as TF1 programs hand it over: a VarLenFeature's SparseTensor, or a dense [batch, n]
    # padded with '' (strings) or -1 (integers). Each example reads the rows of its own values, combined.
    from ps_trainer.model.dynamic import column as dynamic_column
    from ps_trainer.model.dynamic.ids import TableOptions
    histories = [["a", "b"], ["a"], ["b"], [], ["a", "a", "b"]]  # per example; the last names "a" twice
    outputs = {}
    with tf.Graph().as_default(), dynamic_column.building(GraphTables(), TableOptions(capacity=100), training=True):
        dense = tf.constant([row + [""] * (3 - len(row)) for row in histories])
        integers = tf.constant([[{"a": 7, "b": 9}[v] for v in row] + [-1] * (3 - len(row)) for row in histories])
        features = {"sparse": tf.sparse.from_dense(dense), "dense": dense, "integers": integers}
        for combiner in ("sum", "mean", "sqrtn"):
            with tf.compat.v1.variable_scope(combiner):
                for name in features:
                    outputs[combiner, name] = tf.compat.v1.feature_column.input_layer(
                        features, [dynamic_column.dynamic_embedding_column(name, 3, combiner=combiner)])
        with tf_session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            values = sess.run(outputs)
    for (combiner, name), got in values.items():
        a, b = got[1], got[2]  # the rows of "a" and "b" (examples 1 and 2 hold one value each)
        assert np.abs(a - b).max() > 0.01, (combiner, name)  # two rows, not one default row
        scale = {"sum": [1, 1], "mean": [2, 3], "sqrtn": [np.sqrt(2), np.sqrt(3)]}[combiner]
        np.testing.assert_allclose(got[0], (a + b) / scale[0], rtol=1e-6, err_msg=f"{combiner} {name}")
        np.testing.assert_allclose(got[3], np.zeros(3), err_msg=f"{combiner} {name}")  # no value: zeros
        np.testing.assert_allclose(got[4], (2 * a + b) / scale[1], rtol=1e-6, err_msg=f"{combiner} {name}")
    with pytest.raises(ValueError, match=re.escape("dynamic_embedding_column('h'): combiner must be one of sum, mean, "
                                                   "sqrtn, not 'max'")):
        dynamic_column.dynamic_embedding_column("h", 3, combiner="max")


@pytest.mark.inprocess
def test_a_model_fns_dynamic_column_trains_a_multi_valued_csv_column_a_row_per_item(tmp_path, monkeypatch):
    # --multi_valued_columns hands a model_fn the column as a SparseTensor of its values (TF1's parse_example's
    # variable-length feature); the user's recent items each get a row of their own.
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "0")  # this process's own, which loading a model_fn would set
    from ps_trainer.estimator.feature_column import dynamic_embedding_column
    write_click_csvs(tmp_path / "csv", rows=400)
    cfg = read_flags(f"--model_fn={DYNAMIC}:model_fn", "--dataset=csv", f"--data_dir={tmp_path / 'csv'}",
                     "--label_column=clicked", "--categorical_columns=city", "--multi_valued_columns=recent",
                     f"--model_dir={tmp_path / 'model'}", "--embedding=dynamic", "--embedding_capacity=500",
                     "--batch_size=32", "--optimizer=adagrad")
    seen = {}
    model_fn = linear_model_fn(lambda: [dynamic_embedding_column("recent", 4, combiner="sqrtn")], 4, seen)
    monkeypatch.setattr(user_fn, "load", lambda location: model_fn)
    with tf.Graph().as_default() as graph:
        train = train_graph.build_graph(cfg)
        assert isinstance(seen["recent"], tf.SparseTensor)
        live = graph.get_collection(table_storage.LIVE_ROWS)
        with tf_session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            for _ in range(5):
                sess.run(train.step.train_op)
            rows = sum(sess.run(live))
    # The items the 5 batches named, a row each: far more than one per example's field, at most the 50 items.
    assert 30 <= rows <= 50, rows


@pytest.mark.e2e
def test_a_model_fn_trains_on_a_cluster_with_local_steps_on_every_worker_and_learns(make_cluster):
    # Its user and item IDs in dynamic tables that grow, cut over the 2 ps, beside TF1's hashed embedding
    # column; Adam's beta powers read by every table's update.
    cluster = make_cluster(num_ps=2, num_workers=2, trainer_args=[
        f"--model_fn={DYNAMIC}:model_fn", "--dataset=clicks", "--model_fn_params=dimension=8",
        "--embedding=dynamic", "--embedding_growth", "--embedding_capacity=100000",
        "--optimizer=adam", "--learning_rate=0.01", "--local_steps=10", "--train_steps=800",
        "--synthetic_examples=60000"])  # 30,000 a worker: 4,000 (the suite's default) it learns by heart
    cluster.start_all()
    codes = cluster.wait(timeout=240)
    assert set(codes.values()) == {0}, describe(cluster)
    chief, other = (finished(cluster.log("worker", index)) for index in (0, 1))
    assert int(chief["global_step"]) >= 800 and int(chief["local_steps"]) > 0, chief
    assert int(other["local_steps"]) > 0, other  # the other worker trained too
    # Held-out, not a batch: the clicks' labels follow from the IDs (chance is 0.5; measured 0.77).
    assert float(chief["heldout_auc"]) > 0.65, chief
    step = int(chief["global_step"])
    assert (cluster.model_dir / "export" / str(step) / "saved_model.pb").is_file()
    # The checkpoint holds a row per user and item met (clicks has 5,000 users and 2,000 items), each
    # table cut into a shard per ps.
    saved = dict(tf.train.list_variables(tf.train.latest_checkpoint(str(cluster.model_dir))))
    for name, met in (("user", 4000), ("item", 1500)):
        table = f"model_fn/input_layer/{name}_dynamic_embedding"
        keys = [saved[f"{table}/shard{shard}/rows_of_ids-keys"][0] for shard in (0, 1)]
        assert all(keys) and sum(keys) > met, (name, keys, sorted(saved))


@pytest.mark.inprocess
@pytest.mark.parametrize("flags, refusal", [
    (["--local_steps=4"], "its EstimatorSpec has a train_op, and --local_steps makes the update itself"),
    (["--accumulate_batches=2", "--sync_replicas"], "--accumulate_batches makes the update itself"),
    (["--embedding=dynamic"], "--embedding=dynamic tables evict and reconcile rows of the runtime optimizer's slots"),
])
def test_a_model_fn_with_its_own_train_op_is_refused_in_one_line_by_a_lever_that_makes_the_update(flags, refusal):
    cfg = read_flags(f"--model_fn={PROGRAM}:model_fn_with_update", "--dataset=clicks", *flags)
    with tf.Graph().as_default(), pytest.raises(user_fn.ModelFnError, match=re.escape(refusal)) as refused:
        train_graph.build_graph(cfg)
    assert "\n" not in str(refused.value) and "return the loss alone" in str(refused.value)


@pytest.mark.e2e
def test_one_model_fn_file_with_its_own_train_op_trains_under_trainer_py_and_in_its_own_program_alike(tmp_path):
    # The same file, both doors: trainer.py --model_fn runs its train_op as written; run as a program, it trains
    # in its own train_and_evaluate. Same data (the trainer's clicks), same steps: the same held-out AUC.
    steps = 2000
    program = ForkedTask([str(PROGRAM), str(tmp_path / "program"), str(steps)], os.environ, tmp_path / "program.log",
                         cwd=ROOT, program=True)
    try:
        trained = run_trainer(f"--model_fn={PROGRAM}:model_fn_with_update", "--dataset=clicks",
                              f"--train_steps={steps}", "--batch_size=64",
                              # the clicks' signal is weak (loss about 0.92 of chance), and the subject here
                              # is the held-out figure: the not-learning check warns, never stops
                              "--not_learning=warn", f"--model_dir={tmp_path / 'trainer'}", timeout=240)
        program.wait(timeout=240)
    finally:
        if program.poll() is None:
            stop_process_group(program)
    output = (tmp_path / "program.log").read_text()
    assert trained.returncode == 0 and program.returncode == 0, (trained.stderr[-3000:], output[-3000:])
    assert "the model_fn's own train_op is the update" in trained.stderr
    by_trainer = finished(trained.stderr)
    assert int(by_trainer["global_step"]) == steps, by_trainer
    by_program = re.search(r"held-out auc ([0-9.]+) at global step (\d+)", output)
    assert by_program and int(by_program.group(2)) == steps, output[-3000:]
    # Chance is 0.5; measured 0.710 (the program) and 0.711 (trainer.py) at 2,000 steps.
    assert float(by_trainer["heldout_auc"]) > 0.65
    assert abs(float(by_trainer["heldout_auc"]) - float(by_program.group(1))) <= 0.01, (by_trainer, output[-500:])
