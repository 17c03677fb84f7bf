"""The planner's model (launch/planner.py, printed by scripts/plan_cluster.py) and the benchmark's per-step measurements
(launch/measure.py), with numbers worked by hand."""

import json
import os

import pytest

from ps_trainer.launch import measure
from ps_trainer.launch import planner

pytestmark = pytest.mark.pure

# 1 ms of math, 2 ms of exchange CPU on the worker, 1 MB of variables; the ps: 0.5 ms + 1 ms per MB.
COSTS = planner.Costs(batch=100, compute_ms=1.0, worker_exchange_ms=2.0, ps_fixed_ms=0.5, ps_ms_per_mb=1.0,
                      model_mb=1.0, local_round_factor=1.0)


def test_a_fast_network_leaves_the_workers_and_the_ps_cpu_to_decide():
    # Worker: 1 + 2 + 2 x 1 MB at 10 Gbit/s (1.25 MB/ms) = 4.6 ms a step; 2 workers ask 435 steps/s.
    # The ps: 0.5 + 1 x 2 MB = 2.5 ms a step, 400 steps/s: it is the limit.
    two = planner.plan(COSTS, workers=2, ps=1, bandwidth_mbit=10000)
    assert two.limit == "ps CPU" and two.steps_per_sec == pytest.approx(400)
    assert two.efficiency == pytest.approx(400 / 2000)  # one process alone: 1000 steps/s
    # A second ps halves the bytes each serves: 0.5 + 1 = 1.5 ms, 667 steps/s; now the workers decide.
    more = planner.plan(COSTS, workers=2, ps=2, bandwidth_mbit=10000)
    assert more.limit == "workers" and more.steps_per_sec == pytest.approx(2 * 1000 / 4.6)


def test_a_slow_link_is_the_limit_and_local_steps_divide_its_load():
    # 80 Mbit/s = 0.01 MB/ms: the ps sends 1 MB per step, 10 steps/s; a worker's step is 203 ms.
    slow = planner.plan(COSTS, workers=4, ps=1, bandwidth_mbit=80)
    assert slow.limit == "ps link" and slow.steps_per_sec == pytest.approx(10)
    # Ten local steps per round trip: a tenth of the bytes per global step.
    local = planner.plan(COSTS, workers=4, ps=1, bandwidth_mbit=80, local_steps=10)
    assert local.limit == "ps link" and local.steps_per_sec == pytest.approx(100)
    # A round costs the ps more CPU than a plain step (it adds, reads and packs): with a fast link and a
    # round at 4x, one ps serves 10 x 1000 / (4 x 2.5) = 1000 steps/s; 4 workers ask about 3,300.
    costly = planner.Costs(**{**COSTS.__dict__, "local_round_factor": 4.0})
    capped = planner.plan(costly, workers=4, ps=1, bandwidth_mbit=1e6, local_steps=10)
    assert capped.limit == "ps CPU" and capped.steps_per_sec == pytest.approx(1000)


def test_the_ps_count_the_planner_asks_for_grows_with_the_workers_until_no_count_is_enough():
    # 4 workers ask 4 x 1000 / 4.6 = 870 steps/s; a ps serves 1000 / (0.5 + 2 / M): 3 ps serve 857 (>= 90%).
    assert [planner.ps_needed(COSTS, n, 10000) for n in (1, 4, 8)] == [1, 3, 15]  # 8: 0.5 + 2 / M <= 0.639
    # Every global step costs each ps 0.5 ms whatever it holds: no ps count serves 64 workers (16,842 steps/s).
    assert planner.ps_needed(COSTS, 64, 10000) is None
    # Ten local steps: a tenth of every ps cost per global step.
    assert planner.ps_needed(COSTS, 8, 10000, local_steps=10) == 2


def test_costs_are_calibrated_from_a_benchmarks_pinned_rows(tmp_path):
    def row(model, layout, kb=0.0, **cpu):
        return {"model": model, "layout": layout, "cpu_ms_per_step": cpu, "loopback_kb_per_step": kb}
    rows = [row("mlp", "single process 1 core", worker_0=2.0), row("cnn", "single process 1 core", worker_0=40.0),
            row("mlp", "1 ps + 1 worker own cores", 2000.0, worker_0=5.0, ps_0=3.0),  # 1 MB each way
            row("cnn", "1 ps + 1 worker own cores", 8000.0, worker_0=46.0, ps_0=9.0),  # 4 MB each way
            row("mlp", "1 ps + 1 worker own cores 10 local", 200.0, worker_0=2.2, ps_0=0.45)]
    for r in rows:
        r["cpu_ms_per_step"] = {k.replace("_", " "): v for k, v in r["cpu_ms_per_step"].items()}
    (tmp_path / "results.json").write_text(json.dumps({"rows": rows}))
    costs = planner.calibrated(tmp_path / "results.json")
    # ps: 3 ms at 2 MB moved, 9 ms at 8 MB: 1 ms per MB and 1 ms fixed; a round costs 4.5 / 3 = 1.5 steps.
    assert costs["mlp"] == planner.Costs(128, 2.0, 3.0, 1.0, 1.0, 1.0, 1.5)
    assert costs["cnn"] == planner.Costs(64, 40.0, 6.0, 4.0, 1.0, 1.0, 1.5)


def test_cpu_and_loopback_counters_are_read_from_proc():
    start = measure.cpu_secs(os.getpid())
    sum(i * i for i in range(2_000_000))  # some CPU time of this process
    assert measure.cpu_secs(os.getpid()) > start
    assert measure.cpu_secs(2**22 + 12345) is None  # no such process
    assert measure.loopback_bytes() >= 0


def test_the_cost_of_a_step_is_taken_between_samples_past_the_warm_up(tmp_path):
    sampler = measure.StepSampler(tmp_path / "chief.log", {"ps 0": 1, "worker 0": 2})
    sampler.samples = [measure.Sample(100, {"ps 0": 1.0, "worker 0": 2.0}, 1000),
                       measure.Sample(300, {"ps 0": 1.2, "worker 0": 2.5}, 5000),
                       measure.Sample(700, {"ps 0": 2.0, "worker 0": 4.5}, 13000)]
    cost = sampler.cost(from_step=300)
    assert cost.steps == 400
    assert cost.cpu_ms == pytest.approx({"ps 0": 2.0, "worker 0": 5.0}) and cost.total_cpu_ms == pytest.approx(7.0)
    assert cost.loopback_bytes == pytest.approx(20)
    assert sampler.cost(from_step=700) is None  # one sample is no interval
