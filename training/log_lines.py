"""The log lines other programs read: each is written and parsed here, nowhere else.

A worker writes three kinds of line that the launchers, the fault drills, the benchmark and the tests
read back from its log file (absl's prefix, then the message):

    worker:1 first step done at global step 57, loss 2.3026
    worker:1 step 400/2000 loss 0.5321 accuracy 0.844 9120 examples/sec 0:00:21 left
    worker:1 finished: global_step=2000 local_steps=1004 loss=0.3712 accuracy=0.891 seconds=48.0

An Estimator program's training replicas write the first-step and 'finished:' lines too (the runtime's,
ps_trainer.estimator), between TF1's own progress lines (`loss = 0.52, step = 400`).

The 'finished:' line is key=value pairs, so a reader takes whichever fields it knows (local_steps: the
steps this worker ran itself, whatever the --local_steps lever). With
--input_queue a worker also writes the epochs it saw end and, at its end, what it trained of each:

    worker:1: input queue: epoch 0 done at global step 150: 4800 examples, every file trained
    worker:1: input queue: trained 4 file(s), 2400 examples of epoch 0

An Estimator's evaluation writes TF1's line, which a program's own log readers look for:

    Saving dict for global step 600: accuracy = 0.78299, auc = 0.88101, global_step = 600, loss = 0.42937
"""

import dataclasses
import datetime
import re

from absl import logging

_PREFIX = r"^[IWEF](\d{4}) (\d\d:\d\d:\d\d\.\d+) +\d+ [^\]]*\] "
_TASK = r"((?:worker|chief|master|ps|local|evaluator):\d+)"
_FIRST_STEP = re.compile(_PREFIX + _TASK + r" first step done at global step (?P<step>\d+), loss (?P<loss>\S+)$")
_PROGRESS = re.compile(_PREFIX + _TASK
                       + r" step (?P<step>\d+)/(?:\d+|-) loss (?P<loss>\S+) accuracy \S+ \d+ examples/sec ")
_FINISHED = re.compile(_PREFIX + _TASK + r" finished: (.*)$")
_EPOCH_DONE = re.compile(_PREFIX + _TASK
                         + r": input queue: epoch (\d+) done at global step (\d+): (\d+) examples")
_EPOCH_TALLY = re.compile(_PREFIX + _TASK + r": input queue: trained (\d+) file\(s\), (\d+) examples of epoch (\d+)"
                          r"(?:, (\d+) of them by an earlier reader)?(?:.*, (\d+) of them trained here before)?")
# TF1's own progress line (LoggingTensorHook's), which an Estimator program logs: it names no task.
_ESTIMATOR_PROGRESS = re.compile(_PREFIX + r"loss = (?P<loss>[^,]+), step = (?P<step>\d+)")
_SESSION_AGAIN = re.compile(_PREFIX + _TASK + r" training session made again at global step (\d+)")
_ANY_TASK_LINE = re.compile(_PREFIX + _TASK + r" (.*)$")
_KEY_VALUE = re.compile(r"(\w+)=(\S+)")
# Anywhere in a line: TensorFlow's logger (INFO:tensorflow:...) and absl's (with its prefix) both carry it.
_EVALUATION = re.compile(r"Saving dict for global step (\d+): (.*)$")


# ---------------------------------------------------------------- writers (the trainer)
# The lines of a graph-mode TensorFlow error that are not its cause: the heading, where the op was
# defined (and its stack), the op's name, the rules around a remote task's error.
_ERROR_FRAME = re.compile(r"^(Graph execution error|Detected at node|Node: |\s|\[\[|=+$)")
# A remote task's error starts with the task it came from, its cause on the next line.
_FROM_TASK = re.compile(r"^(?:[A-Z_]+: )?From /job:\S*:$")
# tf.data's wrapping of an error inside a dataset function: which transformation, and the iterator's
# path, say nothing to a user and can push the cause (a file's name) past the line's limit.
_DATASET_FRAME = re.compile(r"Error in user-defined function passed to \S+ transformation with iterator: \S+: ")


