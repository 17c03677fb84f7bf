"""The run's two paths, decided here and nowhere else: how a worker reads its input (the work queue on
ps 0, or a fixed shard of the files) and what one session.run does (the step path).

Each rule that keeps the input queue from a run is a row of QUEUE_RULES: when it holds, the message
that refuses --input_queue, and the reason the default reads fixed shards instead. flags/config.py
builds the settings from the flags, calls these functions and turns a Conflict into a usage error;
the worker asks `settled_input` on resume; training/step/ builds the step `step_path` names, which
TrainConfig.step_path holds as a value.
Nothing here reads FLAGS or the disk.
"""

import dataclasses
from typing import Callable, NamedTuple

from ps_trainer.input import NO_CACHE

# Flags that only the input queue serves, and levers that train several batches a session.run (the
# queue counts each step's examples by file; a round of rows, InputSettings.rounds, reads its batches at once).
QUEUE_FLAGS = ("num_epochs", "input_queue_audit")
SEVERAL_BATCHES = ("steps_per_run", "local_steps", "accumulate_batches")


class Conflict(ValueError):
    """Settings that cannot go together: the message names the flags and the fix."""


@dataclasses.dataclass(frozen=True)
class InputSettings:
    """What decides the input path. The cluster's and the dataset's fields are None until they are known
    (the flags alone are checked before the cluster is resolved); a rule that reads one is skipped then."""
    input_queue: bool | None = None  # --input_queue as given; None: not given
    needs_queue: str | None = None  # the first of QUEUE_FLAGS given
    several_batches: tuple[str, int] | None = None  # the first of SEVERAL_BATCHES above 1: (flag, value)
    # --local_steps trains rounds of rows: a round reads its batches at once and the queue counts them,
    # taken when asked (--input_queue, or a flag of QUEUE_FLAGS); by default fixed shards, through which
    # rounds train faster (docs/speed.md).
    rounds: bool = False
    cache: str | None = None
    # --sync_replicas with fewer replicas aggregated than the cluster has: (aggregated, replicas)
    backup_workers: tuple[int, int] | None = None
    dataset: str | None = None
    has_files: bool | None = None  # whether the dataset has files to hand out
    distributed: bool | None = None
    joins: bool = False  # a worker joining a running job (--join_address)


class QueueRule(NamedTuple):
    holds: Callable[[InputSettings], bool | None]  # None: not known yet
    refusal: Callable[[InputSettings], str]  # with --input_queue given
    reason: Callable[[InputSettings], str]  # why the default reads fixed shards
    named: str = ""  # how --input_queue's help names it ("": the help's "for files in a cluster" says it)


def _unknown_or(value, test):
    return None if value is None else test(value)


# In the order they are checked: the first that holds refuses or explains.
QUEUE_RULES = (
    QueueRule(lambda s: s.several_batches is not None and not (s.rounds and (s.input_queue or s.needs_queue)),
              lambda s: "--input_queue counts each step's examples by file: drop --{}={}.".format(*s.several_batches),
              lambda s: ("--{}={} trains rounds of rows, which take the queue when asked (--input_queue, "
                         "--num_epochs): "
                         "fixed shards train them faster (docs/speed.md)" if s.rounds else
                         "--{}={} trains several batches a step, and the queue counts each step's examples").format(
                  *s.several_batches),
              "a lever (" + ", ".join(f"--{flag}" for flag in SEVERAL_BATCHES) + ")"),
    QueueRule(lambda s: s.cache not in (None, NO_CACHE),
              lambda s: f"--input_queue reads every epoch from the files: drop --cache={s.cache}.",
              lambda s: f"--cache={s.cache} keeps a fixed shard", "--cache"),
    # Backup workers: a round applied without a worker's gradient drops it, and the examples it carried,
    # which the queue has counted as trained.
    QueueRule(lambda s: s.backup_workers is not None,
              lambda s: ("--input_queue trains every example once: --replicas_to_aggregate={} of {} workers would "
                         "drop the late workers' gradients, and their examples with them; drop "
                         "--replicas_to_aggregate.").format(*s.backup_workers),
              lambda s: (f"--replicas_to_aggregate={s.backup_workers[0]} drops the backup workers' gradients with "
                         "their examples"),
              "backup workers (--replicas_to_aggregate)"),
    QueueRule(lambda s: _unknown_or(s.has_files, lambda has: not has),
              lambda s: f"--input_queue hands out files: --dataset={s.dataset} has none to hand out (use csv, "
                        "tfrecord or criteo files).",
              lambda s: f"--dataset={s.dataset} has no files to hand out (use csv, tfrecord or criteo files)"),
    QueueRule(lambda s: _unknown_or(s.distributed, lambda distributed: not distributed),
              lambda s: "--input_queue needs a cluster (its queue lives on ps 0): one process reads every file "
                        "itself; drop the flag.",
              lambda s: "one process reads every file itself (the queue lives on ps 0 of a cluster)"),
)

