"""Asynchronous training with N workers: how stale each update is, and the momentum that keeps it learning.

An asynchronous worker computes its gradient on the variables as they were when its step read them,
and the update lands after the other workers' updates of that time: its staleness is the number of
those foreign updates, about N-1 on average, so the update lands about N updates after the values
it was computed from (its own included; one in a single process or a synchronous round). A delayed
gradient acts like momentum (Mitliagkas et al., 2016, "Asynchrony begets momentum"), and delay
shrinks the largest step size that stays stable roughly in proportion to it. Measured here (default
MLP, learning rate 0.05, held-out accuracy after 3000 global steps; one process: 0.875): momentum
0.9 stays at chance with 3 or more async workers and loses accuracy with 2 (0.76, 0.79); 0.8 with
2 workers reaches 0.87; with 4 workers 0.7 reaches 0.85, 0.6 0.84-0.85; with 8, 0.3 0.77, 0.2
0.75-0.78 (on 20,000 examples instead of 60,000, 4 workers: 0.7 0.81, 0.5 0.80, 0.15 0.72).

The default keeps one worker's effective step size, learning_rate / (1 - momentum), divided by that
delay: momentum = 1 - (1 - 0.9) * N, floored at 0, and past the floor (N > 10) the learning rate is
divided by what is left, 0.1 * N.
"""

import dataclasses

import tensorflow as tf

# The momentum of one worker (single process, or a synchronous round): the canonical 0.9.
BASE_MOMENTUM = 0.9
# An explicit --momentum whose effective step (with the update delay) is more than this many times
# the default's is known to lose accuracy or diverge here (0.9 with 2 workers is 2x): a warning names
# the fix.
DIVERGENCE_FACTOR = 1.5


@dataclasses.dataclass(frozen=True)
class AsyncCorrection:
    momentum: float
    learning_rate_scale: float  # 1.0 unless the momentum floor was reached


def update_delay(num_workers: int, sync_replicas: bool) -> int:
    """Updates between the variables a step read and its own update landing, its own included: about
    N with N asynchronous workers, 1 in one process or a synchronous round."""
    return 1 if sync_replicas else max(1, num_workers)


def default_correction(num_workers: int, sync_replicas: bool) -> AsyncCorrection:
    """The momentum (and learning-rate scale) that keeps one worker's effective step size."""
    delay = update_delay(num_workers, sync_replicas)
    momentum = 1.0 - (1.0 - BASE_MOMENTUM) * delay
    if momentum >= 0:
        return AsyncCorrection(round(momentum, 6), 1.0)
    return AsyncCorrection(0.0, 1.0 / ((1.0 - BASE_MOMENTUM) * delay))


def divergence_warning(momentum: float, num_workers: int, sync_replicas: bool) -> str | None:
    """A warning for an explicit momentum known to diverge with this many async workers, or None."""
    delay = update_delay(num_workers, sync_replicas)
    if delay < 2 or delay / max(1e-9, 1.0 - momentum) <= DIVERGENCE_FACTOR / (1.0 - BASE_MOMENTUM):
        return None
    default = default_correction(num_workers, sync_replicas).momentum
    return (f"--momentum={momentum:g} with {num_workers} asynchronous workers: each update lands about "
            f"{delay - 1} foreign updates late, which adds momentum of its own, and this combination is known "
            f"to lose accuracy or stay at chance. Drop --momentum (the default for {num_workers} async workers "
            f"is {default:g}), lower it, or train with --sync_replicas.")


def steps(global_step, train_op):
    """(read, landed): the global step as this run reads it (with the variables, at its start) and
    as it is once this run's update has landed. landed - read - own updates = the run's staleness."""
    read = global_step.read_value()
    with tf.control_dependencies([train_op]), tf.device(global_step.device):
        landed = global_step.read_value()
    return read, landed
