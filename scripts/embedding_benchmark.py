#!/usr/bin/env python3
"""Dynamic against hashed embedding tables on zipf_clicks, and prints a table.

    python scripts/embedding_benchmark.py
    python scripts/embedding_benchmark.py --examples=1000000 --steps=20000 --layouts="1 ps + 2 workers"

Trains wide_deep on --dataset=zipf_clicks (input/zipf_clicks.py: Criteo's columns, Zipf-distributed
IDs) with dynamic tables first, then with hashed tables of as many rows in all as the dynamic ones
ended with live (--hash_buckets = live rows / 26 tables), and of a quarter of that, where IDs
collide more. Each in one process, and, for dynamic and the equal-rows hashed tables, on 1 ps + 2
workers (real processes on 127.0.0.1). Prints per run: the rows, held-out AUC and log loss of the
final checkpoint, steady examples/s (global steps in the workers' progress lines past
--warmup_steps), the ps's peak resident memory (the one process's, when alone; TensorFlow's own
few hundred MiB included, and a dynamic table's whole capacity), and the whole run's time.
"""

import dataclasses
import pathlib
import re
import sys
import time

from absl import app, flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from ps_trainer.input import zipf_clicks  # noqa: E402
from ps_trainer.launch.processes import LocalCluster, SingleProcess  # noqa: E402
from ps_trainer.training import log_lines  # noqa: E402

flags.DEFINE_integer("examples", 200000, "Training examples generated (--synthetic_examples).", lower_bound=1000)
flags.DEFINE_integer("steps", 4000, "Global steps of each run.", lower_bound=100)
flags.DEFINE_integer("batch_size", 100, "Examples per worker step.", lower_bound=1)
flags.DEFINE_integer("embedding_dim", 8, "Width of the embeddings.", lower_bound=1)
flags.DEFINE_integer("capacity", 200000, "--embedding_capacity of the dynamic tables (rows per table).", lower_bound=2)
flags.DEFINE_integer("warmup_steps", 500, "Global steps before examples/s is measured.", lower_bound=0)
flags.DEFINE_list("layouts", ["one process", "1 ps + 2 workers"], "Layouts to run: 'one process', '1 ps + 2 workers'.")
flags.DEFINE_string("output_dir", "runs/embedding_benchmark", "Where each run's model_dir and logs go.")
FLAGS = flags.FLAGS

CLUSTER = "1 ps + 2 workers"
TABLES = len(zipf_clicks.CARDINALITIES)


@dataclasses.dataclass
class Row:
    tables: str
    layout: str
    rows: int | None
    auc: float | None
    loss: float | None
    examples_per_sec: float | None
    ps_peak_mib: float | None
    seconds: float
    ok: bool


def peak_rss_mib(pid: int) -> float | None:
    try:
        status = pathlib.Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found = re.search(r"VmHWM:\s+(\d+) kB", status)
    return int(found.group(1)) / 1024 if found else None


def run(name: str, layout: str, table_args: list[str], rows: int | None) -> Row:
    directory = pathlib.Path(FLAGS.output_dir).resolve() / f"{name}-{layout}".replace(" ", "_").replace("+", "")
    args = [f"--model_dir={directory / 'model'}", "--model=wide_deep", "--dataset=zipf_clicks",
            f"--synthetic_examples={FLAGS.examples}", f"--train_steps={FLAGS.steps}",
            f"--batch_size={FLAGS.batch_size}", f"--embedding_dim={FLAGS.embedding_dim}", "--hidden_units=64",
            "--log_every_n_steps=100", "--save_checkpoint_secs=100000", "--export_saved_model=false",
            "--not_learning=warn", *table_args]
    cluster = SingleProcess(directory, args) if layout != CLUSTER else LocalCluster(directory, 1, 2, args)
    start, peak = time.monotonic(), None
    with cluster:
        cluster.start_all()
        watched = cluster.procs[("ps", 0) if layout == CLUSTER else ("worker", 0)]
        deadline = start + 3600
        while any(proc.poll() is None for _, proc in cluster.tasks()) and time.monotonic() < deadline:
            peak = max(filter(None, [peak, peak_rss_mib(watched.pid)]), default=None)
            time.sleep(0.5)
        codes = cluster.wait(timeout=max(0.0, deadline - time.monotonic()))
    chief = cluster.log("worker", 0)
    finished = log_lines.finished_values(chief)
    live = re.findall(r"at the end, live rows: (.*)", chief)
    if live:
        rows = sum(int(count) for count in re.findall(r" (\d+)(?: \(|,|$)", live[-1]))
    # Global steps per second from any worker's progress lines: a worker that started late logs few.
    rates = [log_lines.examples_per_sec(cluster.log(*task), FLAGS.batch_size, FLAGS.warmup_steps)
             for task, _ in cluster.tasks("worker")]
    return Row(name, layout, rows, _float(finished.get("heldout_auc")), _float(finished.get("heldout_loss")),
               max(filter(None, rates), default=None), peak, time.monotonic() - start, set(codes.values()) == {0})


def _float(text):
    return float(text) if text else None


def table(rows: list[Row]) -> str:
    lines = ["| tables | layout | rows | held-out AUC | held-out loss | examples/s | ps peak MiB | whole s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        lines.append(f"| {row.tables} | {row.layout} | {row.rows or ''} | {_fmt(row.auc, '.4f')} | "
                     f"{_fmt(row.loss, '.4f')} | {_fmt(row.examples_per_sec, '.0f')} | "
                     f"{_fmt(row.ps_peak_mib, '.0f')} | {row.seconds:.1f}{'' if row.ok else ' FAILED'} |")
    return "\n".join(lines)


def _fmt(value, spec):
    return "" if value is None else format(value, spec)


def main(argv):
    del argv
    unknown = set(FLAGS.layouts) - {"one process", CLUSTER}
    if unknown:
        raise app.UsageError(f"--layouts: unknown {', '.join(sorted(unknown))}")
    results = []

    def record(row):
        results.append(row)
        print(table([row]).splitlines()[-1], flush=True)

    dynamic = ["--embedding=dynamic", f"--embedding_capacity={FLAGS.capacity}"]
    first = run("dynamic", "one process", dynamic, None)
    record(first)
    if not first.rows:
        raise SystemExit("the dynamic run logged no live rows: see its log under --output_dir")
    buckets = max(1, first.rows // TABLES)
    hashed = {f"hashed {buckets}": [f"--hash_buckets={buckets}"],
              f"hashed {buckets // 4}": [f"--hash_buckets={max(1, buckets // 4)}"]}
    if "one process" in FLAGS.layouts:
        for name, args in hashed.items():
            record(run(name, "one process", args, int(args[0].split("=")[1]) * TABLES))
    if CLUSTER in FLAGS.layouts:
        record(run("dynamic", CLUSTER, dynamic, None))
        name, args = next(iter(hashed.items()))
        record(run(name, CLUSTER, args, buckets * TABLES))
    print("\n" + table(results))


if __name__ == "__main__":
    app.run(main)
