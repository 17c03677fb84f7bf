"""Runs a ProcessCluster to the end for a person at a terminal: the local and SSH launchers.

Starts every task, streams each worker's progress lines, waits for the workers, gives the ps tasks
time to exit on their own, prints a summary, and returns an exit code. On SIGINT or SIGTERM, or as
soon as any task fails, it stops every task it started.
"""

import datetime
import pathlib
import signal
import time

from absl import app, flags

from ps_trainer.launch import processes
from ps_trainer.training import exit_codes, log_lines


class Interrupted(Exception):
    pass


def _interrupt(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


def interrupt_on_signals() -> None:
    """SIGTERM and SIGINT raise KeyboardInterrupt in the main thread, whatever was inherited, so that
    a script's `with cluster:` blocks stop every task it started."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)
    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)


def define_flags(run_dir_default: str, timeout_secs: int, ps_exit_secs: int) -> None:
    """The flags every launcher has, with its own defaults."""
    flags.DEFINE_string("run_dir", None, f"Local directory for logs. Default: {run_dir_default}.")
    flags.DEFINE_integer("timeout_secs", timeout_secs,
                         "Stop everything if the workers have not finished by then.", lower_bound=1)
    flags.DEFINE_integer("ps_exit_secs", ps_exit_secs,
                         "How long the ps tasks may take to exit after the workers.", lower_bound=1)


def check_ports() -> None:
    """The ports a local launcher picks from (PS_TRAINER_PORTS, launch/processes.py), read before any task
    starts: a bad value is a usage error in one line, as a bad flag is."""
    try:
        processes.port_range()
    except ValueError as err:
        raise app.UsageError(str(err)) from None


def run_dir(prefix: str = "") -> pathlib.Path:
    """--run_dir, or runs/<prefix><timestamp>."""
    default = f"runs/{prefix}{datetime.datetime.now():%Y%m%d-%H%M%S}"
    return pathlib.Path(flags.FLAGS.run_dir or default).resolve()


def launch(cluster, timeout_secs: float, ps_exit_secs: float) -> int:
    # Our own handlers, whatever was inherited: a shell's background job starts with SIGINT ignored.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    start = time.monotonic()
    interrupted = None
    with cluster:
        try:
            _run(cluster, start + timeout_secs)
        except Interrupted as signal_name:
            interrupted = signal_name
        codes = {key: proc.poll() for key, proc in cluster.tasks()}
        if interrupted is None and all(codes[key] == 0 for key in _trainers(cluster)):
            codes.update(cluster.wait("ps", timeout=ps_exit_secs))
    wall = time.monotonic() - start
    if interrupted:
        print(f"\n{interrupted}: stopped every task ({len(codes)}) after {wall:.1f} s")
        return exit_codes.INTERRUPTED
    print(f"\nsummary: {summary(cluster)}; wall time {wall:.1f} s")
    for (job, index), code in sorted(codes.items()):
        state = "still running (stopped)" if code is None else f"exit {code}"
        print(f"  {job} {index}: {state}  log {cluster.log_path(job, index)}")
    failed = [key for key, code in codes.items() if code != 0]
    if failed:
        print(f"FAILED: {', '.join(f'{j} {i}' for j, i in sorted(failed))}; see the logs above.")
        return exit_codes.FAILED
    return exit_codes.OK


def summary(cluster) -> str:
    """What the run reached: the chief's final step, its held-out figures of the final checkpoint and its last
    batch's (trainer.py's chief), and the newest evaluation any task logged (an Estimator program's evaluator,
    or its master, which evaluates in its own process)."""
    chief_job, chief_index = _trainers(cluster)[0]
    chief = log_lines.finished_values(cluster.log(chief_job, chief_index))
    parts = [f"final step {chief.get('global_step', '?')}"]
    if "heldout_accuracy" in chief:
        parts[0] += (f", held-out loss {chief['heldout_loss']}, held-out accuracy {chief['heldout_accuracy']} "
                     "(final checkpoint)")
    evaluations = [(metrics["global_step"], job == "evaluator", job, index, metrics)
                   for (job, index), _ in cluster.tasks() if job != "ps"
                   if "global_step" in (metrics := log_lines.last_evaluation(cluster.log(job, index)))]
    if evaluations:
        step, _, job, index, metrics = max(evaluations, key=lambda found: found[:2])
        figures = ", ".join(f"{key} {value:.4g}" for key, value in metrics.items() if key != "global_step")
        parts.append(f"evaluation of global step {step:.0f} ({job} {index}): {figures}")
    if "loss" in chief:
        parts.append(f"last batch loss {chief['loss']}, accuracy {chief.get('accuracy', '?')}")
    return "; ".join(parts)


def _trainers(cluster):
    return [key for key, _ in cluster.tasks() if key[0] != "ps"]


def _run(cluster, deadline):
    print(f"ps {','.join(cluster.ps_hosts)}; workers {','.join(cluster.chief_hosts + cluster.worker_hosts)}; "
          f"logs in {cluster.run_dir}", flush=True)
    cluster.start_all()
    for (job, index), proc in cluster.tasks():
        print(f"started {job} {index} (pid {proc.pid})", flush=True)
    seen = {}
    while time.monotonic() < deadline:
        _stream_progress(cluster, seen)
        codes = {key: proc.poll() for key, proc in cluster.tasks()}
        if any(code not in (None, 0) for code in codes.values()):
            break  # a task failed: stop the rest rather than wait for a cluster that cannot finish
        if all(codes[key] is not None for key in _trainers(cluster)):
            break
        time.sleep(1)
    _stream_progress(cluster, seen)


def _stream_progress(cluster, seen: dict) -> None:
    for key in _trainers(cluster):
        lines = log_lines.task_lines(cluster.log(*key))
        for line in lines[seen.get(key, 0):]:
            print(str(line), flush=True)
        seen[key] = len(lines)
