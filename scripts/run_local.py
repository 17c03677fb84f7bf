#!/usr/bin/env python3
"""Runs a real local cluster of trainer.py: N ps and M workers on free 127.0.0.1 ports.

    python scripts/run_local.py                       # 1 ps + 2 workers, default model and data
    python scripts/run_local.py --num_ps=2 -- --sync_replicas --train_steps=3000

Flags after '--' go to every trainer.py. Streams each worker's progress lines, waits for the
workers, checks that every ps exited on its own, prints a summary, and exits non-zero if any task
failed. On Ctrl-C, SIGTERM or any failure it stops every process it started, by process group.
"""

import datetime
import pathlib
import re
import signal
import sys
import time

from absl import app, flags

from cluster.local import LocalCluster

flags.DEFINE_integer("num_ps", 1, "Number of ps tasks.", lower_bound=1)
flags.DEFINE_integer("num_workers", 2, "Number of worker tasks.", lower_bound=1)
flags.DEFINE_string("run_dir", None, "Logs and model_dir go here. Default: runs/<timestamp>.")
flags.DEFINE_integer("timeout_secs", 1800, "Stop everything if the workers have not finished by then.",
                     lower_bound=1)
flags.DEFINE_integer("ps_exit_secs", 30, "How long the ps tasks may take to exit after the workers.",
                     lower_bound=1)
FLAGS = flags.FLAGS

PROGRESS = re.compile(r"\] ((?:worker|ps):\d+ .*)$")
KEY_VALUE = re.compile(r"(\w+)=(\S+)")


def progress_lines(text: str) -> list[str]:
    return [m.group(1) for m in map(PROGRESS.search, text.splitlines()) if m]


def finished_values(log: str) -> dict[str, str]:
    """The key=value pairs of a worker's 'finished:' line, or {} if it never finished."""
    lines = [line for line in progress_lines(log) if " finished: " in line]
    return dict(KEY_VALUE.findall(lines[-1])) if lines else {}


def stream_progress(cluster, seen: dict) -> None:
    for (job, index), _ in cluster.tasks("worker"):
        lines = progress_lines(cluster.log(job, index))
        for line in lines[seen.get(index, 0):]:
            print(line, flush=True)
        seen[index] = len(lines)


class Interrupted(Exception):
    pass


def interrupt(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


def main(argv):
    trainer_args = argv[1:]
    run_dir = pathlib.Path(FLAGS.run_dir or f"runs/{datetime.datetime.now():%Y%m%d-%H%M%S}").resolve()
    if not any(a.startswith("--model_dir") for a in trainer_args):
        trainer_args.append(f"--model_dir={run_dir / 'model'}")
    # Our own handlers, whatever was inherited: a shell's background job starts with SIGINT ignored.
    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    start = time.monotonic()
    interrupted = None
    with LocalCluster(run_dir, FLAGS.num_ps, FLAGS.num_workers, trainer_args) as cluster:
        try:
            run(cluster, start)
        except Interrupted as signal_name:
            interrupted = signal_name
        codes = {key: proc.poll() for key, proc in cluster.tasks()}
        if interrupted is None and all(codes[key] == 0 for key, _ in cluster.tasks("worker")):
            codes.update(cluster.wait("ps", timeout=FLAGS.ps_exit_secs))
    wall = time.monotonic() - start
    if interrupted:
        print(f"\n{interrupted}: stopped every task ({len(codes)}) after {wall:.1f} s")
        return 130
    chief = finished_values(cluster.log("worker", 0))
    print(f"\nsummary: final step {chief.get('global_step', '?')}, loss {chief.get('loss', '?')}, "
          f"accuracy {chief.get('accuracy', '?')}, wall time {wall:.1f} s")
    for (job, index), code in sorted(codes.items()):
        state = "still running (stopped)" if code is None else f"exit {code}"
        print(f"  {job} {index}: {state}  log {cluster.log_path(job, index)}")
    failed = [key for key, code in codes.items() if code != 0]
    if failed:
        print(f"FAILED: {', '.join(f'{j} {i}' for j, i in sorted(failed))}; see the logs above.")
        return 1
    print(f"checkpoints and summaries in {run_dir / 'model'}")
    return 0


def run(cluster, start):
    """Starts the tasks and streams progress until the workers are done or a task fails."""
    print(f"ps {','.join(cluster.ps_hosts)}; workers {','.join(cluster.worker_hosts)}; "
          f"logs in {cluster.run_dir}", flush=True)
    cluster.start_all()
    for (job, index), proc in cluster.tasks():
        print(f"started {job} {index} (pid {proc.pid})", flush=True)
    seen = {}
    deadline = start + FLAGS.timeout_secs
    while time.monotonic() < deadline:
        stream_progress(cluster, seen)
        codes = {key: proc.poll() for key, proc in cluster.tasks()}
        if any(code not in (None, 0) for code in codes.values()):
            break  # a task failed: stop the rest rather than wait for a cluster that cannot finish
        if all(codes[key] is not None for key, _ in cluster.tasks("worker")):
            break
        time.sleep(1)
    stream_progress(cluster, seen)


if __name__ == "__main__":
    app.run(main)
