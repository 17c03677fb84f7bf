#!/usr/bin/env python3
"""An epoch through --input_queue against the fixed shards: its speed, and with one worker slowed.

    python scripts/queue_benchmark.py                     # 1 ps + 2 workers, tfrecord, 2 repetitions
    python scripts/queue_benchmark.py --repetitions=3 -- --batch_size=512

Writes --files TFRecord files of --rows_per_file click-like rows, then trains one epoch of them with
wide_deep on a real local cluster (1 ps + 2 workers), in four layouts taken in turn:
  shards, queue             fixed shards (--train_steps: one epoch of global steps), or --input_queue
                            --num_epochs=1
  shards/slow, queue/slow   the same with worker 1 at half speed: its process group stopped and
                            continued every 50 ms (SIGSTOP/SIGCONT, by its own id)
The figure is the epoch's wall time from the chief's first step. With the queue, to the 'epoch 0 done'
line. With fixed shards, to when the slower worker has read its whole shard once: its shard's steps
at its own step rate over the run (the faster one meanwhile trains on, repeating its shard, which
is what fixed shards do). Trainer flags after '--' go to every run. Prints a table, writes results.json.
"""

import json
import os
import pathlib
import signal
import statistics
import threading
import time

from absl import app, flags

from ps_trainer.launch import terminal
from ps_trainer.launch.processes import LocalCluster
from ps_trainer.training import log_lines

flags.DEFINE_integer("files", 64, "Training files.", lower_bound=2)
flags.DEFINE_integer("rows_per_file", 4000, "Rows per file.", lower_bound=1)
flags.DEFINE_integer("batch_size", 256, "Per-worker batch size.", lower_bound=1)
flags.DEFINE_integer("repetitions", 2, "Repetitions of every layout.", lower_bound=1)
flags.DEFINE_list("layouts", ["shards", "queue", "shards/slow", "queue/slow"], "Layouts to run.")
flags.DEFINE_string("output_dir", None, "Where the data, logs and results.json go. Default: "
                    "runs/queue-benchmark-<timestamp>.")
flags.DEFINE_integer("timeout_secs", 600, "Give up on one run after this long.", lower_bound=1)
FLAGS = flags.FLAGS
SLOW_SLICE_SECS = 0.05


def write_data(data_dir: pathlib.Path) -> None:
    import numpy as np  # noqa: PLC0415  (loaded where used: the parent process forks its tasks without them)
    from ps_trainer.input import tfrecord  # noqa: PLC0415  (loaded where used: the parent process forks its tasks without them)
    from ps_trainer.input.specs import DataConfig, tabular_spec  # noqa: PLC0415  (loaded where used: the parent process forks its tasks without them)
    spec = tabular_spec(DataConfig(numeric_columns=("x1", "x2"), categorical_columns=("item",)))
    rng = np.random.RandomState(0)
    for split, files in (("train", FLAGS.files), ("eval", 1)):
        rows = files * FLAGS.rows_per_file
        x, item = rng.normal(size=(rows, 2)), rng.randint(1000, size=rows)
        label = ((x[:, 0] + x[:, 1] + (item % 7 == 0)) > 0.3).astype(int)
        examples = (({"x1": a, "x2": b, "item": f"i{c}".encode()}, int(y)) for (a, b), c, y in zip(x, item, label))
        tfrecord.write(examples, spec, str(data_dir), split, files)


