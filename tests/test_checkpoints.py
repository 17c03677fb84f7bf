"""Checkpoints an operator can rely on: a save that fails for space leaves the previous checkpoint the
newest and stops the run with a transient code (never exit 0 without a final checkpoint), a save is
checked before it is registered, and a restore falls back past checkpoints that cannot be read."""

import os
import re
import subprocess
import time

import pytest
import tensorflow as tf

from ps_trainer import input as inputs
from ps_trainer import model
from ps_trainer.cluster import model_dir as layout
from ps_trainer.cluster import spec
from tests.support import finished, run_trainer, tf_session, train_one_worker, wait_for
from ps_trainer.launch.processes import SingleProcess
from ps_trainer.training import checkpoints, chief_claim, evaluator, exit_codes, incremental, log_lines
from ps_trainer.training.config import RunConfig, TrainConfig

v1 = tf.compat.v1
ONE_PROCESS = ["--synthetic_examples=2000", "--export_saved_model=false", "--log_every_n_steps=100"]


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs: room for the first checkpoint of the default model (1.8 MB with its graph), not
    for a second one."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)],
                             capture_output=True, text=True, timeout=30, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.strip()}")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, timeout=30, check=False)


def saves_not_done(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "not saved in" in line]


@pytest.mark.e2e
@pytest.mark.parametrize("train_steps,failed_saves,reason", [
    (2000, checkpoints.MAX_FAILED_SAVES, "3 checkpoint saves in a row failed"),
    (300, 2, "its final checkpoint could not be saved"),  # at 200, then the final one at 300
])
def test_a_full_disk_keeps_the_last_good_checkpoint_and_stops_with_a_transient_code(small_disk, train_steps,
                                                                                     failed_saves, reason):
    result = run_trainer(f"--model_dir={small_disk}", f"--train_steps={train_steps}", "--save_checkpoint_steps=200",
                         *ONE_PROCESS)
    assert result.returncode == exit_codes.CHECKPOINT_NOT_SAVED.code, result.stderr[-3000:]
    failures = saves_not_done(result.stderr)
    assert len(failures) == failed_saves, result.stderr[-3000:]
    assert re.search(rf"checkpoint of global step 200 not saved in {small_disk}: No space left on device \(needs "
                     r"about [\d,]+ bytes, [\d,]+ free\); model\.ckpt-0 stays the newest", failures[0]), failures[0]
    assert any(reason in line for line in result.stderr.splitlines()), result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    # Nothing half-written is left, and the state file names the one good checkpoint.
    assert tf.train.latest_checkpoint(str(small_disk)) == str(small_disk / "model.ckpt-0")
    assert checkpoints.unfinished_save_files(str(small_disk)) == []
    assert checkpoints.checkpoint_problem(str(small_disk / "model.ckpt-0")) is None


@pytest.mark.e2e
def test_a_restore_falls_back_past_a_truncated_and_an_unindexed_checkpoint_and_says_how_far(tmp_path):
    model_dir = tmp_path / "model"
    first = run_trainer(f"--model_dir={model_dir}", "--train_steps=300", "--save_checkpoint_steps=100",
                        *ONE_PROCESS, "--log_every_n_steps=50")
    assert first.returncode == 0, first.stderr[-3000:]
    # The newest shard cut short (a dead NFS client), the one before it without its index.
    data, = (model_dir).glob("model.ckpt-300.data-*")
    with open(data, "r+b") as shard:
        shard.truncate(100)
    (model_dir / "model.ckpt-200.index").unlink()
    resumed = run_trainer(f"--model_dir={model_dir}", "--train_steps=400", "--save_checkpoint_steps=100",
                          *ONE_PROCESS, "--log_every_n_steps=50")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    unreadable = [line for line in resumed.stderr.splitlines() if "cannot be read" in line and "trying" in line]
    assert len(unreadable) == 2 and "model.ckpt-300" in unreadable[0] and "model.ckpt-200" in unreadable[1], unreadable
    assert "Read less bytes than requested" in unreadable[0]
    assert ("restored model.ckpt-100: 200 global steps before the newest checkpoint, model.ckpt-300, which cannot "
            "be read") in resumed.stderr
    # It trained on from 100 (not from scratch, not from a broken one) to the end, and saved over the bad ones.
    first, *progress = log_lines.steps(resumed.stderr)  # a line's step can be one past it (tests/support.py)
    assert first.first and first.step in (101, 102), resumed.stderr[-3000:]
    assert [step.step - step.step % 50 for step in progress] == [150, 200, 250, 300, 350, 400]
    assert tf.train.latest_checkpoint(str(model_dir)).endswith("model.ckpt-400")
    for step in (200, 300, 400):
        assert checkpoints.checkpoint_problem(str(model_dir / f"model.ckpt-{step}")) is None, step


