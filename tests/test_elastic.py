"""Elastic async workers: a worker joins a running job with --join_address, another leaves it for good
(SIGTERM, as a scale-down sends it, and no restart)."""

import signal
import time

import pytest

from ps_trainer.cluster import model_dir as layout
from ps_trainer.launch import chaos, processes
from tests import support
from tests.support import describe, finished, logged_step, wait_for
from ps_trainer.training import log_lines, queue_hook

pytestmark = pytest.mark.e2e
FILES, ROWS_PER_FILE, BATCH, STEPS = 16, 500, 32, 1200
EXAMPLES = FILES * ROWS_PER_FILE


def test_a_worker_joins_a_running_async_job_and_one_leaves_it_for_good(make_cluster, tmp_path):
    data_dir = tmp_path / "data"
    support.write_numbered_csvs(data_dir, (ROWS_PER_FILE,) * FILES, eval_rows=ROWS_PER_FILE)
    cluster = make_cluster(num_ps=1, num_workers=2, trainer_args=[
        "--dataset=csv", f"--data_dir={data_dir}", "--numeric_columns=x1,x2", "--model=wide_deep",
        "--hidden_units=16", "--input_queue_audit", f"--batch_size={BATCH}", "--shuffle_buffer=1",
        f"--train_steps={STEPS}", "--log_every_n_steps=20", "--save_checkpoint_steps=100000",
        "--worker_gone_secs=5", "--input_queue_lease_secs=600"])
    cluster.start_all()
    deadline = time.monotonic() + 200

    def global_step(job, index):
        return logged_step(cluster.log(job, index))

    wait_for(lambda: global_step("worker", 0) >= 100, deadline - time.monotonic(), "global step 100", cluster)
    # The job holds still until the joining worker's first step: on a loaded machine its start (importing
    # TensorFlow, building its graph) took longer than the job's remaining steps. Paused for less than
    # their lease (--input_queue_lease_secs, longer than the test's deadline), the workers keep their files;
    # one that resumes inside a call to the queue whose deadline passed makes its session again, and one
    # paused past its lease trains none of the files it lost (both: tests/test_work_queue.py).
    for index in (0, 1):
        cluster.kill("worker", index, signal.SIGSTOP)
    joined_at = global_step("worker", 0)
    # Worker 2: not in --worker_hosts of any task, the ps included; its own address only.
    port, metrics_port = processes.free_ports(2)
    address = f"{processes.LOOPBACK}:{port}"
    cluster.start("worker", 2, [f"--join_address={address}", f"--metrics_port={metrics_port}"])
    try:
        wait_for(lambda: log_lines.first_steps(cluster.log("worker", 2)), deadline - time.monotonic(),
                 "the joining worker's first step", cluster)
    finally:
        for index in (0, 1):
            cluster.kill("worker", index, signal.SIGCONT)
    wait_for(lambda: any(not s.first for s in log_lines.steps(cluster.log("worker", 2))), deadline - time.monotonic(),
             "a progress line of the joining worker (20 steps of its own)", cluster)
    served = support.scrape(metrics_port)  # its progress line set them; it trains on past the next
    assert support.metric_value(served, "examples_per_second", task="worker:2") > 0
    assert support.metric_value(served, "global_step", task="worker:2") >= joined_at
    # Worker 1 leaves for good: stopped as a scale-down stops a pod, and never restarted. It gives its
    # files back as it goes (a killed worker's wait for their lease to lapse: tests/test_input_queue.py).
    cluster.kill("worker", 1, signal.SIGTERM)
    left_at = global_step("worker", 0)
    assert left_at < STEPS - 500, f"too late to see the job go on without worker 1: {describe(cluster)}"
    codes = cluster.wait(timeout=max(30, deadline - time.monotonic()))
    assert codes == {("ps", 0): 0, ("worker", 0): 0, ("worker", 1): 143, ("worker", 2): 0}, describe(cluster)

    assert int(finished(cluster.log("worker", 0))["global_step"]) >= STEPS
    ps_log = cluster.log("ps", 0)
    assert f"training replica 2 joined the job at {address}; waiting for it too" in ps_log, describe(cluster)
    assert "training replica 1 (" in ps_log and "it left the job; not waiting for it" in ps_log, describe(cluster)
    assert "every training replica finished (training replica(s) [1] left the job); exiting" in ps_log
    # The joining worker's steps are global steps: its progress lines count past the step it joined at.
    joined = log_lines.steps(cluster.log("worker", 2))
    assert joined[0].step >= joined_at and joined[-1].step >= left_at, describe(cluster)
    # And its examples count: it trained files of the queue, and the epochs done hold every example once.
    assert len(queue_hook.read_audit(layout.audit_file(str(cluster.model_dir), "worker_2"))) > 20 * BATCH
    done = {epoch for log in (cluster.log("worker", i) for i in range(3)) for epoch, _, _ in log_lines.epochs_done(log)}
    audit = chaos.count_audit(cluster.model_dir)
    assert done and all(audit[epoch][0] == EXAMPLES for epoch in done), (done, audit)
    # None twice: it reported what it trained as it left, and no lease lapsed.
    handovers = [line for index in range(3) for line in cluster.log("worker", index).splitlines()
                 if any(word in line for word in ("took back", "silent for", "given to another", "gave back"))]
    assert sum(audit[epoch][1] for epoch in done) == 0, (audit, handovers)
    assert float(finished(cluster.log("worker", 0))["heldout_accuracy"]) > 0.9
