"""Chaos on a LocalCluster: random SIGKILLs of any task (ps tasks included) for a while, or at chosen
global steps, each task restarted after a short random delay, then training runs to its end. The
report says what an orchestrator would be told and whether it was true: every exit code, each
worker's final global step against --train_steps, whether the registered checkpoint step ever went
back, and whether any process was left running. A run to --num_epochs (--input_queue) is judged by
its epochs instead: every epoch done, each with the same number of examples, and every worker
finished at the step where the last one ended.
"""

import dataclasses
import datetime
import random
import signal
import time

from ps_trainer.launch import faults
from ps_trainer.launch.forked import call_with_tensorflow
from ps_trainer.training import log_lines

POLL_SECS = 0.1
PS_EXIT_SECS = 60  # after the workers: a ps that has not exited by then is left running (a violation)


@dataclasses.dataclass
class Kill:
    secs: float  # since the cluster started
    task: str
    global_step: int  # the highest logged when it was killed
    checkpoint: int | None  # registered then


@dataclasses.dataclass
class ChaosReport:
    train_steps: int
    kills: list[Kill]
    unexpected_exits: list[str]  # a task that ended by itself, non-zero, while the others trained
    finished_steps: dict  # each training task's 'finished:' global step (None if it never logged one)
    checkpoint_steps: list[int]  # every registered checkpoint step seen, in order
    time_lost_secs: float  # wall time during which the global step was behind its value at some kill
    exit_codes: dict
    left_running: list[str]
    restored_step: int | None
    wall_secs: float
    num_epochs: int = 0  # a run to --num_epochs: judged by its epochs, not train_steps
    epochs_done: list = dataclasses.field(default_factory=list)  # (epoch, examples) of each epoch-done line
    # --input_queue_audit: per epoch, [distinct examples trained, examples trained more than once,
    # examples trained in all], counted from every worker's record of each example it trained
    audit: dict = dataclasses.field(default_factory=dict)

    @property
    def last_step(self) -> int | None:
        """The global step the run had to reach: --train_steps, or where its epochs ended."""
        if not self.num_epochs:
            return self.train_steps
        return max((step for step in self.finished_steps.values() if step is not None), default=None)

    @property
    def checkpoints_went_back(self) -> bool:
        return any(later < earlier for earlier, later in zip(self.checkpoint_steps, self.checkpoint_steps[1:]))

    @property
    def violations(self) -> list[str]:
        problems = [f"{task} exited {code}" for task, code in self.exit_codes.items() if code != 0]
        problems += [f"{text} during the run" for text in self.unexpected_exits]
        last = self.last_step
        problems += [f"{task} finished at global step {step}, short of {last}"
                     for task, step in self.finished_steps.items() if step is None or last is None or step < last]
        if self.num_epochs:
            epochs = sorted(self.epochs_done)
            if [epoch for epoch, _ in epochs] != list(range(self.num_epochs)):
                problems.append(f"the epochs done were {[epoch for epoch, _ in epochs]}, not 0..{self.num_epochs - 1}")
            if len({examples for _, examples in epochs}) > 1:
                problems.append(f"the epochs trained different numbers of examples: {epochs}")
            problems += [f"epoch {epoch}: {self.audit[epoch][0]} distinct examples trained of its {examples}"
                         for epoch, examples in epochs if epoch in self.audit and self.audit[epoch][0] != examples]
        if self.checkpoints_went_back:
            problems.append(f"the checkpoint step went back: {self.checkpoint_steps}")
        problems += [f"{task} left running" for task in self.left_running]
        if self.restored_step is None or last is None or self.restored_step < last:
            problems.append(f"the final checkpoint restores at step {self.restored_step}")
        return problems

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "checkpoints_went_back": self.checkpoints_went_back,
                "violations": self.violations}

    def lines(self) -> list[str]:
        out = [f"kill at {k.secs:6.1f} s: {k.task:9} global step {k.global_step}, checkpoint {k.checkpoint}"
               for k in self.kills]
        codes = ", ".join(f"{task}: {code}" for task, code in sorted(self.exit_codes.items()))
        out += [
            f"{len(self.kills)} kills ({sum(k.task.startswith('ps') for k in self.kills)} of ps tasks); "
            f"time lost: {self.time_lost_secs:.1f} s",
            "finished at: " + ", ".join(f"{task} {step}" for task, step in sorted(self.finished_steps.items())),
            *(["epochs done: " + ", ".join(f"{epoch} ({examples} examples)" for epoch, examples in
                                           sorted(self.epochs_done))] if self.num_epochs else []),
            *(["examples trained (audit): " + ", ".join(
                f"epoch {epoch}: {distinct} at least once, {again} more than once ({total} in all)"
                for epoch, (distinct, again, total) in sorted(self.audit.items()))] if self.audit else []),
            f"checkpoint steps went back: {'YES' if self.checkpoints_went_back else 'no'} "
            f"({len(set(self.checkpoint_steps))} checkpoints seen); final checkpoint restores at step "
            f"{self.restored_step}",
            f"exit codes: {codes}; processes left running: {', '.join(self.left_running) or 'none'}; "
            f"wall time {self.wall_secs:.1f} s",
            "violations: " + ("; ".join(self.violations) or "none"),
        ]
        return out


def _name(key) -> str:
    return f"{key[0]} {key[1]}"


def _highest_step(cluster) -> int:
    """The highest global step any training task has logged."""
    return max((s.step for s in faults.progress(cluster)), default=0)


