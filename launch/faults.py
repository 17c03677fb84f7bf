"""Fault injection on a LocalCluster: kill one task with SIGKILL at a chosen global step and restart
it, or pause it (SIGSTOP, then SIGCONT) and let it resume, or kill the chief again and again while it
writes checkpoints; then report what a user would ask: did training finish, at what step, did the
checkpoint restore, and how much time was lost.

Progress is read from the tasks' own log lines ('<task> step N/T loss L', 'first step done at global
step N, loss L'), so run the trainers with a small --log_every_n_steps.
"""

import dataclasses
import datetime
import os
import random
import re
import signal
import time

from ps_trainer.launch.forked import call_with_tensorflow
from ps_trainer.training import log_lines


class FaultError(Exception):
    pass


def progress(cluster) -> list[log_lines.Step]:
    """Every first-step and progress line of every training task, in time order."""
    steps = [step for (job, index), _ in cluster.tasks() if job not in ("ps", "evaluator")
             for step in log_lines.steps(cluster.log(job, index))]
    return sorted(steps, key=lambda s: s.time)


def registered_step(model_dir) -> int | None:
    """launch/checkpoint_reads.py's registered_step."""
    return call_with_tensorflow("ps_trainer.launch.checkpoint_reads", "registered_step", str(model_dir))


def restorable_step(model_dir) -> int | None:
    """launch/checkpoint_reads.py's restorable_step."""
    return call_with_tensorflow("ps_trainer.launch.checkpoint_reads", "restorable_step", str(model_dir))


def chief_key(cluster) -> tuple[str, int]:
    return ("chief", 0) if cluster.chief_hosts else ("worker", 0)


def wait_until(cluster, condition, deadline, what):
    while not condition():
        failed = {key: proc.returncode for key, proc in cluster.tasks() if proc.poll() not in (None, 0)}
        if failed:
            raise FaultError(f"while waiting for {what}: task(s) failed: {failed}")
        if time.monotonic() > deadline:
            raise FaultError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _finish(cluster, deadline) -> dict:
    """Every task's exit code (None if still running at the deadline)."""
    return cluster.wait(timeout=max(30.0, deadline - time.monotonic()))


@dataclasses.dataclass
class KillReport:
    target: str
    fault: str  # "killed (SIGKILL)" or "paused for N s (SIGSTOP, then SIGCONT)"
    killed_at_step: int
    checkpoint_at_kill: int | None
    # Read again just before the restart: a save whose files were written before the kill can still be
    # registered by the chief just after it (a ps writes its shards; the chief registers them), so this is
    # the checkpoint a restarted chief, or one recovering from a ps restart, restores.
    checkpoint_at_restart: int | None
    lowest_step_after: int | None
    loss_before: float | None
    loss_after: float | None  # the mean of the progress lines' losses after the recovery, if any came
    heldout_loss: float | None  # the chief's held-out evaluation of the final checkpoint
    time_lost_secs: float | None
    final_step: int | None
    restored_step: int | None
    wall_secs: float
    exit_codes: dict

    def as_dict(self) -> dict:
        return _plain(self, finished=self.finished)

    @property
    def finished(self) -> bool:
        return _ended_well(self)

    def lines(self) -> list[str]:
        codes = ", ".join(f"{job} {index}: {code}" for (job, index), code in sorted(self.exit_codes.items()))
        return [
            f"{self.target}: {self.fault} at global step {self.killed_at_step}; latest checkpoint then: "
            f"{self.checkpoint_at_kill}" + (f" (registered by the restart: {self.checkpoint_at_restart})"
                                            if self.checkpoint_at_restart != self.checkpoint_at_kill else ""),
            f"lowest global step after the kill: {self.lowest_step_after}",
            f"loss before the kill {_fmt(self.loss_before)}, after recovery {_fmt(self.loss_after)}; "
            f"held-out loss at the end {_fmt(self.heldout_loss)}",
            f"time lost: {_fmt(self.time_lost_secs, 1)} s (from the kill until the global step passed "
            f"{self.killed_at_step} for good)",
            f"training finished: {'yes' if self.finished else 'NO'}; final step {self.final_step}; "
            f"final checkpoint restores at step {self.restored_step}",
            f"exit codes: {codes}; wall time {self.wall_secs:.1f} s",
        ]


