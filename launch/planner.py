"""The planner's model of a cluster (scripts/plan_cluster.py): steps/s and scaling efficiency of N
workers and M ps tasks from measured per-step costs and a link bandwidth.

The model (asynchronous training; K = --local_steps, 1 without the lever). A worker's global step
costs its computation, plus CPU for the exchange (serialization, gRPC) divided by K, plus the time
its variables and then its gradients take on its link (one after the other: twice the model's bytes,
over K).
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


PS_FIXED_MS = 1.70  # the ps's CPU per round trip whatever its bytes
PS_MS_PER_MB = 0.897  # the ps's CPU per MB it receives and sends
LOCAL_ROUND_FACTOR = 1.65  # a --local_steps round's ps CPU over a plain step's (it adds, reads, packs)


@dataclasses.dataclass(frozen=True)
class Costs:
    """One model's per-step costs, each process on a core of its own."""
    batch: int
    compute_ms: float  # one process's CPU per step ('single process 1 core')
    worker_exchange_ms: float  # the worker's extra CPU per round trip ('1 ps + 1 worker own cores' - compute)
    model_mb: float  # the variables (and so the gradients) of one step, MB
    ps_fixed_ms: float = PS_FIXED_MS
    ps_ms_per_mb: float = PS_MS_PER_MB
    local_round_factor: float = LOCAL_ROUND_FACTOR


# Measured here by scripts/benchmark.py's pinned layouts (2 repetitions; CPU from /proc, bytes from the
# loopback counter): mlp: one process on one core 2.46 ms per step, the worker of 1 ps + 1 worker 5.81
# ms, 1.63 MB per step; cnn: 40.8 ms, 46.9 ms, 6.84 MB. The ps's CPU per step, 3.16 ms (mlp) and 7.83 ms
# (cnn), gives its fixed and per-MB parts; with --local_steps=10 the ps spent 0.50 and 1.37 ms per global
# step: a round costs it 1.58 and 1.75 times a plain step.
DEFAULT_COSTS = {
    "mlp": Costs(batch=128, compute_ms=2.46, worker_exchange_ms=3.35, model_mb=0.814),
    "cnn": Costs(batch=64, compute_ms=40.8, worker_exchange_ms=6.15, model_mb=3.42),
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
               + 2 * costs.model_mb / local_steps / link_mb_per_ms)
    asked = workers * 1000 / step_ms
    share_mb = costs.model_mb / ps  # each way, per round trip, per ps
    round_ms = (costs.ps_fixed_ms + costs.ps_ms_per_mb * 2 * share_mb) * (
        costs.local_round_factor if local_steps > 1 else 1.0)
    ps_cpu = 1000 * local_steps / round_ms
    ps_link = 1000 * link_mb_per_ms * local_steps / share_mb
    steps, limit = min((asked, "workers"), (ps_cpu, "ps CPU"), (ps_link, "ps link"))
    return Plan(steps, limit, steps / (workers * 1000 / costs.compute_ms))


def ps_needed(costs, workers, bandwidth_mbit, local_steps=1, efficiency=0.9, most=4096) -> int | None:
    """The fewest ps tasks that serve `efficiency` of what the workers ask, or None if no count does
    (each ps's fixed CPU per round trip caps it, however little of the model it holds)."""
    asked = workers * plan(costs, 1, most, bandwidth_mbit, local_steps).steps_per_sec  # one worker, never held
    return next((ps for ps in range(1, most + 1)
                 if plan(costs, workers, ps, bandwidth_mbit, local_steps).steps_per_sec >= efficiency * asked), None)


def calibrated(path: pathlib.Path) -> dict[str, Costs]:
    """Costs from a benchmark's results.json, for each model with the rows 'single process 1 core' and
    '1 ps + 1 worker own cores' (and '... 10 local' for the round factor). With two such models the
    ps's fixed and per-MB parts are solved from both; with one, the per-MB part stays the default's."""
    rows = {(row["model"], row["layout"]): row for row in json.loads(path.read_text())["rows"]}
    measured = {}
    for model in sorted({model for model, _ in rows}):
        single, plain = rows.get((model, "single process 1 core")), rows.get((model, "1 ps + 1 worker own cores"))
        if not (single and plain and single["cpu_ms_per_step"] and plain["cpu_ms_per_step"]):
            continue
        local = rows.get((model, "1 ps + 1 worker own cores 10 local"))
        compute = single["cpu_ms_per_step"]["worker 0"]
        measured[model] = dict(compute=compute, exchange=plain["cpu_ms_per_step"]["worker 0"] - compute,
                               mb=plain["loopback_kb_per_step"] / 1000 / 2, ps=plain["cpu_ms_per_step"]["ps 0"],
                               ps_local=local["cpu_ms_per_step"]["ps 0"] * 10 if local and local["cpu_ms_per_step"]
                               else None)
    per_mb = PS_MS_PER_MB
    if len(measured) >= 2:
        (a, b) = sorted(measured.values(), key=lambda m: m["mb"])[:2]
        per_mb = (b["ps"] - a["ps"]) / (2 * (b["mb"] - a["mb"]))
    fixed = (min(max(0.0, m["ps"] - per_mb * 2 * m["mb"]) for m in measured.values()) if measured
             else PS_FIXED_MS)
    factors = [m["ps_local"] / m["ps"] for m in measured.values() if m["ps_local"]]
    factor = sum(factors) / len(factors) if factors else LOCAL_ROUND_FACTOR
    return {model: Costs(DEFAULT_COSTS[model].batch if model in DEFAULT_COSTS else 128, m["compute"], m["exchange"],
                         m["mb"], fixed, per_mb, factor) for model, m in measured.items()}
