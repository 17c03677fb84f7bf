"""A run resumed with its tables cut into another number of shards (the ps count changed, or
--embedding_partitions): every variable, optimizer slots included, restores to the value saved
(TensorFlow's Saver saves each partitioned variable whole, as slices), and the chief says so."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from ps_trainer import input as inputs
from ps_trainer import model
from ps_trainer.cluster import spec
from tests.support import finished, run_trainer, tf_session, train_one_worker
from ps_trainer.training import graph as train_graph
from ps_trainer.training import log_lines
from ps_trainer.training import run_record
from ps_trainer.training.config import RunConfig, TrainConfig

v1 = tf.compat.v1
CLICKS = inputs.DataConfig(name="clicks")


def wide_deep(partitions):
    return model.ModelConfig(name="wide_deep", embedding_partitions=partitions, hash_buckets=1001)


def restored(model_dir, partitions) -> dict[str, np.ndarray]:
    """Every saved variable, whole (shards put back together), as the chief's saver restores it from
    the newest checkpoint into a graph cut into `partitions` shards per table."""
    cfg = RunConfig(spec.ClusterConfig(), TrainConfig(model_dir=str(model_dir), optimizer="ftrl_adagrad"),
                    wide_deep(partitions), CLICKS)
    shards = {}
    with tf.Graph().as_default():
        graph = train_graph.build_graph(cfg)
        with tf_session() as sess:
            graph.saver.restore(sess, tf.train.latest_checkpoint(str(model_dir)))
            variables = v1.global_variables()
            for variable, value in zip(variables, sess.run(variables)):  # one run: each costs a prune of the graph
                info = variable._save_slice_info
                name = info.full_name if info else variable.op.name
                shards.setdefault(name, []).append((info.var_offset[0] if info else 0, value))
    return {name: parts[0][1] if len(parts) == 1 else np.concatenate(
        [value for _, value in sorted(parts, key=lambda part: part[0])]) for name, parts in shards.items()}


@pytest.mark.inprocess
def test_tables_and_their_slots_restore_whole_into_more_and_fewer_shards(tmp_path):
    train_one_worker(tmp_path, CLICKS, wide_deep(2), steps_per_run=1, train_steps=30, optimizer="ftrl_adagrad")
    saved = restored(tmp_path, 2)
    slots = [name for name in saved if name.endswith(("embedding/Adagrad", "wide/Ftrl", "wide/Ftrl_1"))]
    assert len(slots) == 9, sorted(saved)  # Adagrad on each of the 3 tables, FTRL's two on each wide table
    assert any(np.any(saved[name] != saved[name].flat[0]) for name in slots)  # trained, not initial values
    for partitions in (3, 1):
        again = restored(tmp_path, partitions)
        assert sorted(again) == sorted(saved)
        for name, value in saved.items():
            np.testing.assert_array_equal(again[name], value, err_msg=f"{name} with {partitions} shards")


@pytest.mark.e2e
def test_a_run_resumed_with_tables_cut_otherwise_says_so_trains_to_the_end_and_learns(tmp_path):
    args = [f"--model_dir={tmp_path}", "--model=wide_deep", "--dataset=clicks", "--hash_buckets=1001",
            "--export_saved_model=false", "--log_every_n_steps=100"]
    first = run_trainer(*args, "--embedding_partitions=2", "--train_steps=200")
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = run_trainer(*args, "--embedding_partitions=3", "--train_steps=600")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert ("the checkpoint's tables are cut into 2 piece(s) each, this run's into 3: they and their optimizer "
            "slots are restored into the new pieces, every value as saved") in resumed.stderr
    # Resumed at 200. A line's global step is the one read in its run plus one, and that read races the
    # run's own increment: under load a line can say 301 for 300 (and the first 202 for 201).
    first, *progress = log_lines.steps(resumed.stderr)
    assert first.first and first.step in (201, 202), resumed.stderr[-3000:]
    assert [step.step - step.step % 100 for step in progress] == [300, 400, 500, 600], resumed.stderr[-3000:]
    assert float(finished(resumed.stderr)["heldout_auc"]) > 0.62, resumed.stderr[-2000:]  # a coin: 0.5


def run(**model_options):
    """A wide_deep run on clicks with these model settings."""
    return RunConfig(spec.ClusterConfig(), TrainConfig(), model.ModelConfig(name="wide_deep", **model_options), CLICKS)


def record(**model_options):
    """The run record such a run writes (run.json), on 2 ps."""
    return {"model": dataclasses.asdict(run(**model_options).model), "num_ps": 2}


DYNAMIC = {"embedding": "dynamic", "embedding_partitions": 2}


@pytest.mark.pure
def test_a_resume_refused_for_its_shapes_is_told_the_model_flags_its_run_record_holds():
    # (checkpoints.shape_refusal names the variable; these are the flags run.json recorded.)
    assert run_record.shape_flags(record(hidden_units=(256,)), run(hidden_units=(128, 64))) == ["--hidden_units=256"]
    as_json = {"model": {**record()["model"], "hidden_units": [256, 8]}}  # run.json holds a list
    assert run_record.shape_flags(as_json, run(hidden_units=(256, 8))) == []
    assert run_record.shape_flags(as_json, run()) == ["--hidden_units=256,8"]
    assert run_record.shape_flags(record(embedding_dim=8, hash_buckets=500), run()) == [
        "--embedding_dim=8", "--hash_buckets=500"]
    assert run_record.shape_flags(record(**DYNAMIC, hash_buckets=500), run(**DYNAMIC)) == []  # no buckets
    assert run_record.shape_flags({"model": {**record()["model"], "name": "mlp"}}, run()) == ["--model=mlp"]
    assert run_record.shape_flags(None, run()) == []


@pytest.mark.pure
def test_dynamic_tables_resume_only_into_as_many_shards_and_from_the_same_kind_of_table():
    assert run_record.layout_refusal(None, run(embedding="dynamic")) is None  # a new run
    assert run_record.layout_refusal(record(**DYNAMIC), run(**DYNAMIC)) is None
    assert run_record.layout_refusal(record(embedding_partitions=2), run(embedding_partitions=3)) is None  # hashed
    assert run_record.layout_refusal(record(**DYNAMIC), run(embedding="dynamic", embedding_partitions=3)) == (
        "the checkpoints' dynamic tables have 2 shards each, this run's 3 (one per ps unless "
        "--embedding_partitions says): resume with --embedding_partitions=2")
    assert run_record.layout_refusal(record(**DYNAMIC), run(**DYNAMIC, embedding_capacity=200000)).startswith(
        "--embedding_capacity=200000: the checkpoints' dynamic tables hold 100000 rows each, and a table's "
        "capacity is fixed for its run: resume with --embedding_capacity=100000, or with --embedding_growth")
    # With growth the capacity is a limit, not a layout: a full table's run resumes with a higher one; a
    # run that held its rows from the start can go on growing, not the other way.
    growing = dict(DYNAMIC, embedding_growth=True)
    assert run_record.layout_refusal(record(**growing), run(**growing, embedding_capacity=200000)) is None
    assert run_record.layout_refusal(record(**DYNAMIC), run(**growing)) is None
    assert run_record.layout_refusal(record(**growing), run(**DYNAMIC)).startswith("--noembedding_growth: ")
    assert run_record.layout_refusal(record(**DYNAMIC, embedding_min_count=2),
                                     run(**DYNAMIC, embedding_min_count=3)) is None  # counts kept either way
    assert run_record.layout_refusal(record(**DYNAMIC), run(**DYNAMIC, embedding_steps_to_live=100)).startswith(
        "--embedding_steps_to_live=100: the checkpoints' dynamic tables were trained with "
        "--embedding_steps_to_live=0, which does not keep the state it needs")
    assert run_record.layout_refusal(record(**DYNAMIC, embedding_min_count=5), run(**DYNAMIC)).startswith(
        "--embedding_min_count=1: the checkpoints' dynamic tables were trained with --embedding_min_count=5, "
        "which keeps the state it needs")
    assert run_record.layout_refusal(record(), run(embedding="dynamic")) == (
        "--embedding=dynamic: the checkpoints in this --model_dir hold hashed tables; resume with "
        "--embedding=hashed, or train the other kind in a new --model_dir")
