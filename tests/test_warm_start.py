"""--warm_start_from: a fresh run's variables from another run's checkpoint (training/warm_start.py)."""

import dataclasses
import logging

import numpy as np
import pytest
import tensorflow as tf
from absl import app

from ps_trainer import input as inputs
from ps_trainer import model
from ps_trainer.cluster import spec
from ps_trainer.model.dynamic import storage as storage_module
from ps_trainer.training import checkpoints, exit_codes, warm_start
from ps_trainer.training import graph as train_graph
from ps_trainer.training.config import RunConfig, TrainConfig
from tests.support import finished, read_flags, run_trainer, tf_session

v1 = tf.compat.v1
WIDE_DEEP = model.ModelConfig(name="wide_deep", hidden_units=(8,), hash_buckets=50, embedding_dim=4,
                              embedding_partitions=2)
CLICKS = inputs.DataConfig(name="clicks", synthetic_examples=500)


@pytest.mark.pure
@pytest.mark.parametrize("args,message", [
    (["--warm_start_map=a=b"], "--warm_start_map says what --warm_start_from loads: add it or drop the flag."),
    (["--warm_start_slots"], "--warm_start_slots says what --warm_start_from loads: add it or drop the flag."),
    (["--warm_start_from=/tmp/run", "--warm_start_map=wide_deep/user"],
     "--warm_start_map: 'wide_deep/user' is not OLD=NEW (the checkpoint's name, this model's)"),
])
def test_warm_start_flags_that_cannot_work_are_refused_by_name(args, message):
    with pytest.raises(app.UsageError) as err:
        read_flags("--model_dir=/tmp/unused", *args)
    assert message in str(err.value)


def source_checkpoint(directory) -> tuple[str, dict]:
    """A checkpoint of wide_deep (its tables cut in 2) in `directory`, whose every variable, slots included,
    differs from what a new run initializes: its path, and {name: value} of what it saved."""
    cfg = RunConfig(spec.ClusterConfig(), TrainConfig(optimizer="adagrad", seed=7), WIDE_DEEP, CLICKS)
    with tf.Graph().as_default():
        train_graph.build_graph(cfg)
        moved = [variable.assign_add(tf.ones_like(variable)) for variable in v1.global_variables()
                 if variable.dtype.base_dtype == tf.float32]
        directory.mkdir(parents=True, exist_ok=True)
        with tf_session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(moved)
            path = v1.train.Saver().save(sess, str(directory / "model.ckpt"), global_step=100)
    return path, {name: tf.train.load_variable(path, name) for name, _ in tf.train.list_variables(path)}


def initialized(tmp_path, model_cfg=WIDE_DEEP, **train) -> dict:
    """{full name: value} of every global variable of a new wide_deep run (model_dir tmp_path/run) once
    initialized."""
    cfg = RunConfig(spec.ClusterConfig(), TrainConfig(optimizer="adagrad", model_dir=str(tmp_path / "run"), **train),
                    model_cfg, CLICKS)
    with tf.Graph().as_default():
        train_graph.build_graph(cfg)
        (tmp_path / "initialized").mkdir(parents=True, exist_ok=True)
        with tf_session() as sess:
            sess.run(v1.global_variables_initializer())
            path = v1.train.Saver().save(sess, str(tmp_path / "initialized" / "model.ckpt"))
    return {name: tf.train.load_variable(path, name) for name, _ in tf.train.list_variables(path)}


@pytest.mark.inprocess
def test_a_warm_start_loads_every_model_variable_exactly_renames_and_leaves_the_rest_fresh(tmp_path):
    path, saved = source_checkpoint(tmp_path / "source")
    trained = [name for name in saved if not name.endswith("Adagrad") and name != "global_step"]
    assert "wide_deep/user/embedding" in trained and "wide_deep/hidden0/kernel" in trained

    # The source's values are its initial ones plus 1, from another seed: no new run starts at them.
    warm = initialized(tmp_path / "warm", warm_start_from=str(tmp_path / "source"))
    assert all(np.array_equal(warm[name], saved[name]) for name in trained)  # the tables whole, from 2 shards
    assert not np.array_equal(warm["wide_deep/user/embedding/Adagrad"], saved["wide_deep/user/embedding/Adagrad"])
    assert warm["global_step"] == 0

    slots = initialized(tmp_path / "slots", warm_start_from=path, warm_start_slots=True)
    assert np.array_equal(slots["wide_deep/user/embedding/Adagrad"], saved["wide_deep/user/embedding/Adagrad"])
    assert slots["global_step"] == 0

    # A column renamed: this run's item table is the checkpoint's user table; its user table loads as before.
    renamed = initialized(tmp_path / "renamed", warm_start_from=path,
                          warm_start_map=(("wide_deep/user", "wide_deep/item"),))
    assert np.array_equal(renamed["wide_deep/item/embedding"], saved["wide_deep/user/embedding"])
    assert np.array_equal(renamed["wide_deep/item/wide"], saved["wide_deep/user/wide"])
    assert np.array_equal(renamed["wide_deep/user/embedding"], saved["wide_deep/user/embedding"])


