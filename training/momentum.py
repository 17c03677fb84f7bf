"""The momentum a run trains with, and why: one choice, made once when the flags are read.

An asynchronous worker's gradient lands after the other workers' updates made since it read the
variables, about N-1 of them with N workers: the update lands about N updates after the values it
was computed from (one in a single process, a synchronous round or a round of local steps, which
read fresh values). A delayed gradient acts like momentum of its own (Mitliagkas et al., 2016,
"Asynchrony begets momentum"), and delay shrinks the largest stable step roughly in proportion. The
default keeps one worker's effective step size, learning_rate / (1 - momentum), divided by that
delay: momentum = 1 - (1 - 0.9) * N, floored at 0, and past the floor (N > 10) the learning rate is
divided by what is left, 0.1 * N. docs/learning.md has the measurements behind it and their command.
"""

import dataclasses

# The momentum of one worker (single process, or a round that reads fresh values): the canonical 0.9.
BASE_MOMENTUM = 0.9
# An explicit --momentum whose effective step (with the update delay) is more than this many times
# the default's is known to lose accuracy or diverge here (0.9 with 2 workers is 2x): a warning names
# the fix.
DIVERGENCE_FACTOR = 1.5
OPTIMIZERS_WITH_MOMENTUM = ("momentum", "rmsprop")


@dataclasses.dataclass(frozen=True)
class MomentumChoice:
    momentum: float
    learning_rate_scale: float  # 1.0 unless the momentum floor was reached
    reason: str  # one line for the log: the value and why it was chosen
    warning: str | None = None  # an explicit momentum known to lose accuracy with this many workers


def reads_fresh_values(sync_replicas: bool, local_steps: int) -> bool:
    """No step reads variables other workers have moved since: a sync round, or a round of local
    steps (it fetches the ps's values and trains on its own copies)."""
    return sync_replicas or local_steps > 1


def update_delay(num_workers: int, fresh_values: bool) -> int:
    """Updates between the variables a step read and its own update landing, its own included: about
    N with N asynchronous workers, 1 where each step reads fresh values."""
    return 1 if fresh_values else max(1, num_workers)


def choose(requested: float | None, num_workers: int, sync_replicas: bool = False, local_steps: int = 1,
           optimizer: str = "momentum", learning_rate: float = 0.05) -> MomentumChoice:
    """The momentum for this run: `requested` (--momentum) if given, else the default for the update
    delay; with the learning-rate scale, the reason to log, and a warning for a requested one known
    to fail."""
    fresh_values = reads_fresh_values(sync_replicas, local_steps)
    mode = "sync" if sync_replicas else "async" if local_steps == 1 else "local-step"
    if requested is None:
        momentum, scale = default_correction(num_workers, fresh_values)
        return MomentumChoice(momentum, scale, f"momentum {momentum:g}, learning rate {learning_rate * scale:g} "
                              f"(the defaults for {num_workers} {mode} worker(s): docs/learning.md says why)")
    warning = None
    if optimizer in OPTIMIZERS_WITH_MOMENTUM and requested > 0:
        warning = divergence_warning(requested, num_workers, fresh_values)
    return MomentumChoice(requested, 1.0, f"momentum {requested:g} (--momentum)", warning)


def default_correction(num_workers: int, fresh_values: bool) -> tuple[float, float]:
    """(momentum, learning-rate scale) that keep one worker's effective step size."""
    delay = update_delay(num_workers, fresh_values)
    momentum = 1.0 - (1.0 - BASE_MOMENTUM) * delay
    if momentum >= 0:
        return round(momentum, 6), 1.0
    return 0.0, 1.0 / ((1.0 - BASE_MOMENTUM) * delay)


def divergence_warning(momentum: float, num_workers: int, fresh_values: bool) -> str | None:
    """A warning for an explicit momentum known to diverge with this many async workers, or None."""
    delay = update_delay(num_workers, fresh_values)
    if delay < 2 or delay / max(1e-9, 1.0 - momentum) <= DIVERGENCE_FACTOR / (1.0 - BASE_MOMENTUM):
        return None
    default, _ = default_correction(num_workers, fresh_values)
    return (f"--momentum={momentum:g} with {num_workers} asynchronous workers: each update lands about "
            f"{delay - 1} foreign updates late, which adds momentum of its own, and this combination is known "
            f"to lose accuracy or stay at chance. Drop --momentum (the default for {num_workers} async workers "
            f"is {default:g}), lower it, or train with --sync_replicas.")
