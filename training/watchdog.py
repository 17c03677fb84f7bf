"""Bounding a worker's wait for steps that cannot complete.

A step can block with no error and no end: in sync mode each one waits for gradients from
--replicas_to_aggregate replicas, so one dead worker without a backup stalls all the others; and
while a ps restarts, session re-creation waits on it with no deadline. The watchdog warns after
--stall_warning_secs without a completed step, again at that interval, and ends the process
with exit_codes.STALLED (a transient code) after --stall_timeout_secs. A step that completes resets it: a worker that
comes back lets the others carry on. A worker stalled because the chief ended in a permanent error (its ps tasks
end with it: cluster/shutdown.py) is ended at once with exit_codes.CHIEF_FAILED and the chief's reason.
"""

import os
import sys
import threading
import time

import tensorflow as tf
from absl import logging

from ps_trainer.cluster import shutdown
from ps_trainer.training import ending, exit_codes


# How long a worker is stalled before it looks for the chief's failure mark, at most every MARK_CHECK_SECS.
CHIEF_CHECK_AFTER_SECS = 2.0


class StallWatchdog(tf.compat.v1.train.SessionRunHook):
    def __init__(self, task_name: str, cause: str, warning_secs: float, timeout_secs: float,
                 clock=time.monotonic, exit_process=os._exit, chief_failure: shutdown.ChiefFailure | None = None):
        self._task_name = task_name
        self._chief_failure = chief_failure
        self._next_chief_check = float("-inf")
        self._cause = cause
        self._warning_secs = warning_secs
        self._timeout_secs = timeout_secs
        self._clock = clock
        self._exit_process = exit_process
        self._last_progress = clock()
        self._stopped = threading.Event()
        self._thread = None

    def begin(self):
        # Once, when training starts: a new session (after a failure, or one that ended short of
        # --train_steps) is no progress, so it must not reset the clock.
        if self._thread is None:
            self._last_progress = self._clock()
            self._thread = threading.Thread(target=self._watch, name="stall-watchdog", daemon=True)
            self._thread.start()

    def after_run(self, run_context, run_values):
        self._last_progress = self._clock()

    def stop(self):
        self._stopped.set()

    def check(self, warned_at: float) -> float:
        """One look: warns or exits if stalled; returns the stall time last warned about."""
        stalled = self._clock() - self._last_progress
        if stalled < warned_at:
            warned_at = 0.0  # a step completed since the last warning
        failed = self._chief_failed(stalled)
        if failed is not None:
            self._end(exit_codes.CHIEF_FAILED.code, "%s", ending.with_the_chief(self._task_name, failed))
        elif stalled >= self._timeout_secs:
            self._end(exit_codes.STALLED.code, "%s: no training step completed for %.0f s; %s. Giving up "
                      "(--stall_timeout_secs=%g): exit %d; restart this task once its peers are back.", self._task_name,
                      stalled, self._cause, self._timeout_secs, exit_codes.STALLED.code)
        elif stalled >= warned_at + self._warning_secs:
            logging.warning("%s: no training step completed for %.0f s; %s. Waiting up to %.0f s more "
                            "(--stall_timeout_secs).", self._task_name, stalled, self._cause,
                            self._timeout_secs - stalled)
            warned_at = stalled
        return warned_at

    def _chief_failed(self, stalled: float) -> str | None:
        if self._chief_failure is None or stalled < CHIEF_CHECK_AFTER_SECS or self._clock() < self._next_chief_check:
            return None
        self._next_chief_check = self._clock() + shutdown.MARK_CHECK_SECS
        return self._chief_failure.reason()

    def _end(self, code: int, *line) -> None:
        logging.error(*line)
        logging.flush()
        sys.stderr.flush()
        self._exit_process(code)

    def _watch(self):
        warned_at = 0.0
        while not self._stopped.wait(min(1.0, self._warning_secs / 4)):
            warned_at = self.check(warned_at)


def for_task(cluster, train_cfg) -> StallWatchdog:
    """The watchdog of a training task, with its settings (training/config.TrainConfig); a worker's also watches for
    the chief's failure mark in model_dir."""
    watches_chief = cluster.is_distributed and not cluster.is_chief and train_cfg.model_dir
    return StallWatchdog(cluster.task_name,
                         stall_cause(train_cfg.sync_replicas, train_cfg.replicas_to_aggregate, cluster.num_replicas),
                         train_cfg.stall_warning_secs, train_cfg.stall_timeout_secs,
                         chief_failure=shutdown.ChiefFailure(train_cfg.model_dir) if watches_chief else None)


def stall_cause(sync_replicas: bool, replicas_to_aggregate: int, num_workers: int) -> str:
    if sync_replicas and replicas_to_aggregate == num_workers:
        return (f"in sync mode every step needs gradients from all {num_workers} workers, so one that "
                "is down or restarting stalls the rest (check the other workers' logs; "
                "--replicas_to_aggregate below the worker count adds backup workers)")
    if sync_replicas:
        return (f"in sync mode every step needs gradients from {replicas_to_aggregate} of "
                f"{num_workers} workers, and fewer are running")
    return "a ps task may be down or restarting, or the chief has not initialized the variables"