@pytest.mark.e2e
def test_a_directory_of_only_unreadable_checkpoints_stops_rather_than_start_from_scratch(tmp_path):
    model_dir = tmp_path / "model"
    first = run_trainer(f"--model_dir={model_dir}", "--train_steps=100", "--save_checkpoint_steps=1000", *ONE_PROCESS)
    assert first.returncode == 0, first.stderr[-3000:]
    # A state file that cannot be read, or names no checkpoint: TensorFlow takes it for "no checkpoint".
    # The chief stops naming it, and removes nothing (it once removed every checkpoint as an unfinished
    # save, trained from step 0 and exited 0).
    state = model_dir / layout.CHECKPOINT_STATE
    written, files = state.read_text(), sorted(model_dir.iterdir())
    for broken in ("model_checkpoint_path: \"model.ckpt-1", ""):  # cut short, and empty
        state.write_text(broken)
        again = run_trainer(f"--model_dir={model_dir}", "--train_steps=200", *ONE_PROCESS)
        assert again.returncode == exit_codes.CHECKPOINT_UNREADABLE.code == 1, again.stderr[-3000:]
        assert f"{state}, the state file that names the checkpoints, cannot be read or names none" in again.stderr
        assert "Traceback" not in again.stderr
        assert sorted(model_dir.iterdir()) == files and state.read_text() == broken
    state.write_text(written)
    # A resume with layers of other sizes: the Saver would restore the checkpoint's shapes into them and
    # train those, under flags that say otherwise. The chief refuses, naming the variable, both shapes and
    # the flag as run.json recorded it.
    other = run_trainer(f"--model_dir={model_dir}", "--train_steps=200", "--hidden_units=128", *ONE_PROCESS)
    assert other.returncode == exit_codes.BAD_FLAGS.code, other.stderr[-3000:]
    assert ("mlp/hidden0/kernel is [784, 128] in this run's model and [784, 256] in model.ckpt-100: resume with "
            "the model flags it was trained with, or train this model in a new --model_dir (its run.json says "
            "--hidden_units=256)") in other.stderr
    assert sorted(model_dir.iterdir()) == files
    # Another optimizer: its slots are in no checkpoint. Every checkpoint is whole, and the line says so.
    adam = run_trainer(f"--model_dir={model_dir}", "--train_steps=200", "--optimizer=adam", *ONE_PROCESS)
    assert adam.returncode == exit_codes.BAD_FLAGS.code, adam.stderr[-3000:]
    assert re.search(rf"no checkpoint in {model_dir} holds this run's model: \S+ is not in model\.ckpt-100 \(saved "
                     r"by another model, optimizer or release\)", adam.stderr), adam.stderr[-3000:]
    # (It failed in its restore, once its session's summaries had begun: the checkpoints are as they were.)
    assert [path for path in sorted(model_dir.iterdir()) if path.name.startswith(("model.ckpt", "checkpoint"))] == [
        path for path in files if path.name.startswith(("model.ckpt", "checkpoint"))]
    for index in model_dir.glob("model.ckpt-*.index"):
        index.unlink()
    again = run_trainer(f"--model_dir={model_dir}", "--train_steps=200", *ONE_PROCESS)
    assert again.returncode == exit_codes.CHECKPOINT_UNREADABLE.code == 1, again.stderr[-3000:]
    assert re.search(r"no checkpoint in \S+ can be read \(model\.ckpt-100, model\.ckpt-0\); not starting from "
                     "scratch", again.stderr), again.stderr[-3000:]
    assert "Traceback" not in again.stderr