def _ended_well(report) -> bool:
    """Every task exited 0 and the final checkpoint reads back whole."""
    return all(code == 0 for code in report.exit_codes.values()) and report.restored_step is not None


def _plain(report, **extra) -> dict:
    """The report as JSON-ready values; exit codes keyed 'job index'."""
    values = dataclasses.asdict(report)
    values["exit_codes"] = {f"{job} {index}": code for (job, index), code in report.exit_codes.items()}
    return {**values, **extra}


def _fmt(value, digits=4):
    return "n/a" if value is None else f"{value:.{digits}f}"


def kill_and_restart(cluster, model_dir, job: str, index: int, at_step: int, restart_delay_secs: float = 1.0,
                     timeout_secs: float = 600, pause_secs: float = 0) -> KillReport:
    """Runs the cluster, SIGKILLs one task once a worker logs global step >= at_step, restarts it,
    and waits for every task to exit. pause_secs: instead of the kill, stops the task (SIGSTOP) for
    that long and lets it go on (SIGCONT), with no restart."""
    start = time.monotonic()
    deadline = start + timeout_secs
    cluster.start_all()
    wait_until(cluster, lambda: max((s.step for s in progress(cluster)), default=0) >= at_step, deadline,
                f"global step {at_step}")
    checkpoint_at_kill = registered_step(model_dir)
    cluster.kill(job, index, signal.SIGSTOP if pause_secs else signal.SIGKILL)
    killed_at = datetime.datetime.now()
    before = progress(cluster)
    killed_at_step = max(s.step for s in before)
    time.sleep(pause_secs or restart_delay_secs)
    checkpoint_at_restart = registered_step(model_dir)
    if pause_secs:
        cluster.kill(job, index, signal.SIGCONT)
    else:
        cluster.start(job, index)
    codes = _finish(cluster, deadline)

    # A first-step line gives the global step that the task's first run read as it began: on a loaded machine
    # another task's first run can begin before the kill and log after it (seen: "first step done at global step
    # 36" logged after a kill at 100). It says nothing of where training went on from.
    after = [s for s in progress(cluster) if s.time > killed_at and not (s.first and s.task != f"{job}:{index}")]
    # Recovered once the global step passes the step at the kill and never falls back behind it.
    behind = [s.time for s in after if s.step <= killed_at_step]
    recovered = [s for s in after if s.step > killed_at_step and (not behind or s.time > behind[-1])]
    chief = log_lines.finished_values(cluster.log(*chief_key(cluster)))
    return KillReport(
        target=f"{job} {index}",
        fault=f"paused for {pause_secs:g} s (SIGSTOP, then SIGCONT)" if pause_secs else "killed (SIGKILL)",
        killed_at_step=killed_at_step,
        checkpoint_at_kill=checkpoint_at_kill,
        checkpoint_at_restart=checkpoint_at_restart,
        lowest_step_after=min((s.step for s in after), default=None),
        loss_before=_mean(s.loss for s in before[-3:]),
        # Every progress line after the recovery (one batch each): on a loaded machine the job can end
        # with only one or none; the held-out loss is what judges the model.
        loss_after=_mean(s.loss for s in recovered),
        heldout_loss=float(chief["heldout_loss"]) if "heldout_loss" in chief else None,
        time_lost_secs=(recovered[0].time - killed_at).total_seconds() if recovered else None,
        final_step=int(chief["global_step"]) if chief else None,
        restored_step=restorable_step(model_dir),
        wall_secs=time.monotonic() - start,
        exit_codes=codes,
    )


def _mean(values):
    values = list(values)
    return sum(values) / len(values) if values else None


@dataclasses.dataclass
class SaveRound:
    hit_save: bool  # a save was in progress when the chief was killed
    leftovers: int  # files of that unfinished save
    registered: int | None  # latest checkpoint in the state file after the kill
    restored: int | None  # the step at which that checkpoint read back whole (every tensor), or None