def kill_steps(train_steps: int, count: int, seed: int) -> list[int]:
    """`count` global steps, ascending, drawn (seeded) between 10% and 60% of train_steps: where the kills
    of a run by steps come, so that the job cannot end before its last kill however fast it trains."""
    rng = random.Random(seed)
    return sorted(rng.randint(train_steps // 10, train_steps * 6 // 10) for _ in range(count))


def run(cluster, model_dir, train_steps: int, chaos_secs: float, interval_secs=(6.0, 20.0),
        restart_delay_secs=(0.5, 3.0), seed: int = 0, timeout_secs: float = 1800, num_epochs: int = 0,
        at_steps: list[int] | None = None) -> ChaosReport:
    """Kills a random running task every interval_secs (uniform) for chaos_secs from the first step,
    restarting each after restart_delay_secs (uniform); then waits up to timeout_secs more for every
    task to end. num_epochs: the run ends at its --num_epochs (train_steps is then only its cap).
    at_steps (kill_steps): instead of the clock, one kill as the global step reaches each, once the
    task killed last has been restarted."""
    rng = random.Random(seed)
    start = time.monotonic()
    deadline = start + chaos_secs + timeout_secs
    cluster.start_all()
    chief = faults.chief_key(cluster)
    faults.wait_until(cluster, lambda: log_lines.first_steps(cluster.log(*chief)), deadline, "the chief's first step")
    chaos_end = time.monotonic() + chaos_secs
    next_kill = time.monotonic() + rng.uniform(*interval_secs)
    restarts = {}  # key -> when
    kills, unexpected, checkpoints, behind = [], [], [], []
    while time.monotonic() < deadline:
        now = time.monotonic()
        step = faults.registered_step(model_dir)
        if step is not None and (not checkpoints or step != checkpoints[-1]):
            checkpoints.append(step)
        for key, when in list(restarts.items()):
            if now >= when:
                cluster.start(*key)
                del restarts[key]
        running = [key for key, proc in cluster.tasks() if proc.poll() is None]
        for key, proc in cluster.tasks():
            if proc.poll() not in (None, 0) and key not in restarts and not _killed(kills, key, proc):
                unexpected.append(f"{_name(key)} exited {proc.returncode}")
                restarts[key] = now  # let the run go on; the report counts it
        trainers = [key for key, _ in cluster.tasks() if key[0] != "ps"]
        if not restarts and all(cluster.procs[key].poll() == 0 for key in trainers):
            break  # training is over
        if at_steps:  # the next kill's step reached, the last killed task restarted
            due = (len(kills) < len(at_steps) and not restarts
                   and _highest_step(cluster) >= at_steps[len(kills)])
        else:
            due = now < chaos_end and now >= next_kill
        if due and running:
            key = rng.choice(running)
            global_step = _highest_step(cluster)
            cluster.kill(*key, signal.SIGKILL)
            kills.append(Kill(round(now - start, 1), _name(key), global_step, step))
            behind.append((datetime.datetime.now(), global_step))
            restarts[key] = now + rng.uniform(*restart_delay_secs)
            next_kill = now + rng.uniform(*interval_secs)
        time.sleep(POLL_SECS)
    codes = cluster.wait(timeout=min(PS_EXIT_SECS, max(0.0, deadline - time.monotonic())))
    left = [_name(key) for key, code in codes.items() if code is None]
    cluster.stop_all(grace_secs=5)
    finished = {_name(key): int(v["global_step"]) if (v := log_lines.finished_values(cluster.log(*key))) else None
                for key, _ in cluster.tasks() if key[0] not in ("ps", "evaluator")}
    return ChaosReport(
        train_steps=train_steps, kills=kills, unexpected_exits=unexpected, finished_steps=finished,
        checkpoint_steps=checkpoints, time_lost_secs=_time_lost(faults.progress(cluster), behind),
        exit_codes={_name(key): code for key, code in codes.items()}, left_running=left,
        restored_step=faults.restorable_step(model_dir), wall_secs=round(time.monotonic() - start, 1),
        num_epochs=num_epochs,
        epochs_done=sorted({(epoch, examples) for key, _ in cluster.tasks() if key[0] != "ps"
                            for epoch, _, examples in log_lines.epochs_done(cluster.log(*key))}),
        audit=count_audit(model_dir))


def count_audit(model_dir) -> dict:
    """launch/checkpoint_reads.py's count_audit: {epoch: [distinct examples, examples trained more than
    once, trained in all]}."""
    return call_with_tensorflow("ps_trainer.launch.checkpoint_reads", "count_audit", str(model_dir))


def _killed(kills, key, proc) -> bool:
    """Whether this process's non-zero exit is the SIGKILL this script sent it."""
    return proc.returncode == -signal.SIGKILL and any(k.task == _name(key) for k in kills)


def _time_lost(steps, kills) -> float:
    """The union of the spans from each kill until the global step passed the step at that kill for good."""
    spans = []
    for killed_at, step_at_kill in kills:
        after = [s for s in steps if s.time > killed_at]
        behind = [s.time for s in after if s.step <= step_at_kill]
        recovered = [s.time for s in after if s.step > step_at_kill and (not behind or s.time > behind[-1])]
        end = recovered[0] if recovered else (after[-1].time if after else killed_at)
        spans.append((killed_at, end))
    lost, reach = 0.0, None
    for begin, end in sorted(spans):
        if reach is None or begin > reach:
            lost += (end - begin).total_seconds()
            reach = end
        elif end > reach:
            lost += (end - reach).total_seconds()
            reach = end
    return lost