@pytest.mark.inprocess
def test_a_warm_start_that_cannot_load_what_it_names_is_refused_and_a_resumed_run_ignores_it(tmp_path, caplog):
    path, _ = source_checkpoint(tmp_path / "source")
    variables = {"wide_deep/category/embedding": ([50, 4], None), "wide_deep/user/embedding": ([50, 4], None)}
    assert warm_start.plan(path, variables, ()).fresh == []
    with pytest.raises(exit_codes.Failure, match=r"wide_deep/category/embedding is \[60, 4\] here and \[50, 4\] "
                                                 r"there; a hashed table of another size cannot be remapped"):
        warm_start.plan(path, {**variables, "wide_deep/category/embedding": ([60, 4], None)}, ())
    with pytest.raises(exit_codes.Failure, match="--warm_start_map=wide_deep/users=wide_deep/buyer: no variable of "
                                                 "this model is named wide_deep/buyer"):
        warm_start.plan(path, variables, (("wide_deep/users", "wide_deep/buyer"),))
    with pytest.raises(exit_codes.Failure, match="none of this model's variables is in it"):
        warm_start.plan(path, variables, (("elsewhere", "wide_deep"),))
    assert warm_start.checkpoint_of(str(tmp_path / "source")) == path == warm_start.checkpoint_of(path)
    with pytest.raises(exit_codes.Failure, match=f"--warm_start_from={tmp_path / 'nothing'}: no checkpoint there"):
        warm_start.apply(TrainConfig(warm_start_from=str(tmp_path / "nothing"), model_dir=str(tmp_path / "new")),
                         "chief", True)
    # A run that resumes its own checkpoint loads that, and not the warm start's (it reads no variable).
    caplog.set_level(logging.INFO, logger="absl")
    with tf.Graph().as_default():
        warm_start.apply(TrainConfig(warm_start_from=path, model_dir=str(tmp_path / "source")), "chief", True)
        assert not v1.trainable_variables()
    assert f"--warm_start_from={path} not read: this run resumes {path}" in caplog.text


DYNAMIC = dataclasses.replace(WIDE_DEEP, embedding="dynamic", embedding_capacity=2000)
COUNTED = dataclasses.replace(DYNAMIC, embedding_min_count=2)  # an ID's row from its second sighting on


def dynamic_state(path) -> dict:
    """{table shard: ({ID: row}, the rows' values)} of a checkpoint of DYNAMIC."""
    state = {}
    for name, _ in tf.train.list_variables(path):
        if name.endswith("/rows_of_ids-keys"):
            shard = name[:-len("/rows_of_ids-keys")]
            keys, rows = (tf.train.load_variable(path, f"{shard}/rows_of_ids-{part}") for part in ("keys", "values"))
            state[shard] = (dict(zip(keys.tolist(), rows.tolist())), tf.train.load_variable(path, f"{shard}/embedding"))
    return state


def rows_by_id(path, storage="embedding") -> dict:
    """{table: {ID: its row of `storage`}} of a checkpoint of DYNAMIC, whatever its shards; storage "sightings":
    {table: {ID: its count}} of the IDs not yet admitted."""
    found = {}
    kind = "sightings" if storage == "sightings" else "rows_of_ids"
    for name, _ in tf.train.list_variables(path):
        if name.endswith(f"/{kind}-keys"):
            shard = name[:-len(f"/{kind}-keys")]
            keys, values = (tf.train.load_variable(path, f"{shard}/{kind}-{part}") for part in ("keys", "values"))
            if kind == "rows_of_ids":
                values = tf.train.load_variable(path, f"{shard}/{storage}")[values]
            found.setdefault(shard.rpartition("/shard")[0], {}).update(zip(keys.tolist(), values.tolist()))
    return found


def warm_started(tmp_path, source_path, model_cfg, name):
    """The checkpoint a fresh run of model_cfg saves once warm-started from source_path (the chief's load run)."""
    warm = RunConfig(spec.ClusterConfig(), TrainConfig(optimizer="adagrad", model_dir=str(tmp_path / name),
                                                       warm_start_from=source_path), model_cfg, CLICKS)
    with tf.Graph().as_default():
        built = train_graph.build_graph(warm)
        with tf_session() as sess:
            sess.run(v1.get_collection(v1.GraphKeys.INIT_OP))
            assert "warm_start_done" in str(sess.run(built.uninitialized))  # a worker waits for the load
            built.warm_load.init_fn(None, sess)
            assert not len(sess.run(built.uninitialized))
            return v1.train.Saver(checkpoints.saved_variables()).save(sess, str(tmp_path / name / "model.ckpt"))


