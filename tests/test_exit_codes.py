"""Every ending of a task to its exit code and its class (done, permanent, transient), through the
code paths that produce it, and what scripts/slurm/train.sbatch does with each code."""

import logging
import os
import pathlib
import signal
import stat
import subprocess
import tempfile
import types

import pytest
import tensorflow as tf
from absl import app

from ps_trainer import trainer
from ps_trainer.cluster import model_dir as layout
from ps_trainer.cluster import peers, shutdown, spec
from tests.support import SCRIPTS
from ps_trainer.model import user_fn
from ps_trainer.training import exit_codes, roles, run_record, watchdog, worker
from ps_trainer.training.config import TrainConfig
from ps_trainer.training.step import update


@pytest.mark.pure
def test_each_outcome_is_on_a_code_of_its_class_and_transient_ones_are_kubeflows_retryable_codes():
    for outcome in exit_codes.OUTCOMES:
        assert exit_codes.kind(outcome.code) == outcome.kind, outcome
    assert {o.code for o in exit_codes.OUTCOMES if o.kind == exit_codes.TRANSIENT} <= exit_codes.KUBEFLOW_RETRYABLE
    assert {o.code for o in exit_codes.OUTCOMES if o.kind == exit_codes.PERMANENT} == {1}
    assert exit_codes.RETRY == 128 + signal.SIGUSR1 == 138 and exit_codes.PREEMPTED == 143
    assert exit_codes.INTERRUPTED == 130 and exit_codes.kind(exit_codes.KILLED) == exit_codes.TRANSIENT


def _raises(error):
    def run(*_, **__):
        raise error
    return run


CLUSTER = spec.ClusterConfig(("127.0.0.1:1",), ("127.0.0.1:2",), "worker", 0)

# (what happened, how trainer.main meets it): each must end on the outcome's code.
PATHS = {
    "a stall": (exit_codes.STALLED, None),
    "a ps that never listens": (exit_codes.PS_UNREACHABLE, lambda monkeypatch: (
        monkeypatch.setattr(peers, "wait_for_peers", _raises(peers.PeersUnreachable("ps 0 (127.0.0.1:1) ..."))),
        worker.wait_for_ps(CLUSTER, 1))),
    "a NaN loss": (exit_codes.NON_FINITE_LOSS, lambda _: _raise_training_error(update.NON_FINITE_LOSS)),
    "a full embedding table": (exit_codes.TABLE_FULL, lambda _: _raise_training_error(
        "assertion failed: [embedding table wide_deep/user is full: shard 1 holds 50 rows (--embedding_capacity=100 "
        "over 2 shards); raise --embedding_capacity and resume] [Condition x <= y did not hold element-wise:]")),
    "a bad record": (exit_codes.BAD_DATA, lambda _: _raise_training_error(
        "Name: /data/a.tfrecord record 7, Key: label, Index: 0.  Data types don't match.")),
    "a bad held-out record at the evaluator": (exit_codes.BAD_DATA, lambda monkeypatch: (
        monkeypatch.setattr(trainer.evaluator, "run", _raises(tf.errors.InvalidArgumentError(None, None, (
            "assertion failed: [BadRecord: /data/eval-0.csv record 5: has 2 comma-separated fields where its "
            "header has 3]")))),
        trainer.run_evaluator(None))),
    "this task's address is another host's": (exit_codes.OWN_ADDRESS, lambda monkeypatch: (
        monkeypatch.setattr(roles.own_address, "problem", lambda cluster: "192.0.2.7 is not an address of this host"),
        roles.refuse_unsafe_serving(CLUSTER, allow_public_addresses=True, skip_own_address_check=False))),
    "a peer that stopped answering": (exit_codes.CLUSTER_UNAVAILABLE, _raises(
        tf.errors.UnavailableError(None, None, "Socket closed\nAdditional GRPC error information"))),
    "a deadline exceeded": (exit_codes.CLUSTER_UNAVAILABLE, _raises(
        tf.errors.DeadlineExceededError(None, None, "Deadline Exceeded"))),
    "a run.json that is no run record": (exit_codes.RUN_RECORD_UNREADABLE, lambda _: _read_record(b'{"model": {')),
    "a model_fn with a train_op of its own": (exit_codes.MODEL_FN_BROKEN, _raises(user_fn.ModelFnError(
        "--model_fn=f.py:model_fn: its EstimatorSpec has a train_op"))),
    "a chief's final save that failed (either door)": (exit_codes.CHECKPOINT_NOT_SAVED,
                                                       lambda _: _final_save_failed(last_step=300)),
}


