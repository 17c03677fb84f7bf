#!/usr/bin/env python3
"""Past this machine, on paper: steps/s and scaling efficiency of N workers and M ps, from measured
per-step costs and a network bandwidth.

    python scripts/plan_cluster.py                                   # the default MLP, 10 Gbit/s
    python scripts/plan_cluster.py --model=cnn --bandwidth_mbit=25000 --workers=8,32,128 --ps=1,4,16,32
    python scripts/plan_cluster.py --calibration=runs/bench/results.json   # costs from a benchmark run
    python scripts/plan_cluster.py --check --bandwidth_mbit=50       # prediction vs a run over netns links

The model is launch/planner.py's.
"""

import contextlib
import os
import pathlib
import shutil
import signal
import sys
import tempfile
import time

from absl import app, flags

from ps_trainer.launch import netns
from ps_trainer.launch.planner import DEFAULT_COSTS, Costs, calibrated, plan, ps_needed
from ps_trainer.launch.processes import TRAINER
from ps_trainer.training import log_lines

flags.DEFINE_enum("model", "mlp", ["mlp", "cnn"], "Model whose measured costs to use.")
flags.DEFINE_list("workers", ["1", "2", "4", "8", "16", "32", "64", "128"], "Worker counts to plan.")
flags.DEFINE_list("ps", ["1", "2", "4", "8", "16", "32"], "ps counts to plan.")
flags.DEFINE_float("bandwidth_mbit", 10000, "Each host's link, Mbit/s each way.", lower_bound=1)
flags.DEFINE_integer("local_steps", 10, "The lever's setting planned beside plain asynchronous training.",
                     lower_bound=1)
flags.DEFINE_string("calibration", None, "A scripts/benchmark.py results.json with the pinned layouts: their "
                    "measured costs replace the defaults.")
flags.DEFINE_boolean("check", False, "Run 1 ps + 2 workers as three network namespaces whose links send "
                     "--bandwidth_mbit, plain and with --local_steps, and print measured against predicted "
                     "(needs root and iproute2).")
FLAGS = flags.FLAGS


def table(costs, workers, ps_counts, bandwidth_mbit, local_steps) -> str:
    lines = [f"{'workers':>7} {'ps':>4} | {'plain: ex/s':>12} {'eff':>5} {'limit':>8} | "
             f"{f'{local_steps} local: ex/s':>16} {'eff':>5} {'limit':>8}"]
    for n in workers:
        for m in ps_counts:
            a, b = plan(costs, n, m, bandwidth_mbit), plan(costs, n, m, bandwidth_mbit, local_steps)
            lines.append(f"{n:7d} {m:4d} | {a.steps_per_sec * costs.batch:12.0f} {a.efficiency:5.2f} {a.limit:>8} | "
                         f"{b.steps_per_sec * costs.batch:16.0f} {b.efficiency:5.2f} {b.limit:>8}")
    return "\n".join(lines)


# ---------------------------------------------------------------- --check: a run over rate-limited links
CHECK_TIMEOUT_SECS = 900
CHECK_MODELS = {"mlp": ["--model=mlp", "--hidden_units=256", "--batch_size=128"],  # as scripts/benchmark.py
                "cnn": ["--model=cnn", "--batch_size=64"]}


def measured_examples_per_sec(bandwidth_mbit, trainer_args, run_dir: pathlib.Path, batch: int) -> float | None:
    """1 ps + 2 workers, each task a namespace whose link sends bandwidth_mbit; the chief's examples/s,
    or None if a task failed or the run outlasted CHECK_TIMEOUT_SECS (its tasks are then killed)."""
    hosts = netns.Hosts(3, rate_mbit=bandwidth_mbit)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "1", "PYTHONUNBUFFERED": "1"}
    cluster = [f"--ps_hosts={hosts.address(0)}:2222",
               f"--worker_hosts={hosts.address(1)}:2222,{hosts.address(2)}:2222"]
    roles = [("ps", 0), ("worker", 0), ("worker", 1)]
    procs = []
    with contextlib.ExitStack() as logs:
        try:
            for host, (job, index) in enumerate(roles):
                log = logs.enter_context(open(run_dir / f"{job}-{index}.log", "w"))
                procs.append(netns.start_in(hosts.names[host], [
                    sys.executable, str(TRAINER), *cluster, f"--job_name={job}", f"--task_index={index}",
                    f"--model_dir={run_dir / 'model'}", *trainer_args], env, log))
            deadline = time.monotonic() + CHECK_TIMEOUT_SECS
            while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                time.sleep(1)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=30)
            hosts.close()
    if any(proc.returncode != 0 for proc in procs):
        return None
    return log_lines.examples_per_sec((run_dir / "worker-0.log").read_text(errors="replace"), batch, 100)


def check(costs: Costs, model: str, bandwidth_mbit: float, local_steps: int):
    if shutil.which("ip") is None or os.geteuid() != 0:
        raise app.UsageError("--check needs root and iproute2 ('ip'), to make network namespaces")
    print(f"1 ps + 2 workers, each host's link sending {bandwidth_mbit:g} Mbit/s (tc tbf), model {model}:")
    for lever in ([], [f"--local_steps={local_steps}"]):
        with tempfile.TemporaryDirectory() as tmp:
            steps = 400 if not lever else 2000
            args = [*CHECK_MODELS[model], f"--train_steps={steps}", "--log_every_n_steps=20",
                    "--synthetic_examples=20000", "--save_checkpoint_secs=100000", "--export_saved_model=false", *lever]
            measured = measured_examples_per_sec(bandwidth_mbit, args, pathlib.Path(tmp), costs.batch)
        predicted = plan(costs, 2, 1, bandwidth_mbit, local_steps if lever else 1)
        shown = "failed" if measured is None else f"{measured:.0f}"
        print(f"  {' '.join(lever) or 'plain':16} measured {shown:>8} ex/s, predicted "
              f"{predicted.steps_per_sec * costs.batch:8.0f} ex/s (limit: {predicted.limit})", flush=True)


def main(argv):
    del argv
    costs = (calibrated(pathlib.Path(FLAGS.calibration)) if FLAGS.calibration else DEFAULT_COSTS)[FLAGS.model]
    print(f"{FLAGS.model}: {costs}")
    if FLAGS.check:
        check(costs, FLAGS.model, FLAGS.bandwidth_mbit, FLAGS.local_steps)
        return
    workers, ps_counts = [int(n) for n in FLAGS.workers], [int(m) for m in FLAGS.ps]
    print(f"asynchronous training, links of {FLAGS.bandwidth_mbit:g} Mbit/s; eff = scaling efficiency (examples/s "
          f"over N x one process's {1000 / costs.compute_ms * costs.batch:.0f})")
    print(table(costs, workers, ps_counts, FLAGS.bandwidth_mbit, FLAGS.local_steps))
    print("ps tasks that serve 90% of what the workers ask (none: every ps's fixed CPU per round trip caps "
          "the cluster, however many):")
    for n in workers:
        plain, local = (ps_needed(costs, n, FLAGS.bandwidth_mbit, k) for k in (1, FLAGS.local_steps))
        print(f"  {n:4d} workers: plain {plain or 'none'}, {FLAGS.local_steps} local {local or 'none'}")


if __name__ == "__main__":
    app.run(main)