def error_cause(message: str, limit: int = 300) -> str:
    """The first line of a TensorFlow error's message that says what went wrong (not its heading, nor
    where the op was defined; after the task it came from, if a remote one), for a one-line report."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    causes = [_DATASET_FRAME.sub("", line.strip()) for line in message.splitlines()
              if line.strip() and not _ERROR_FRAME.match(line)]
    if len(causes) > 1 and _FROM_TASK.match(causes[0]):
        causes = [f"{causes[0]} {causes[1]}"]
    return (causes[0] if causes else lines[0] if lines else "")[:limit].strip()


def log_first_step(task: str, global_step: int, loss: float, log=logging.info) -> None:
    """`log`: absl's by default; an Estimator program's lines go through TensorFlow's logger, the program's
    (an absl line in a program that is not an absl app would configure the root logger, and every
    TensorFlow line after it would print twice)."""
    log("%s first step done at global step %d, loss %.4f", task, global_step, loss)


def log_session_again(task: str, global_step: int, log=logging.warning) -> None:
    """`log`: as log_first_step's."""
    log("%s training session made again at global step %d (MonitoredSession does so after an error it takes for "
        "a lost task: the error logged above)", task, global_step)


def log_progress(task: str, global_step: int, train_steps: int | None, loss: float, accuracy: float,
                 examples_per_sec: float, left_secs: float | None, staleness: dict | None = None) -> None:
    """train_steps and left_secs None: no step limit (--num_epochs ends the run), written '-'."""
    logging.info("%s step %d/%s loss %.4f accuracy %.3f %.0f examples/sec %s left%s",
                 task, global_step, "-" if train_steps is None else train_steps, loss, accuracy, examples_per_sec,
                 "-" if left_secs is None else datetime.timedelta(seconds=round(max(left_secs, 0))),
                 f" staleness mean {staleness['mean']:.1f} max {staleness['max']:.0f}" if staleness else "")


def log_epoch_done(task: str, epoch: int, global_step: int, examples: int) -> None:
    """--input_queue: the worker that finished an epoch's last file says so, once per epoch."""
    logging.info("%s: input queue: epoch %d done at global step %d: %d examples, every file trained", task, epoch,
                 global_step, examples)


def log_epoch_tally(task: str, epoch: int, files: int, examples: int, skipped: int, again: int) -> None:
    """--input_queue: what one worker finished of one epoch, at its end: files and their examples;
    `skipped`: of those, the examples an earlier reader of a file had trained (its trained prefix);
    `again`: examples it trained of files that were then handed to another worker."""
    logging.info("%s: input queue: trained %d file(s), %d examples of epoch %d%s%s", task, files, examples, epoch,
                 f", {skipped} of them by an earlier reader (skipped here)" if skipped else "",
                 f", {again} of them trained here before (a file read again)" if again else "")


def log_finished(task: str, fields: dict[str, object], log=logging.info) -> None:
    """fields' values are written as given (format them first); none may contain a space. `log`: as
    log_first_step's."""
    log("%s finished: %s", task, " ".join(f"{key}={value}" for key, value in fields.items()))


def log_evaluation(results: dict, log=logging.info) -> None:
    """An evaluation's metrics (global_step among them), sorted by name, in TF1's words. `log`: as
    log_first_step's."""
    log("Saving dict for global step %d: %s", results["global_step"],
        ", ".join(f"{key} = {value}" for key, value in sorted(results.items())))


# ---------------------------------------------------------------- readers (launchers, drills, tests)
@dataclasses.dataclass(frozen=True)
class Step:
    """A first-step or progress line: the global step a task had reached, and the loss then."""
    time: datetime.datetime
    task: str
    step: int
    loss: float
    first: bool


def epochs_done(text: str) -> list[tuple[int, int, int]]:
    """(epoch, global step, examples) of every epoch-done line of one log."""
    return [(int(m[4]), int(m[5]), int(m[6])) for m in map(_EPOCH_DONE.match, text.splitlines()) if m]


def epoch_tallies(text: str) -> dict[int, tuple[int, int, int, int]]:
    """{epoch: (files, examples, of them skipped as an earlier reader's, examples trained here before)} of
    the tally lines of one log (its last run's)."""
    return {int(m[6]): (int(m[4]), int(m[5]), int(m[7] or 0), int(m[8] or 0))
            for m in map(_EPOCH_TALLY.match, text.splitlines()) if m}