def _final_save_failed(last_step):
    """worker.saved_final over a model_dir whose newest checkpoint is of global step 200."""
    with tempfile.TemporaryDirectory() as model_dir:
        pathlib.Path(model_dir, "model.ckpt-200.index").write_bytes(b"")
        pathlib.Path(model_dir, "checkpoint").write_text('model_checkpoint_path: "model.ckpt-200"\n')
        return worker.saved_final(CLUSTER, model_dir, last_step, last_step)


def _read_record(text: bytes):
    """run_record.read of a model_dir whose run.json holds `text`."""
    with tempfile.TemporaryDirectory() as model_dir:
        pathlib.Path(model_dir, layout.RUN_RECORD).write_bytes(text)
        return run_record.read(model_dir)


def _raise_training_error(message):
    """What worker.train raises for a step that failed with `message`."""
    raise worker.training_error(tf.errors.InvalidArgumentError(None, None, message), CLUSTER, TrainConfig().model_dir,
                                global_step=12)


@pytest.mark.pure
@pytest.mark.parametrize("what", PATHS)
def test_each_exit_path_ends_on_its_outcomes_code(what, monkeypatch):
    outcome, path = PATHS[what]
    if path is None:  # the stall watchdog ends the process itself
        exits = []
        now = [0.0]
        dog = watchdog.StallWatchdog("worker:0", "a peer is down", 5, 10, clock=lambda: now[0],
                                     exit_process=exits.append)
        now[0] = 11.0
        dog.check(0.0)
        assert exits == [outcome.code]
        return
    monkeypatch.setattr(trainer, "run_role", lambda argv: path(monkeypatch))
    assert trainer.main([]) == outcome.code
    assert exit_codes.kind(outcome.code) == outcome.kind


@pytest.mark.pure
def test_a_bad_held_out_record_at_the_final_evaluation_leaves_the_finished_job_done_and_says_so(monkeypatch, caplog):
    # It ended the chief in a traceback, exit 1, after its final checkpoint and export were written.
    monkeypatch.setattr(worker.evaluator, "evaluate", _raises(tf.errors.InvalidArgumentError(None, None, (
        "assertion failed: [BadRecord: /data/eval-0.csv record 5: 'clicked' is empty]"))))
    cfg = types.SimpleNamespace(cluster=CLUSTER)
    with caplog.at_level(logging.ERROR):
        assert worker._final_evaluation(cfg, "/m/model.ckpt-9") == {}
    assert ("worker:0: no held-out evaluation of the final checkpoint: bad input record: /data/eval-0.csv record 5: "
            "'clicked' is empty (the held-out data; --skip_bad_records skips bad records)") in caplog.messages
    monkeypatch.setattr(worker.evaluator, "evaluate", _raises(tf.errors.InvalidArgumentError(None, None, "other")))
    with pytest.raises(tf.errors.InvalidArgumentError):
        worker._final_evaluation(cfg, "/m/model.ckpt-9")
    # A final checkpoint that cannot be read is no finished job: it is not taken for the held-out data's fault.
    monkeypatch.setattr(worker.evaluator, "evaluate", _raises(tf.errors.DataLossError(None, None, (
        "Unable to open table file /m/model.ckpt-9.index: DATA_LOSS: not an sstable (bad magic number)"))))
    with pytest.raises(tf.errors.DataLossError):
        worker._final_evaluation(cfg, "/m/model.ckpt-9")


@pytest.mark.pure
def test_a_bad_flag_is_absls_usage_error_which_exits_permanent():
    assert app.UsageError("--ps_hosts: 'ps0' is not host:port").exitcode == exit_codes.BAD_FLAGS.code


def _replica(model_dir, task_index):
    cluster = spec.ClusterConfig(("127.0.0.1:1",), ("127.0.0.1:2", "127.0.0.1:3"), "worker", task_index)
    return types.SimpleNamespace(cluster=cluster, train=TrainConfig(model_dir=str(model_dir)))


