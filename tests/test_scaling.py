"""End to end: learning holds as workers are added, and a run that is not learning says so and stops."""

import pathlib

import pytest
import tensorflow as tf

from tests.support import describe, finished, lines_with, run_trainer, wait_recording_exits
from ps_trainer.training.config import TrainConfig

pytestmark = pytest.mark.e2e
TIMEOUT = 300


def summary_tags(directory: pathlib.Path) -> set:
    return {value.tag for path in directory.glob("events.out.tfevents.*")
            for event in tf.compat.v1.train.summary_iterator(str(path)) for value in event.summary.value}


LOG_EVERY = TrainConfig().log_every_n_steps  # the default, which this test keeps


@pytest.mark.parametrize("lever,optimizer_line", [
    ([], "momentum 0.6, learning rate 0.05 (the defaults for 4 async worker(s)"),
    (["--local_steps=10"], "momentum 0.9, learning rate 0.05 (the defaults for 4 local-step worker(s)"),
])
def test_four_async_workers_at_the_default_flags_learn(make_cluster, lever, optimizer_line):
    # The default optimizer settings and data size, 1500 global steps: 4 async workers reached 0.79 held
    # out there, 0.77 with --local_steps=10 (measured alone; at 3000 steps 0.84-0.85, and 0.79 with
    # another test's cluster on the same two cores, where staleness grows). The bar is far from what
    # this test guards against, momentum 0.9 with 4 async workers staying at chance (0.1), and far
    # enough below what it reaches for a loaded machine.
    steps = 1500
    cluster = make_cluster(num_ps=1, num_workers=4, trainer_args=[
        f"--train_steps={steps}", "--synthetic_examples=60000", "--save_checkpoint_steps=1000", *lever])
    cluster.start_all()
    exits = wait_recording_exits(cluster, TIMEOUT)
    assert all(code == 0 for code, _ in exits.values()), describe(cluster)

    chief_log = cluster.log("worker", 0)
    assert lines_with(chief_log, optimizer_line)
    # Judged on held-out data: the chief evaluates the final checkpoint on the held-out split.
    result = finished(chief_log)
    assert int(result["global_step"]) >= steps
    assert float(result["heldout_accuracy"]) >= 0.6, describe(cluster)
    # Staleness is measured: in the progress lines and in the summaries of every worker that took two
    # runs or more. A worker's first run has no earlier read to compare with; under CI's load a chief's
    # first run once outlasted the other workers' 3000 steps (it finished with local_steps=10). A worker
    # prints progress each time its local steps pass a multiple of --log_every_n_steps after its first
    # run, so only one with that many local steps must have printed: how many did depends on the load
    # (CI once had two of four below it).
    steps_per_run = 10 if lever else 1
    measured = 0
    for index in range(4):
        log = cluster.log("worker", index)
        assert not lines_with(log, "not learning"), log[-2000:]
        progress = [line for line in lines_with(log, " examples/sec ") if " finished: " not in line]
        assert all(" staleness mean " in line for line in progress), progress
        local_steps = int(finished(log)["local_steps"])
        if local_steps >= max(LOG_EVERY, 2 * steps_per_run):
            assert progress, (index, log[-2000:])
        if local_steps > steps_per_run:
            measured += bool(progress)
            tags = summary_tags(cluster.model_dir / "workers" / f"worker_{index}")
            assert {"staleness/mean", "staleness/max"} <= tags, (index, tags)
    assert measured >= 1, describe(cluster)


def run_small(tmp_path, *args):
    return run_trainer(f"--model_dir={tmp_path / 'model'}", "--train_steps=600", "--log_every_n_steps=50",
                       "--synthetic_examples=4000", "--export_saved_model=false", *args, timeout=TIMEOUT)


def test_a_diverging_run_stops_with_the_reason_or_warns_and_goes_on(tmp_path):
    # A healthy run is not stopped: every e2e test trains at --not_learning=stop and must exit 0.
    # A learning rate 400 times the default: the loss climbs far above chance and stays there.
    diverging = run_small(tmp_path / "diverging", "--learning_rate=20")
    assert diverging.returncode == 1, diverging.stderr[-3000:]
    reason = [line for line in diverging.stderr.splitlines() if "not learning" in line]
    assert reason and "--learning_rate=20" in reason[-1]
    assert " finished: " not in diverging.stderr

    warned = run_small(tmp_path / "warned", "--learning_rate=20", "--not_learning=warn")
    assert warned.returncode == 0, warned.stderr[-3000:]
    assert "not learning" in warned.stderr and " finished: global_step=600 " in warned.stderr
