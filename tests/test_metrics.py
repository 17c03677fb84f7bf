"""Live metrics: every task of a real cluster serves Prometheus's text format on its own address, and
the values move while it trains."""

import contextlib
import time

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ps_trainer.launch.processes import free_ports
from tests.support import describe, metric_value as value, scrape, wait_for
from ps_trainer.training import metrics


@pytest.mark.pure
def test_a_progress_line_sets_every_gauge_in_the_text_format():
    task = metrics.TaskMetrics("worker:1", "worker")
    task.progress(global_step=120, own_steps=60, examples_per_sec=3200.5, loss=0.42, accuracy=0.9,
                  staleness={"mean": 1.0, "max": 3.0})
    task.held_out({"accuracy": 0.91})
    task.ps_bytes({"/job:ps/task:0": 1024})
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(generate_latest(task.registry).decode())
               for s in family.samples}
    assert value(samples, "global_step", task="worker:1") == 120
    assert value(samples, "examples_per_second", task="worker:1") == 3200.5
    assert value(samples, "staleness", task="worker:1", stat="max") == 3.0
    assert value(samples, "heldout", task="worker:1", metric="accuracy") == 0.91
    assert value(samples, "ps_variable_bytes", task="worker:1", ps="/job:ps/task:0") == 1024
    assert value(samples, "task_info", task="worker:1", job="worker") == 1


@pytest.mark.e2e
def test_every_task_of_a_running_cluster_serves_metrics_that_move(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=2, trainer_args=["--train_steps=1000", "--log_every_n_steps=20"])
    ports = dict(zip([("ps", 0), ("worker", 0), ("worker", 1)], free_ports(3)))
    for (job, index), port in ports.items():
        cluster.start(job, index, [f"--metrics_port={port}"])
    deadline = time.monotonic() + 120

    def scraped_step(key, above=0):
        """The first global step the task serves past `above`: served once the task is up, moving once
        it trains (a progress line every 20 steps sets it; on a loaded machine 20 steps can take seconds)."""
        served = []

        def past():
            with contextlib.suppress(OSError, KeyError):
                served.append(value(scrape(ports[key]), "global_step", task=f"{key[0]}:{key[1]}"))
            return bool(served) and served[-1] > above

        wait_for(past, deadline - time.monotonic(), f"{key} to serve a global step past {above}", cluster)
        return served[-1]

    first = {key: scraped_step(key) for key in (("worker", 0), ("worker", 1))}
    for key, step in first.items():
        scraped_step(key, above=step)
    ps = scrape(ports[("ps", 0)])
    assert value(ps, "task_info", task="ps:0", job="ps") == 1
    chief = scrape(ports[("worker", 0)])
    assert value(chief, "ps_variable_bytes", task="worker:0", ps="/job:ps/task:0") > 1e6  # the MLP: 1.6 MB
    assert value(chief, "examples_per_second", task="worker:0") > 0
    assert 0 < value(chief, "loss", task="worker:0") < 10
    assert ("pstrainer_staleness", (("stat", "mean"), ("task", "worker:0"))) in chief
    assert set(cluster.wait(timeout=240).values()) == {0}, describe(cluster)