def sessions_again(text: str) -> list[int]:
    """The global step of each training session a task made again, within one start, in one log."""
    return [int(m[4]) for m in map(_SESSION_AGAIN.match, text.splitlines()) if m]


def steps(text: str, now: datetime.datetime | None = None) -> list[Step]:
    """Every first-step and progress line of one log, in order; TF1's `loss = ..., step = N` lines of an
    Estimator program are progress lines of no named task."""
    found = []
    for line in text.splitlines():
        if match := _FIRST_STEP.match(line):
            first = True
        elif match := _PROGRESS.match(line):
            first = False
        elif match := _ESTIMATOR_PROGRESS.match(line):
            month_day, clock = match.groups()[:2]
            found.append(Step(_time(month_day, clock, now), "", int(match["step"]), float(match["loss"]), False))
            continue
        else:
            continue
        month_day, clock, task = match.groups()[:3]
        found.append(Step(_time(month_day, clock, now), task, int(match["step"]), float(match["loss"]), first))
    return found


def first_steps(text: str) -> list[Step]:
    """The first-step line of every start of the task in this log (a restart appends its own)."""
    return [step for step in steps(text) if step.first]


@dataclasses.dataclass(frozen=True)
class TaskLine:
    """A line a task writes about itself ('worker:0 ...'): what a person at the launcher follows."""
    time: datetime.datetime
    task: str
    message: str

    def __str__(self):
        return f"{self.task} {self.message}"


def task_lines(text: str, now: datetime.datetime | None = None) -> list[TaskLine]:
    return [TaskLine(_time(m.group(1), m.group(2), now), m.group(3), m.group(4))
            for m in map(_ANY_TASK_LINE.match, text.splitlines()) if m]


def last_evaluation(text: str) -> dict[str, float]:
    """The metrics of the last evaluation line of one log (this project's Estimator's, or TensorFlow's own:
    the same words), global_step among them; those that are not numbers are left out. {} if it holds none."""
    found = [m for m in map(_EVALUATION.search, text.splitlines()) if m]
    if not found:
        return {}
    metrics = {}
    for pair in found[-1].group(2).split(", "):
        key, _, value = pair.partition(" = ")
        try:
            metrics[key] = float(value)
        except ValueError:
            continue
    return metrics


def finished_values(text: str) -> dict[str, str]:
    """The key=value pairs of the last 'finished:' line of a worker's log, or {} if it never finished."""
    lines = [m for m in map(_FINISHED.match, text.splitlines()) if m]
    return dict(_KEY_VALUE.findall(lines[-1].group(4))) if lines else {}


def log_time(line: str, now: datetime.datetime | None = None) -> datetime.datetime:
    """Wall-clock time of an absl log line (the same clock in every local process)."""
    match = re.match(_PREFIX, line)
    if not match:
        raise ValueError(f"not an absl log line: {line[:40]!r}")
    return _time(*match.groups(), now)


def _time(month_day: str, clock: str, now: datetime.datetime | None) -> datetime.datetime:
    """absl's prefix has no year: take the latest that does not put the line in the future, so a run
    across New Year reads December's lines as last year's."""
    now = now or datetime.datetime.now()
    for year in (now.year, now.year - 1):
        try:
            when = datetime.datetime.strptime(f"{year}{month_day} {clock}", "%Y%m%d %H:%M:%S.%f")
        except ValueError:  # February 29th of another year
            continue
        if when <= now + datetime.timedelta(days=1):
            return when
    raise ValueError(f"no year puts this log line in the past: {month_day} {clock}")


def examples_per_sec(text: str, examples_per_global_step: int, warmup_steps: int) -> float | None:
    """Examples/sec between the first progress line at or past warmup_steps and the last one."""
    after = [step for step in steps(text) if not step.first and step.step >= warmup_steps]
    if len(after) < 2:
        return None
    seconds = (after[-1].time - after[0].time).total_seconds()
    return (after[-1].step - after[0].step) * examples_per_global_step / seconds if seconds > 0 else None