@pytest.mark.e2e
def test_a_run_continued_without_its_lever_restores_its_checkpoint_and_deltas_and_starts_the_optimizer_afresh(
        tmp_path):
    # --local_steps keeps each worker's slots of the dense variables on the worker: its checkpoints and their
    # deltas hold none. A run killed under the lever and continued without it restores the full checkpoint and
    # every delta of it, and the optimizer's dense slots start afresh.
    model_dir = tmp_path / "model"
    args = [f"--model_dir={model_dir}", "--model=wide_deep", "--dataset=clicks", "--embedding=dynamic",
            "--embedding_capacity=20000", "--incremental_save_secs=1", "--save_checkpoint_steps=100000", *ONE_PROCESS]
    full = str(model_dir / "model.ckpt-0")
    with SingleProcess(tmp_path / "lever", [*args, "--train_steps=100000", "--local_steps=5"]) as lever:
        lever.preload = True
        lever.start("worker", 0)
        wait_for(lambda: len(incremental.deltas_of(full)) >= 2, 120, "two deltas of model.ckpt-0", lever)
        lever.kill("worker", 0)
    deltas = incremental.deltas_of(full)
    for prefix in (full, deltas[-1]):  # the dense variables' slots were the worker's own
        assert "wide_deep/deep_logits/bias/Adagrad" not in dict(tf.train.list_variables(prefix)), prefix
    at = int(deltas[-1].rpartition("-")[2])
    # Without --incremental_save_secs a run would restore no delta: the steps they hold would be trained again.
    refused = run_trainer(*[arg for arg in args if not arg.startswith("--incremental")], f"--train_steps={at + 20}")
    assert refused.returncode == exit_codes.BAD_FLAGS.code, refused.stderr[-3000:]
    assert (f"model.ckpt-0 has {len(deltas)} delta checkpoint(s), to global step {at}, which a run without "
            "--incremental_save_secs does not restore: resume with --incremental_save_secs above 0") in refused.stderr
    assert incremental.deltas_of(full) == deltas
    plain = run_trainer(*args, f"--train_steps={at + 20}")
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert re.search(rf"restored model\.ckpt-0 and its {len(deltas)} delta checkpoint\(s\), which hold no optimizer "
                     r"state of \d+ variable\(s\) \(\S+/Adagrad; written under a lever", plain.stderr), (
        plain.stderr[-3000:])
    assert finished(plain.stderr)["global_step"] == str(at + 20) and finished(plain.stderr)["local_steps"] == "20"


def model_variables(shards: int, rows: int, width: int, grown: int):
    """A table cut into `shards` (saved whole, as slices) and a variable that grows (any length)."""
    table = v1.get_variable("table", [rows, width], partitioner=v1.fixed_size_partitioner(shards))
    growing = v1.Variable(tf.zeros([grown, width]), shape=tf.TensorShape([None, width]), name="growing")
    return list(table) + [growing]


@pytest.mark.inprocess
def test_a_resume_is_refused_only_for_a_variable_saved_with_another_shape(tmp_path):
    with tf.Graph().as_default():
        model_variables(shards=2, rows=100, width=4, grown=30)
        with tf_session() as sess:
            sess.run(v1.global_variables_initializer())
            prefix = v1.train.Saver().save(sess, str(tmp_path / "model.ckpt"), global_step=7)
    for shards, rows, width, grown, refusal in (
            (3, 100, 4, 50, None),  # cut otherwise, grown since: both restore
            (2, 100, 8, 30, "table is [100, 8] in this run's model and [100, 4] in model.ckpt-7: resume with the "
                            "model flags it was trained with, or train this model in a new --model_dir"),
            (2, 120, 4, 30, "table is [120, 4] in this run's model and [100, 4] in model.ckpt-7"),
            (2, 100, 2, 30, "table is [100, 2]")):
        with tf.Graph().as_default():
            found = checkpoints.shape_refusal(prefix, model_variables(shards, rows, width, grown))
        assert found is None if refusal is None else found and found.startswith(refusal), (found, refusal)
    assert checkpoints.shape_refusal(None, []) is None  # nothing to resume
    assert checkpoints.shape_refusal(str(tmp_path / "model.ckpt-9"), []) is None  # unreadable: the restore names it


@pytest.mark.inprocess
def test_the_evaluator_names_a_checkpoint_it_cannot_read_and_waits_for_the_next(tmp_path, caplog):
    data = inputs.DataConfig(synthetic_examples=2000)
    train_one_worker(tmp_path, data, model.ModelConfig(), steps_per_run=1, train_steps=40)  # saves 0, 20, 40
    newest = tf.train.latest_checkpoint(str(tmp_path))
    data_file, = tf.io.gfile.glob(newest + ".data-*")
    os.truncate(data_file, 100)
    cfg = RunConfig(spec.ClusterConfig(), TrainConfig(model_dir=str(tmp_path), train_steps=40, eval_timeout_secs=1),
                    model.ModelConfig(), data)
    with tf.Graph().as_default(), pytest.raises(evaluator.EvaluationTimeout, match="last evaluated step: None"):
        evaluator.run(cfg)  # the final step's checkpoint is the bad one: skipped, then no newer one comes
    gave_up = time.time()
    [skipped] = [r for r in caplog.records if "cannot be read" in r.getMessage()]
    assert skipped.getMessage().startswith(f"evaluator: checkpoint {newest} cannot be read ("), skipped
    assert skipped.getMessage().endswith("): skipped; waiting for the next one"), skipped
    # After the skip it waited its --eval_timeout_secs for a newer one (elapsed time is the subject).
    assert gave_up - skipped.created >= 1
    # The one before it is read as ever.
    step, figures = evaluator.evaluate(cfg, str(tmp_path / "model.ckpt-20"), max_examples=500)
    assert step == 20 and 0 <= figures["accuracy"] <= 1


