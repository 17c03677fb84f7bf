"""Preemption: SIGTERM (what Kubernetes, SageMaker spot and Slurm send) or SIGINT stops a worker
after its current step. The chief then writes a checkpoint at that step as its session closes, and
the process exits with exit_codes.PREEMPTED; restarting it resumes from that step.

Python runs signal handlers only between bytecodes, and a worker spends its time inside
session.run (blocked for a whole round in sync mode), so the signal is also written to a wakeup
fd that a watcher thread reads at once. If the worker has not stopped DEADLINE_SECS later, the
watcher ends the process with the same exit code: stopping is always bounded. Sooner if a ps task
stops listening meanwhile: when a whole job is cancelled (Slurm's scancel, a deleted TFJob) every
task gets the signal at once, a ps can exit before a worker's step ends, and that worker's session
would otherwise try to reconnect to it until the deadline, past the orchestrator's 30 s grace.
"""

import os
import signal
import threading

import tensorflow as tf
from absl import logging

from ps_trainer.cluster import peers
from ps_trainer.cluster.clock import SYSTEM
from ps_trainer.training import exit_codes

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
DEADLINE_SECS = 60
PS_PROBE_SECS = 0.5  # after a stop request: how often a worker checks that its ps tasks still listen


class Preemption:
    def __init__(self, task_name: str, deadline_secs: float = DEADLINE_SECS, ps_hosts=(), probe=peers.is_listening,
                 clock=SYSTEM):
        self.task_name, self.clock = task_name, clock  # cluster/clock.py
        self.deadline_secs = deadline_secs
        self.ps_hosts, self.probe = tuple(ps_hosts), probe
        self.requested = threading.Event()

    def install(self) -> "Preemption":
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        signal.set_wakeup_fd(write_fd)
        for signum in STOP_SIGNALS:
            signal.signal(signum, lambda *_: None)  # the watcher acts; a handler must exist for the fd
        threading.Thread(target=self._watch, args=(read_fd,), name="preemption", daemon=True).start()
        return self

    def _watch(self, read_fd):
        # The fd carries the number of every signal Python handles (a handler set later for another
        # signal writes here too): only a stop signal stops.
        signum = 0
        while signum not in STOP_SIGNALS:
            signum = os.read(read_fd, 1)[0]
        logging.warning("%s: %s received: stopping after the current step (the chief saves a checkpoint)",
                        self.task_name, signal.Signals(signum).name)
        self.requested.set()
        deadline = self.clock() + self.deadline_secs
        while self.clock() < deadline:
            self.clock.sleep(PS_PROBE_SECS)
            gone = [address for address in self.ps_hosts if not self.probe(address, timeout_secs=PS_PROBE_SECS)]
            if gone:
                logging.warning("%s: stopping, and ps %s no longer listens (the job is ending); exiting now",
                                self.task_name, ", ".join(gone))
                logging.flush()
                os._exit(exit_codes.PREEMPTED)
        logging.error("%s: still running %d s after %s; exiting now", self.task_name, self.deadline_secs,
                      signal.Signals(signum).name)
        os._exit(exit_codes.PREEMPTED)


class PreemptionHook(tf.compat.v1.train.SessionRunHook):
    """Requests a clean stop after the step in which preemption was asked for."""

    def __init__(self, preemption: Preemption):
        self._preemption = preemption

    def after_run(self, run_context, run_values):
        if self._preemption.requested.is_set():
            run_context.request_stop()