@dataclasses.dataclass
class SaveReport:
    rounds: list[SaveRound]
    final_step: int | None
    restored_step: int | None
    checkpoints_kept: int
    keep_checkpoint_max: int
    leftovers_at_end: int
    wall_secs: float
    exit_codes: dict

    def as_dict(self) -> dict:
        return _plain(self, clean=self.clean)

    @property
    def clean(self) -> bool:
        return (all(r.restored is not None and r.restored == r.registered for r in self.rounds)
                and _ended_well(self) and self.checkpoints_kept <= self.keep_checkpoint_max
                and self.leftovers_at_end == 0)

    def lines(self) -> list[str]:
        out = [f"round {i + 1}: killed the chief {'during a save' if r.hit_save else 'between saves'} "
               f"({r.leftovers} file(s) of it left); latest registered checkpoint {r.registered}; "
               f"it reads back whole at step {r.restored}" for i, r in enumerate(self.rounds)]
        hits = sum(r.hit_save for r in self.rounds)
        codes = ", ".join(f"{job} {index}: {code}" for (job, index), code in sorted(self.exit_codes.items()))
        out += [
            f"{len(self.rounds)} rounds, {hits} killed during a save; the latest registered checkpoint read back "
            f"whole after every kill: {'yes' if all(r.restored == r.registered for r in self.rounds) else 'NO'}",
            f"training finished at step {self.final_step}; final checkpoint restores at step {self.restored_step}; "
            f"{self.checkpoints_kept} checkpoint(s) kept (--keep_checkpoint_max={self.keep_checkpoint_max}); "
            f"{self.leftovers_at_end} leftover file(s)",
            f"exit codes: {codes}; wall time {self.wall_secs:.1f} s; all clean: {'yes' if self.clean else 'NO'}",
        ]
        return out


def save_leftovers(model_dir) -> int:
    """launch/checkpoint_reads.py's save_leftovers."""
    return call_with_tensorflow("ps_trainer.launch.checkpoint_reads", "save_leftovers", str(model_dir))


def kill_during_saves(cluster, model_dir, rounds: int, steps_after: int, keep_checkpoint_max: int,
                      timeout_secs: float = 900, max_wait_for_save_secs: float = 20, seed: int = 0) -> SaveReport:
    """Kills the chief with SIGKILL `rounds` times, each as soon as a checkpoint save is seen in
    progress, restarting it each time; the last restart trains steps_after more steps to the end.

    Run the chief with a checkpoint every step or two, so that a save is never far away.
    """
    start = time.monotonic()
    deadline = start + timeout_secs
    chief = chief_key(cluster)
    rng = random.Random(seed)
    cluster.start_all()
    results = []
    for number in range(rounds):
        wait_until(cluster, lambda n=number: (len(log_lines.first_steps(cluster.log(*chief))) > n
                                               and registered_step(model_dir) is not None),
                    deadline, f"the chief's first step (round {number + 1})")
        time.sleep(rng.uniform(0, 1))  # then the next save to start, wherever the run has got to
        save_deadline = time.monotonic() + max_wait_for_save_secs
        while save_leftovers(model_dir) == 0 and time.monotonic() < save_deadline:
            time.sleep(0.001)
        cluster.kill(*chief, signal.SIGKILL)
        leftovers = save_leftovers(model_dir)
        registered = registered_step(model_dir)
        # What a restart would restore if the ps lost its state (with the ps alive, the chief keeps
        # the live state): every tensor of the latest registered checkpoint must read.
        restored = restorable_step(model_dir)
        extra = [f"--train_steps={(registered or 0) + steps_after}"] if number == rounds - 1 else []
        cluster.start(*chief, extra)
        wait_until(cluster, lambda n=number: len(log_lines.first_steps(cluster.log(*chief))) > n + 1, deadline,
                    f"the restarted chief's first step (round {number + 1})")
        results.append(SaveRound(hit_save=leftovers > 0, leftovers=leftovers, registered=registered,
                                 restored=restored))
    codes = _finish(cluster, deadline)
    final = log_lines.finished_values(cluster.log(*chief))
    return SaveReport(
        rounds=results,
        final_step=int(final["global_step"]) if final else None,
        restored_step=restorable_step(model_dir),
        checkpoints_kept=len([n for n in os.listdir(model_dir) if re.fullmatch(r"model\.ckpt-\d+\.index", n)]),
        keep_checkpoint_max=keep_checkpoint_max,
        leftovers_at_end=save_leftovers(model_dir),
        wall_secs=time.monotonic() - start,
        exit_codes=codes,
    )