@pytest.mark.inprocess
def test_the_check_after_writing_finds_a_short_shard_a_missing_one_and_a_missing_index(tmp_path):
    with tf.Graph().as_default():
        variable = v1.get_variable("table", initializer=tf.zeros([1000, 16]))
        saver = v1.train.Saver(sharded=True)
        with tf_session() as sess:
            sess.run(variable.initializer)
            prefix = saver.save(sess, str(tmp_path / "model.ckpt"), global_step=7)
    assert checkpoints.checkpoint_problem(prefix) is None
    assert checkpoints.checkpoint_step(prefix) == 7
    data, = tf.io.gfile.glob(prefix + ".data-*")
    os.truncate(data, 1000)
    assert checkpoints.checkpoint_problem(prefix) == ("its 1 of 1 data file(s) hold 1000 bytes of the 64000 its "
                                                      "variables need")
    os.remove(data)
    assert "its 0 of 1 data file(s)" in checkpoints.checkpoint_problem(prefix)
    os.remove(prefix + ".index")
    assert checkpoints.checkpoint_problem(prefix).startswith("its index cannot be read")


def _claim(model_dir, address, host="h1", pid=100, serving=(), alive=()):
    """chief_claim.claim with the chiefs that still serve (addresses) and the live pids given."""
    return chief_claim.claim(str(model_dir), address, "worker:0", probe=lambda a: a in serving,
                             pid_alive=lambda p: p in alive, host=host, pid=pid)


@pytest.mark.pure
def test_a_chief_stops_on_a_model_dir_another_live_chief_trains_in_and_takes_over_one_that_is_gone(tmp_path):
    first = _claim(tmp_path, "10.0.0.1:2222", host="h1", pid=100)
    record = (tmp_path / layout.CHIEF_CLAIM).read_text()
    # Another run's chief, on this host or another, while the first still serves: stopped, naming it.
    for host, pid, alive in (("h1", 200, {100}), ("h2", 300, ())):
        with pytest.raises(exit_codes.Failure) as refused:
            _claim(tmp_path, "10.0.0.9:2222", host=host, pid=pid, serving={"10.0.0.1:2222"}, alive=alive)
        assert refused.value.outcome is exit_codes.MODEL_DIR_IN_USE and refused.value.outcome.code == 1
        assert f"--model_dir={tmp_path} is in use" in str(refused.value)
        assert "at 10.0.0.1:2222, pid 100 on host h1" in str(refused.value)
        assert (tmp_path / layout.CHIEF_CLAIM).read_text() == record  # left as it was
    # Its pid gone on this host (a port taken since by another process is not it), or its address silent.
    for host, serving in (("h1", {"10.0.0.1:2222"}), ("h2", ())):
        _claim(tmp_path, "10.0.0.9:2222", host=host, pid=200, serving=serving).release()
        first = _claim(tmp_path, "10.0.0.1:2222", host="h1", pid=100)
    # Its own earlier life, restarted at its address (pid and host new), takes the record over.
    again = _claim(tmp_path, "10.0.0.1:2222", host="h3", pid=7, serving={"10.0.0.1:2222"})
    first.release()  # no longer the first's record: left in place
    assert (tmp_path / layout.CHIEF_CLAIM).exists()
    again.release()
    assert not (tmp_path / layout.CHIEF_CLAIM).exists()


@pytest.mark.pure
def test_a_run_of_one_process_is_checked_by_its_pid_here_and_taken_over_from_another_host(tmp_path, caplog):
    first = _claim(tmp_path, "", host="h1", pid=100)
    with pytest.raises(exit_codes.Failure, match="pid 100 on host h1"):
        _claim(tmp_path, "", host="h1", pid=200, alive={100})
    _claim(tmp_path, "", host="h1", pid=100, alive={100})  # this very process, claiming again
    # Nothing on another host can tell whether it runs: taken over, saying so. So is a loopback address.
    _claim(tmp_path, "", host="h2", pid=300, alive={100})
    _claim(tmp_path, "127.0.0.1:5000", host="h3", pid=400, serving={"127.0.0.1:5000"})
    assert "cannot be probed" in caplog.text
    _claim(tmp_path, "", host="h4", pid=500, serving={"127.0.0.1:5000"})
    first.release()
    (tmp_path / layout.CHIEF_CLAIM).write_text("{cut short")  # not a record: names no chief
    _claim(tmp_path, "", host="h1", pid=600, alive={500, 600}).release()
    assert not (tmp_path / layout.CHIEF_CLAIM).exists()
