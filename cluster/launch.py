"""Runs a ProcessCluster to the end for a person at a terminal: the local and SSH launchers.

Starts every task, streams each worker's progress lines, waits for the workers, gives the ps tasks
time to exit on their own, prints a summary, and returns an exit code. On SIGINT or SIGTERM, or as
soon as any task fails, it stops every task it started.
"""

import datetime
import pathlib
import re
import signal
import time

from absl import flags

PROGRESS = re.compile(r"\] ((?:worker|chief|master|ps|local):\d+ .*)$")
LOG_TIME = re.compile(r"^[IWEF](\d{4}) (\d\d:\d\d:\d\d\.\d+)")
KEY_VALUE = re.compile(r"(\w+)=(\S+)")
EXIT_INTERRUPTED = 130


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


def run_dir(prefix: str = "") -> pathlib.Path:
    """--run_dir, or runs/<prefix><timestamp>."""
    default = f"runs/{prefix}{datetime.datetime.now():%Y%m%d-%H%M%S}"
    return pathlib.Path(flags.FLAGS.run_dir or default).resolve()


def progress_lines(text: str) -> list[str]:
    return [m.group(1) for m in map(PROGRESS.search, text.splitlines()) if m]


def log_time(line: str, now: datetime.datetime | None = None) -> datetime.datetime:
    """Wall-clock time of an absl log line (the same clock in every local process). The line has no
    year: it is the latest that does not put the line in the future, so that a run across New Year
    reads December's lines as last year's."""
    month_day, clock = LOG_TIME.match(line).groups()
    now = now or datetime.datetime.now()
    for year in (now.year, now.year - 1):
        try:
            when = datetime.datetime.strptime(f"{year}{month_day} {clock}", "%Y%m%d %H:%M:%S.%f")
        except ValueError:  # February 29th of another year
            continue
        if when <= now + datetime.timedelta(days=1):
            return when
    raise ValueError(f"no year puts this log line in the past: {line[:30]}")


def examples_per_sec(log: str, examples_per_global_step: int, warmup_steps: int) -> float | None:
    """Examples/sec between the first progress line at or past warmup_steps and the last one."""
    points = []
    for line in log.splitlines():
        progress = PROGRESS.search(line)
        if progress and " step " in progress.group(1) and "/" in progress.group(1):
            step = int(progress.group(1).split(" step ")[1].split("/")[0])
            points.append((log_time(line), step))
    after = [(t, s) for t, s in points if s >= warmup_steps]
    if len(after) < 2:
        return None
    (t0, s0), (t1, s1) = after[0], after[-1]
    seconds = (t1 - t0).total_seconds()
    return (s1 - s0) * examples_per_global_step / seconds if seconds > 0 else None


def finished_values(log: str) -> dict[str, str]:
    """The key=value pairs of a worker's 'finished:' line, or {} if it never finished."""
    lines = [line for line in progress_lines(log) if " finished: " in line]
    return dict(KEY_VALUE.findall(lines[-1])) if lines else {}


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
        return EXIT_INTERRUPTED
    chief_job, chief_index = _trainers(cluster)[0]
    chief = finished_values(cluster.log(chief_job, chief_index))
    held_out = (f"held-out loss {chief['heldout_loss']}, held-out accuracy {chief['heldout_accuracy']} "
                "(final checkpoint); " if "heldout_accuracy" in chief else "")
    print(f"\nsummary: final step {chief.get('global_step', '?')}, {held_out}last batch loss {chief.get('loss', '?')}, "
          f"accuracy {chief.get('accuracy', '?')}; wall time {wall:.1f} s")
    for (job, index), code in sorted(codes.items()):
        state = "still running (stopped)" if code is None else f"exit {code}"
        print(f"  {job} {index}: {state}  log {cluster.log_path(job, index)}")
    failed = [key for key, code in codes.items() if code != 0]
    if failed:
        print(f"FAILED: {', '.join(f'{j} {i}' for j, i in sorted(failed))}; see the logs above.")
        return 1
    return 0


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
        lines = progress_lines(cluster.log(*key))
        for line in lines[seen.get(key, 0):]:
            print(line, flush=True)
        seen[key] = len(lines)