def throttle(cluster, stop: threading.Event) -> None:
    """Worker 1 at half speed, by its own process group, until stop; always continued at the end."""
    pgid = cluster.procs[("worker", 1)].pid
    try:
        while not stop.is_set():
            os.killpg(pgid, signal.SIGSTOP)
            time.sleep(SLOW_SLICE_SECS)
            os.killpg(pgid, signal.SIGCONT)
            time.sleep(SLOW_SLICE_SECS)
    except ProcessLookupError:
        pass
    finally:
        try:
            os.killpg(pgid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def epoch_secs(layout: str, logs: list[str], epoch_steps: int) -> float | None:
    first = min(s.time for log in logs for s in log_lines.first_steps(log))
    if layout.startswith("queue"):
        done = [line for log in logs for line in log.splitlines() if ": input queue: epoch 0 done" in line]
        return (min(map(log_lines.log_time, done)) - first).total_seconds() if done else None
    spans = []
    for log in logs:  # each worker's shard is half the epoch; read at that worker's own step rate
        values, starts = log_lines.finished_values(log), log_lines.first_steps(log)
        end = [line for line in log.splitlines() if " finished: " in line]
        if not values or not starts or not end:
            return None
        trained = (log_lines.log_time(end[-1]) - starts[-1].time).total_seconds()
        rate = int(values["local_steps"]) / trained
        spans.append((starts[-1].time - first).total_seconds() + epoch_steps / 2 / rate)
    return max(spans)


def run_one(run_dir: pathlib.Path, data_dir: pathlib.Path, layout: str, extra_args) -> dict:
    epoch_steps = FLAGS.files * FLAGS.rows_per_file // FLAGS.batch_size
    args = [f"--model_dir={run_dir / 'model'}", "--dataset=tfrecord", f"--data_dir={data_dir}",
            "--numeric_columns=x1,x2", "--categorical_columns=item", "--model=wide_deep",
            f"--batch_size={FLAGS.batch_size}", "--export_saved_model=false", "--save_checkpoint_secs=3600",
            "--not_learning=off", "--log_every_n_steps=50",
            *(["--input_queue", "--num_epochs=1"] if layout.startswith("queue") else [f"--train_steps={epoch_steps}"]),
            *extra_args]
    stop = threading.Event()
    with LocalCluster(run_dir, 1, 2, args) as cluster:
        cluster.start_all()
        slow = threading.Thread(target=throttle, args=(cluster, stop)) if layout.endswith("/slow") else None
        if slow:
            slow.start()
        try:
            codes = cluster.wait("worker", timeout=FLAGS.timeout_secs)
            codes.update(cluster.wait("ps", timeout=60))
        finally:
            stop.set()
            if slow:
                slow.join()
        logs = [cluster.log("worker", i) for i in (0, 1)]
    secs = epoch_secs(layout, logs, epoch_steps)
    return {"layout": layout, "all_exit_0": all(code == 0 for code in codes.values()),
            "epoch_secs": None if secs is None else round(secs, 2),
            "examples_per_sec": None if not secs else round(epoch_steps * FLAGS.batch_size / secs)}


def main(argv):
    terminal.interrupt_on_signals()
    extra_args = argv[1:]
    out = pathlib.Path(FLAGS.output_dir or f"runs/queue-benchmark-{time.strftime('%Y%m%d-%H%M%S')}")
    data_dir = out / "data"
    write_data(data_dir)
    results = []
    for repetition in range(FLAGS.repetitions):
        for layout in FLAGS.layouts:
            result = run_one(out / f"{layout.replace('/', '-')}-{repetition}", data_dir, layout, extra_args)
            results.append(result)
            print(f"{layout:12s} rep {repetition}: epoch {result['epoch_secs']} s, {result['examples_per_sec']} "
                  f"examples/s, all exit 0: {result['all_exit_0']}", flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    medians = {layout: statistics.median([r["epoch_secs"] for r in results if r["layout"] == layout
                                          and r["epoch_secs"]] or [float("nan")]) for layout in FLAGS.layouts}
    for layout, secs in medians.items():
        print(f"{layout:12s} epoch {secs:.1f} s (median of {FLAGS.repetitions})")
    if {"shards", "queue"} <= medians.keys():
        print(f"queue / shards, epoch time: {medians['queue'] / medians['shards']:.2f}")
    if {"shards/slow", "queue/slow"} <= medians.keys():
        print(f"queue / shards with worker 1 at half speed: {medians['queue/slow'] / medians['shards/slow']:.2f}")
    print(f"results in {out / 'results.json'}")
    return 0 if all(r["all_exit_0"] for r in results) else 1


if __name__ == "__main__":
    app.run(main)
