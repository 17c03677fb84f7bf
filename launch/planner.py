"""The planner's model of a cluster (scripts/plan_cluster.py): steps/s and scaling efficiency of N
workers and M ps tasks from measured per-step costs and a link bandwidth.

The model (asynchronous training; K = --local_steps, 1 without the lever). A worker's global step
costs its computation, plus CPU for the exchange (serialization, gRPC) divided by K, plus the time
its variables and gradients take on its link (both directions at once, so one model's bytes / K).
The ps tasks split the variables evenly; each ps spends, per global step, a fixed CPU cost per
round trip plus CPU in proportion to the bytes it moves, and sends its share of the variables on
its own link. Steps/s is the lesser of what the workers ask (N over a worker's step time) and what
the busiest ps's CPU or link can serve. Scaling efficiency is that over N times one process's speed.
Every cost is per process on a core of its own, as measured by scripts/benchmark.py's pinned layouts
('single process 1 core', '1 ps + 1 worker own cores'); the defaults below were measured that way here.
"""

import dataclasses
import json
import pathlib


@dataclasses.dataclass(frozen=True)
class Costs:
    """One model's per-step costs, each process on a core of its own."""
    batch: int
    compute_ms: float  # one process's CPU per step ('single process 1 core')
    worker_exchange_ms: float  # the worker's extra CPU per round trip ('1 ps + 1 worker own cores' - compute)
    ps_fixed_ms: float  # the ps's CPU per round trip whatever its bytes
    ps_ms_per_mb: float  # the ps's CPU per MB it sends and receives
    model_mb: float  # the variables (and so the gradients) of one step, MB


# Measured here (scripts/benchmark.py, pinned layouts; CPU from /proc, bytes from the loopback
# counter): mlp: single 1 core 1.72 ms/step; 1 ps + 1 worker own cores: worker 5.59 ms, ps 3.10 ms,
# 1.63 MB per step; with --local_steps=10: ps 0.54 ms per global step (so 5.4 ms per round trip of
# 1.6 MB in each direction... see the fixed/per-MB split in docs/speed.md).
DEFAULT_COSTS = {
    "mlp": Costs(batch=128, compute_ms=1.72, worker_exchange_ms=3.87, ps_fixed_ms=0.5, ps_ms_per_mb=1.6,
                 model_mb=0.814),
    "mlp10m": Costs(batch=128, compute_ms=95.0, worker_exchange_ms=30.0, ps_fixed_ms=0.5, ps_ms_per_mb=1.6,
                    model_mb=39.3),
    "cnn": Costs(batch=64, compute_ms=60.0, worker_exchange_ms=8.0, ps_fixed_ms=0.5, ps_ms_per_mb=1.6,
                 model_mb=13.1),
}


@dataclasses.dataclass(frozen=True)
class Plan:
    steps_per_sec: float
    limit: str  # what caps it: workers, ps CPU, ps link
    efficiency: float


def plan(costs: Costs, workers: int, ps: int, bandwidth_mbit: float, local_steps: int = 1) -> Plan:
    """Asynchronous training's global steps/s and scaling efficiency for `workers` and `ps` tasks."""
    link_mb_per_ms = bandwidth_mbit / 8 / 1000  # MB per ms, each way
    step_ms = (costs.compute_ms + costs.worker_exchange_ms / local_steps
               + costs.model_mb / local_steps / link_mb_per_ms)
    asked = workers * 1000 / step_ms
    share_mb = costs.model_mb / ps / local_steps  # each way, per global step, per ps
    ps_cpu = 1000 / (costs.ps_fixed_ms / local_steps + costs.ps_ms_per_mb * 2 * share_mb)
    ps_link = 1000 * link_mb_per_ms / share_mb
    steps, limit = min((asked, "workers"), (ps_cpu, "ps CPU"), (ps_link, "ps link"))
    return Plan(steps, limit, steps / (workers * 1000 / costs.compute_ms))


def ps_needed(costs, workers, bandwidth_mbit, local_steps=1, efficiency=0.9, most=4096) -> int | None:
    """The fewest ps tasks that serve `efficiency` of what the workers ask, or None if no count does
    (each ps's fixed CPU per round trip caps it, however little of the model it holds)."""
    asked = workers * plan(costs, 1, most, bandwidth_mbit, local_steps).steps_per_sec  # one worker, never held
    return next((ps for ps in range(1, most + 1)
                 if plan(costs, workers, ps, bandwidth_mbit, local_steps).steps_per_sec >= efficiency * asked), None)


def calibrated(path: pathlib.Path, model: str) -> Costs:
    """Costs from a benchmark's results.json rows for 'single process 1 core' and '1 ps + 1 worker own
    cores'. One run cannot split the ps's CPU into its fixed and per-MB parts: the per-MB part is
    kept from the defaults, the fixed part is what is left."""
    rows = {row["layout"]: row for row in json.loads(path.read_text())["rows"] if row["model"] == model}
    single = rows["single process 1 core"]["cpu_ms_per_step"]["worker 0"]
    plain = rows["1 ps + 1 worker own cores"]
    model_mb = plain["loopback_kb_per_step"] / 1000 / 2
    per_mb = DEFAULT_COSTS[model].ps_ms_per_mb
    fixed = max(0.0, plain["cpu_ms_per_step"]["ps 0"] - per_mb * 2 * model_mb)
    return Costs(DEFAULT_COSTS[model].batch, single, plain["cpu_ms_per_step"]["worker 0"] - single, fixed, per_mb,
                 model_mb)