@pytest.fixture(scope="module", name="dynamic_source")
def fixture_dynamic_source(tmp_path_factory) -> str:
    """A checkpoint of COUNTED (2 shards a table) after 5 batches' IDs were admitted and trained."""
    source = RunConfig(spec.ClusterConfig(), TrainConfig(optimizer="adagrad"), COUNTED, CLICKS)
    with tf.Graph().as_default():
        built = train_graph.build_graph(source)
        with tf_session() as sess:
            sess.run(v1.global_variables_initializer())
            for _ in range(5):
                sess.run(built.step.train_op)
            return v1.train.Saver(checkpoints.saved_variables()).save(
                sess, str(tmp_path_factory.mktemp("source") / "model.ckpt"))


@pytest.mark.inprocess
def test_a_warm_start_gives_every_id_of_a_dynamic_table_cut_as_saved_its_row_and_refuses_a_table_too_small(
        tmp_path, dynamic_source):
    saved = dynamic_state(dynamic_source)
    assert saved and all(len(ids) > 5 for ids, _ in saved.values())
    loaded = dynamic_state(warm_started(tmp_path, dynamic_source, COUNTED, "as_saved"))
    for shard, (ids, values) in saved.items():
        assert loaded[shard][0] == ids  # every ID at its row
        rows = sorted(ids.values())
        assert np.array_equal(loaded[shard][1][rows], values[rows])

    # A table too small for the IDs: refused in one line, naming it and the flag.
    small = dataclasses.replace(COUNTED, embedding_capacity=40, embedding_partitions=1)
    with pytest.raises(exit_codes.Failure, match=r"embedding table wide_deep/\w+ is full: shard 0 holds 40 rows "
                                                 r"\(--embedding_capacity=40 over 1 shards\), fewer than "
                                                 r"--warm_start_from=.* gives it; raise --embedding_capacity"):
        warm_started(tmp_path, dynamic_source, small, "small")


@pytest.mark.inprocess
def test_a_warm_start_recuts_a_dynamic_table_by_id_into_other_shards_and_capacity(tmp_path, dynamic_source,
                                                                                    monkeypatch, caplog):
    # Of another capacity, or cut otherwise (1 shard from 2, growing from fewer rows than its IDs need): every
    # ID with its rows, of the embedding and of the wide part, and every ID's admission count, re-cut by ID.
    caplog.set_level(logging.INFO, logger="absl")
    by_id = {storage: rows_by_id(dynamic_source, storage) for storage in ("embedding", "wide", "sightings")}
    assert all(len(rows) > 10 for rows in by_id["embedding"].values())
    assert sum(len(counts) for counts in by_id["sightings"].values()) > 20  # IDs met once: counted, not admitted
    monkeypatch.setattr(storage_module, "GROWTH_ROWS", 16)  # a growing shard starts at 16 rows
    for name, model_cfg in (("larger", dataclasses.replace(COUNTED, embedding_capacity=3000)),
                            ("growing", dataclasses.replace(COUNTED, embedding_growth=True, embedding_partitions=1))):
        checkpoint = warm_started(tmp_path, dynamic_source, model_cfg, name)
        assert "re-cut into this run's shards and capacity" in caplog.text, name
        for storage, tables in by_id.items():
            recut = rows_by_id(checkpoint, storage)
            assert recut.keys() == tables.keys(), name
            for table, rows in tables.items():
                assert recut[table].keys() == rows.keys(), (name, table)
                np.testing.assert_array_equal([recut[table][key] for key in rows], list(rows.values()),
                                              err_msg=f"{name} {table} {storage}")
        caplog.clear()


@pytest.mark.e2e
def test_a_cluster_warm_started_from_a_finished_run_scores_as_it_did(tmp_path, make_cluster):
    # Dynamic tables, each cut into a shard per ps: the source trains in one process with 2 shards; the warm
    # run is a 2 ps cluster, whose chief loads each shard's IDs and rows before the other worker may step.
    # One step with the source's slots moves its held-out AUC by little (measured in one process: 0.7288
    # then 0.7291); a fresh run's one step scores about 0.54.
    source = tmp_path / "source"
    tables = ["--model=wide_deep", "--dataset=clicks", "--embedding=dynamic", "--embedding_partitions=2",
              "--synthetic_examples=8000", "--export_saved_model=false"]
    run = run_trainer(*tables, "--train_steps=300", f"--model_dir={source}", timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    before = float(finished(run.stderr)["heldout_auc"])
    assert before > 0.65
    cluster = make_cluster(num_ps=2, num_workers=2, trainer_args=[
        *tables, "--train_steps=2", f"--warm_start_from={source}", "--warm_start_slots"])
    cluster.start_all()
    assert set(cluster.wait(timeout=180).values()) == {0}
    log = cluster.log("worker", 0)
    assert "3 dynamic table(s) by ID; 0 left fresh" in log, log[-3000:]
    assert abs(float(finished(log)["heldout_auc"]) - before) < 0.01, finished(log)