_NAMED = [rule.named for rule in QUEUE_RULES if rule.named]
QUEUE_HELP = (f"Default: on for files in a cluster, unless {', '.join(_NAMED[:-1])} or {_NAMED[-1]} need the fixed "
              "shards, or the run resumes a checkpoint saved with them; --noinput_queue: fixed shards.")


@dataclasses.dataclass(frozen=True)
class InputPath:
    queue: bool  # the work queue on ps 0; else a fixed shard of the files
    by_default: bool = False  # chosen without --input_queue: a checkpoint saved without the queue wins
    reason: str | None = None  # why the default reads fixed shards


def _blocking(settings: InputSettings) -> QueueRule | None:
    return next((rule for rule in QUEUE_RULES if rule.holds(settings)), None)


def check_input(settings: InputSettings) -> None:
    """Conflict if the settings known so far cannot go with --input_queue (or --noinput_queue) as given."""
    if settings.needs_queue and settings.input_queue is False:
        raise Conflict(f"--{settings.needs_queue} needs the input queue (epochs are counted by it; fixed shards "
                       "repeat until --train_steps): drop --noinput_queue.")
    blocking = _blocking(settings) if settings.input_queue else None
    if blocking:
        raise Conflict(blocking.refusal(settings))


def input_path(settings: InputSettings) -> InputPath:
    """The input path of a training task (its cluster and dataset known), or Conflict."""
    check_input(settings)
    blocking = _blocking(settings)
    if settings.input_queue is None:
        reason = blocking.reason(settings) if blocking else None
        if reason and settings.needs_queue:
            raise Conflict(f"--{settings.needs_queue} needs the input queue, and this run cannot use it: {reason}.")
        path = InputPath(queue=not blocking, by_default=not blocking, reason=reason)
    else:
        path = InputPath(queue=settings.input_queue)
    if settings.joins and not path.queue:
        why = "; drop --noinput_queue" if settings.input_queue is False else (
            f", and this run cannot use it: {path.reason}" if path.reason else "")
        raise Conflict("--join_address: a joining worker takes its files from the input queue (fixed shards are cut "
                       f"for the workers the job started with){why}.")
    return path


def settled_input(path: InputPath, saved_without_queue: bool) -> InputPath:
    """On resume: the queue chosen by default gives way to the fixed shards of a checkpoint saved with
    them (the queue needs a new --model_dir). A queue asked for by --input_queue stays."""
    if path.queue and path.by_default and saved_without_queue:
        return InputPath(queue=False, reason="the checkpoint to resume was saved by a run that read fixed shards")
    return path


# The step paths: what one session.run of a worker does (training/step/__init__.py builds each).
SINGLE = "single"  # one step, asynchronous or synchronous
STEPS_PER_RUN = "steps_per_run"  # up to --steps_per_run whole steps
LOCAL_STEPS = "local_steps"  # --local_steps steps on worker-side copies, one push (tables stay on the ps)
ROUNDS = "rounds"  # --local_steps with the tables' rows copied too: a run reads --local_steps batches
ACCUMULATE = "accumulate_batches"  # synchronous: one gradient per --accumulate_batches micro-batches


