"""Shared fixtures: parsing trainer flags in-process, and real local clusters that always stop."""

import datetime
import os
import signal
import subprocess
import time

import pytest
from absl.flags import FLAGS

from cluster.launch import finished_values, log_time  # noqa: F401  (log_time: for the tests)
from cluster.local import LocalCluster
from flags import config as flag_config
from flags import definitions  # noqa: F401  (defines the trainer's flags)

# Small, fast runs: the defaults of the tests' clusters.
FAST_ARGS = ["--train_steps=200", "--log_every_n_steps=50", "--synthetic_examples=8000",
             "--save_checkpoint_steps=100"]


def read_flags(*args):
    """Parses trainer.py's command line in-process, as trainer.main does, into a RunConfig."""
    FLAGS.unparse_flags()
    argv = FLAGS(["trainer.py", *args])
    return flag_config.read(FLAGS, argv)


@pytest.fixture
def make_cluster(tmp_path):
    """Factory of LocalClusters under tmp_path; every one is stopped at teardown, whatever happened."""
    clusters = []

    def make(num_ps=1, num_workers=2, trainer_args=(), name="run", **options):
        model_dir = tmp_path / name / "model"
        args = [f"--model_dir={model_dir}", *FAST_ARGS, *trainer_args]
        cluster = LocalCluster(tmp_path / name, num_ps, num_workers, args, **options)
        cluster.model_dir = model_dir
        clusters.append(cluster)
        return cluster

    yield make
    for cluster in clusters:
        cluster.stop_all(grace_secs=5)


def run_launcher(argv, timeout: float) -> subprocess.CompletedProcess:
    """Runs a script that starts a cluster of its own (a launcher, the fault script) to its end.

    On a timeout, or when the test itself is interrupted (pytest-timeout), the script gets SIGTERM,
    on which it stops every task it started, before its process group is killed: a SIGKILL alone
    would leave its tasks, each in a session of its own, running.
    """
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except BaseException:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def log_lines(log: str, needle: str) -> list[str]:
    return [line for line in log.splitlines() if needle in line]


def finished(log: str) -> dict[str, str]:
    """key=value pairs of a worker's 'finished:' line, read as the launchers read it."""
    values = finished_values(log)
    assert values, "worker never logged its 'finished:' line"
    return values


def describe(cluster) -> str:
    """Every task's exit state and log tail, for assertion messages."""
    parts = []
    for (job, index), proc in cluster.tasks():
        tail = "\n".join(cluster.log(job, index).splitlines()[-15:])
        parts.append(f"--- {job} {index}: returncode {proc.poll()}\n{tail}")
    return "\n".join(parts)


def wait_recording_exits(cluster, timeout: float) -> dict:
    """Polls every task until all have exited or `timeout` passes: {(job, i): (code, exit time)}."""
    deadline = time.monotonic() + timeout
    exits = {}
    while time.monotonic() < deadline:
        for key, proc in cluster.tasks():
            if key not in exits and proc.poll() is not None:
                exits[key] = (proc.returncode, datetime.datetime.now())
        if len(exits) == len(cluster.tasks()):
            break
        time.sleep(0.1)
    assert len(exits) == len(cluster.tasks()), f"tasks still running after {timeout} s\n{describe(cluster)}"
    return exits