@pytest.mark.pure
def test_a_chief_that_ends_permanently_marks_it_for_the_ps_tasks_and_a_worker_cut_off_then_ends_with_its_reason(
        tmp_path):
    chief, other = _replica(tmp_path, 0), _replica(tmp_path, 1)
    bad_data = exit_codes.Failure("worker:0: bad input record: /data/train-00.csv record 7", exit_codes.BAD_DATA)
    for transient in (exit_codes.Failure("a stall", exit_codes.STALLED), tf.errors.UnavailableError(None, None, "x"),
                      exit_codes.Failure("another run's chief trains there", exit_codes.MODEL_DIR_IN_USE)):
        with pytest.raises(type(transient)):
            roles._train_replica(chief, _raises(transient))
        assert not (tmp_path / "done" / "chief-failed").exists()
    watch = shutdown.ChiefFailure(str(tmp_path))  # a worker's, from its start
    with pytest.raises(exit_codes.Failure):
        roles._train_replica(chief, _raises(bad_data))
    assert watch.reason() == str(bad_data)
    with pytest.raises(ValueError):  # a traceback: its type and first line
        roles._train_replica(chief, _raises(ValueError("no such feature: 'city'\nmore")))
    assert watch.reason() == "ValueError: no such feature: 'city'"

    # A worker cut off from its ps after it began, and a chief's mark since: exit 1 with the chief's reason.
    def cut_off():
        shutdown.mark_chief_failed(str(tmp_path), str(bad_data))
        raise tf.errors.UnavailableError(None, None, "Socket closed")
    with pytest.raises(exit_codes.Failure) as ended:
        roles._train_replica(other, cut_off)
    assert ended.value.outcome is exit_codes.CHIEF_FAILED
    assert str(ended.value) == ("worker:1: the chief ended in a permanent error, so nothing more will train; exiting "
                                f"with it: {bad_data}")
    # The mark was there when it began (an earlier run's): its own transient ending stands.
    with pytest.raises(tf.errors.UnavailableError):
        roles._train_replica(other, _raises(tf.errors.UnavailableError(None, None, "Socket closed")))
    # The next run's chief clears it as it begins; its own ending is its own.
    assert roles._train_replica(chief, lambda: exit_codes.OK) == exit_codes.OK
    assert not (tmp_path / "done" / "chief-failed").exists()


@pytest.mark.pure
def test_a_stalled_worker_ends_with_the_chiefs_permanent_failure_once_the_chief_marks_it(tmp_path):
    now, exits = [0.0], []
    failure = shutdown.ChiefFailure(str(tmp_path))
    dog = watchdog.StallWatchdog("worker:1", "a ps may be down", 30, 600, clock=lambda: now[0],
                                 exit_process=exits.append, chief_failure=failure)
    now[0] = watchdog.CHIEF_CHECK_AFTER_SECS
    dog.check(0.0)
    assert exits == []  # stalled, and no mark
    shutdown.mark_chief_failed(str(tmp_path), "worker:0: the loss became NaN")
    now[0] += 1.0
    dog.check(0.0)
    assert exits == []  # it looks at most every MARK_CHECK_SECS
    now[0] += shutdown.MARK_CHECK_SECS
    dog.check(0.0)
    assert exits == [exit_codes.CHIEF_FAILED.code]


# ---------------------------------------------------------------- Slurm's batch script

STUB = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$CALLS"
[ "$(basename "$0")" = srun ] && exit "$SRUN_EXIT"
exit 0
"""


@pytest.mark.e2e
@pytest.mark.parametrize("code,restart_count,requeued", [
    (exit_codes.RETRY, 0, True), (exit_codes.RETRY, 3, False), (exit_codes.FAILED, 0, False),
    (exit_codes.PREEMPTED, 0, False), (exit_codes.OK, 0, False)])
def test_the_batch_script_requeues_on_the_transient_code_only(tmp_path, code, restart_count, requeued):
    # srun and scontrol stand in for Slurm here: the decision is the script's (tests/test_slurm.py runs
    # the script under a real Slurm).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("srun", "scontrol"):
        (bin_dir / name).write_text(STUB)
        (bin_dir / name).chmod(stat.S_IRWXU)
    calls = tmp_path / "calls"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls), "SRUN_EXIT": str(code),
           "SLURM_JOB_ID": "41", "SLURM_RESTART_COUNT": str(restart_count), "LOG_DIR": str(tmp_path / "logs")}
    result = subprocess.run(["bash", str(SCRIPTS / "slurm" / "train.sbatch"), "--train_steps=10"], env=env,
                            capture_output=True, text=True, timeout=30, cwd=tmp_path, check=False)
    assert result.returncode == code, result.stderr
    assert ("scontrol requeue 41" in calls.read_text()) == requeued, (calls.read_text(), result.stderr)
    if code == exit_codes.RETRY and not requeued:
        assert "requeued 3 times (MAX_REQUEUES); giving up" in result.stderr