def own_update_refusal(path: str, sync: bool, embedding: str) -> str | None:
    """Why a model_fn's own train_op cannot be the update on this path, or None: a lever that makes the update
    itself (its own steps, pushes or aggregation of the runtime optimizer's gradients, or dynamic tables that
    evict rows of that optimizer's slots) cannot take an op already built."""
    if path != SINGLE:
        flag = LOCAL_STEPS if path == ROUNDS else path
        return f"--{flag} makes the update itself"
    if sync:
        return "--sync_replicas aggregates the runtime optimizer's gradients"
    if embedding == "dynamic":
        return "--embedding=dynamic tables evict and reconcile rows of the runtime optimizer's slots"
    return None


@dataclasses.dataclass(frozen=True)
class StepSettings:
    local_steps: int = 1
    steps_per_run: int = 1
    steps_per_run_given: bool = False
    accumulate_batches: int = 1
    sync: bool = False
    has_tables: bool = False  # the model declares embedding tables on the ps
    # its tables take rounds: read through grouped lookups, with an optimizer whose slots only add
    tables_take_rounds: bool = False
    model: str = ""
    distributed: bool | None = None  # None: not known yet


def tables_take_rounds(needs, embedding: str, optimizer: str) -> bool:
    """Whether --local_steps trains a model's tables by rounds of rows on the worker
    (training/step/row_copies.py): tables the model reads through grouped lookups (model/needs.py:
    wide_deep's hashed and dynamic ones), with an optimizer whose slots only add; other tables stay on the
    ps, read and updated a step at a time. `needs`: the model's Needs."""
    from ps_trainer.training.step import row_copies  # noqa: PLC0415  it imports this module
    return (needs.partitioned_tables and optimizer in row_copies.ADDITIVE_SLOTS
            and embedding in needs.grouped_lookup_embeddings)


@dataclasses.dataclass(frozen=True)
class StepPath:
    """What one session.run of a worker does: the value TrainConfig.step_path holds, and every part reads."""
    name: str  # one of the paths above
    steps_per_run: int = 1  # training steps one session.run may take
    batches_per_read: int = 1  # batches one session.run reads at once (rounds of rows)

    def read_size(self, batch_size: int) -> int:
        """The examples one session.run reads: a round of rows reads its batches at once."""
        return batch_size * self.batches_per_read

    @property
    def reads_several_batches(self) -> bool:
        return self.batches_per_read > 1


def reads_rounds(settings: StepSettings) -> bool:
    """Whether a session.run trains a round of rows (ROUNDS), as far as the settings know: one process
    reads its tables as they are, so rounds are for a cluster (assumed while it is not known yet)."""
    return settings.distributed is not False and settings.local_steps > 1 and settings.tables_take_rounds


def step_path(settings: StepSettings) -> StepPath:
    """The step path of these settings (the cluster known), or Conflict."""
    s = settings
    rounds = bool(s.distributed) and reads_rounds(s)
    if s.local_steps > 1:
        if s.has_tables and not s.tables_take_rounds:
            if s.steps_per_run > 1:
                raise Conflict(f"--steps_per_run={s.steps_per_run} with --local_steps={s.local_steps} and "
                               f"--model={s.model}: its tables' rows are read a step at a time; drop --steps_per_run.")
        elif s.steps_per_run_given and s.steps_per_run != s.local_steps:
            raise Conflict(f"--steps_per_run={s.steps_per_run} with --local_steps={s.local_steps}: a session.run is "
                           "one round of --local_steps steps; drop --steps_per_run.")
        elif s.has_tables and not rounds and s.steps_per_run > 1 and s.distributed is not None:
            raise Conflict(f"--steps_per_run={s.steps_per_run} with --local_steps={s.local_steps} and "
                           f"--model={s.model} in one process: its tables' rows are read a step at a time; drop "
                           "--steps_per_run.")
        if rounds:
            return StepPath(ROUNDS, s.local_steps, s.local_steps)
        return StepPath(LOCAL_STEPS, 1 if s.has_tables else s.local_steps)
    if s.accumulate_batches > 1:
        return StepPath(ACCUMULATE)
    if s.steps_per_run > 1:
        return StepPath(STEPS_PER_RUN, s.steps_per_run)
    return StepPath(SINGLE)
