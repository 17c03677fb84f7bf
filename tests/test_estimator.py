"""TF1 Estimator programs on the runtime (ps_trainer.estimator): a program written for tf.estimator, with
one line added, trains, evaluates and predicts in one process, and as a TF_CONFIG cluster of processes
(ps, chief, worker, evaluator) in which every task, the ps included, exits 0 by itself."""

import json
import os
import subprocess
import sys

import pytest

from launch.processes import LOOPBACK, free_ports
from tests.support import ROOT, stop_process_group

PROGRAM = ROOT / "tests" / "programs" / "clicks_estimator.py"
TIMEOUT = 240


def final_metrics(output: str) -> dict[str, float]:
    """The program's 'final metrics:' line, as key=value pairs."""
    line = next(line for line in output.splitlines() if line.startswith("final metrics: "))
    return {key: float(value) for key, value in (pair.split("=") for pair in line.split()[2:])}


@pytest.mark.e2e
def test_a_tf1_program_with_one_line_added_trains_evaluates_and_predicts_in_one_process(tmp_path):
    result = subprocess.run([sys.executable, str(PROGRAM), f"--model_dir={tmp_path / 'model'}", "--train_steps=300",
                             "--predict"], capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = final_metrics(result.stdout)
    # Its own --model_dir and --train_steps were taken (ps_trainer.estimator defines no flag), and it learned:
    # the held-out examples' AUC (chance 0.5; measured 0.877).
    assert metrics["global_step"] == 300 and metrics["auc"] > 0.8 and metrics["accuracy"] > 0.7, metrics
    assert "predicted 1000 examples; global_step variable 300" in result.stdout
    assert sorted(os.listdir(tmp_path / "model" / "eval"))  # the evaluation's summaries


@pytest.mark.e2e
def test_a_tf1_program_on_a_tf_config_cluster_trains_to_max_steps_and_every_task_exits_by_itself(tmp_path):
    ps, chief, worker = (f"{LOOPBACK}:{port}" for port in free_ports(3))
    cluster = {"ps": [ps], "chief": [chief], "worker": [worker]}
    tasks = {}
    try:
        for job in ("ps", "chief", "worker", "evaluator"):
            env = {**os.environ, "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": job, "index": 0}})}
            log = open(tmp_path / f"{job}.log", "w")  # pylint: disable=consider-using-with  # closed below
            tasks[job] = (subprocess.Popen([sys.executable, str(PROGRAM), f"--model_dir={tmp_path / 'model'}",
                                            "--train_steps=600"], stdout=log, stderr=subprocess.STDOUT, env=env,
                                           cwd=ROOT, stdin=subprocess.DEVNULL, start_new_session=True), log)
        codes = {job: proc.wait(timeout=TIMEOUT) for job, (proc, _) in tasks.items()}
    finally:
        for proc, log in tasks.values():
            if proc.poll() is None:
                stop_process_group(proc)
            log.close()
    logs = {job: (tmp_path / f"{job}.log").read_text() for job in tasks}
    assert codes == {"ps": 0, "chief": 0, "worker": 0, "evaluator": 0}, {job: log[-2000:] for job, log in logs.items()}
    assert "ps 0: every training replica finished; exiting" in logs["ps"]  # no kill needed
    # The evaluator evaluated the final checkpoint (an async peer's last step can land after the chief's save).
    metrics = final_metrics(logs["evaluator"])
    assert metrics["global_step"] >= 600 and metrics["auc"] > 0.8, metrics
    for job in ("chief", "worker"):  # both replicas trained, on the ps's variables
        assert "loss = " in logs[job] and "trained to global step" in logs[job], logs[job][-2000:]


@pytest.mark.e2e
def test_the_import_defines_no_flag_and_a_name_it_does_not_cover_fails_naming_it():
    check = """
from absl import flags
import tensorflow as tf
before = set(flags.FLAGS)
import ps_trainer.estimator
from ps_trainer import estimator
assert set(flags.FLAGS) == before, set(flags.FLAGS) - before
assert tf.estimator is tf.compat.v1.estimator is estimator and tf.estimator.Estimator is estimator.Estimator
try:
    tf.estimator.BoostedTreesClassifier
except AttributeError as err:
    print(err)
"""
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == ("tf.estimator.BoostedTreesClassifier is not covered by ps_trainer.estimator "
                                     "(docs/estimator.md lists what is)")


CLUSTER = {"chief": ["c0:2222"], "worker": ["w0:2222", "w1:2222"], "ps": ["p0:2222", "p1:2222"]}


@pytest.mark.pure
@pytest.mark.parametrize("task,expected", [
    ({"type": "chief", "index": 0}, ("chief", 0, True, "grpc://c0:2222")),
    ({"type": "worker", "index": 1}, ("worker", 1, False, "grpc://w1:2222")),
    ({"type": "ps", "index": 1}, ("ps", 1, False, "grpc://p1:2222")),
    ({"type": "evaluator", "index": 0}, ("evaluator", 0, False, "")),
])
def test_run_config_reads_its_task_from_tf_config_as_tf1_did(monkeypatch, task, expected):
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "0")  # the import's default, kept from this test process
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": CLUSTER, "task": task}))
    from ps_trainer.estimator import RunConfig  # pylint: disable=import-outside-toplevel
    config = RunConfig(save_checkpoints_steps=50)
    assert (config.task_type, config.task_id, config.is_chief, config.master) == expected
    assert (config.num_ps_replicas, config.num_worker_replicas) == (2, 3)
    assert config.cluster_spec.as_dict() == CLUSTER or expected[0] == "evaluator"
    assert (config.save_checkpoints_steps, config.save_checkpoints_secs) == (50, None)
    assert config.replace(keep_checkpoint_max=2).keep_checkpoint_max == 2 and config.keep_checkpoint_max == 5


@pytest.mark.pure
def test_run_config_without_tf_config_is_one_process_with_tf1s_defaults(monkeypatch):
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "0")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    from ps_trainer.estimator import RunConfig  # pylint: disable=import-outside-toplevel
    config = RunConfig()
    assert (config.task_type, config.task_id, config.is_chief, config.master) == ("worker", 0, True, "")
    assert (config.num_ps_replicas, config.num_worker_replicas) == (0, 1)
    assert (config.save_checkpoints_steps, config.save_checkpoints_secs, config.keep_checkpoint_max) == (None, 600, 5)
    with pytest.raises(ValueError, match="cannot both be set"):
        RunConfig(save_checkpoints_steps=10, save_checkpoints_secs=10)
    with pytest.raises(NotImplementedError, match=r"RunConfig\(train_distribute=...\) is not covered"):
        RunConfig(train_distribute=object())
