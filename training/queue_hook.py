"""The worker's session hook of --input_queue (input/work_queue.py): a new session gives back the
files the worker held and starts its input afresh; each step counts what it trained by file, and
the files trained to their end are finished; the lines a user checks an epoch by are logged here."""

import os
import time

import numpy as np
import tensorflow as tf
from absl import logging

from ps_trainer.input import work_queue
from ps_trainer.training import log_lines

v1 = tf.compat.v1


def read_audit(path: str) -> np.ndarray:
    """[examples, 3] int64 (epoch, file, ordinal) of an --input_queue_audit file, as trained, in order.
    A record cut short (its worker killed mid-write, or still writing it) is left out."""
    values = np.fromfile(path, "<i8")
    return values[:values.size // 3 * 3].reshape(-1, 3)


class InputQueueHook(v1.train.SessionRunHook):
    """keys, ordinals: the file key of each example of the step's batch and its ordinal in that file;
    initializer: the input iterator's; drops_first_step() (sync): the new session's first gradient
    goes stale, so its batch must be empty; audit_path (--input_queue_audit): where to append the
    (epoch, file, ordinal) of every example trained, as int64 triples; reached: the global step the run's
    report carries, a tensor the run fetches (as the run's own count left it: training/graph.step_reached) or
    () -> it, called once the hooks before this one have seen the run (a synchronous worker's: the step its
    round was applied at, Step.round_applied); default: the global step as read anywhere in the run.

    In sync training it runs after the sync hook: a step's batch is counted once its round is applied.
    """

    def __init__(self, feed: work_queue.ItemFeed, keys, ordinals, initializer, lease_secs: float,
                 drops_first_step=None, audit_path=None, reached=None):
        self.feed, self._keys, self._ordinals, self._initializer = feed, keys, ordinals, initializer
        self._reached_after_run = reached if callable(reached) else None
        self._reached = None if callable(reached) else reached
        self._audit_path, self._audit = audit_path, None
        self._drops_first_step = drops_first_step or (lambda: False)
        self._heartbeat_secs = lease_secs / 4
        self._last_heartbeat = time.monotonic()

    def begin(self):
        self._global_step = self._reached if self._reached is not None else v1.train.get_global_step()
        if self._audit_path and self._audit is None:
            os.makedirs(os.path.dirname(self._audit_path), exist_ok=True)
            self._audit = open(self._audit_path, "ab")  # closed in end()

    def after_create_session(self, session, coord):
        try:
            released = self.feed.restart(skip_first_pass=self._drops_first_step(), coord=coord)
        except work_queue.RETRYABLE as err:
            # ps 0 restarted since the session was made (its queue is not restored yet): an error that
            # MonitoredSession takes for a preemption, so that it makes the session again.
            raise tf.errors.AbortedError(None, None, f"{self.feed.task_name}: input queue on ps 0 lost while the "
                                         f"session was made ({log_lines.error_cause(err.message)})") from err
        session.run(self._initializer)
        if released:
            logging.info("%s: input queue: gave back the %d file(s) this worker held (its input starts "
                         "afresh; each goes on from its reported trained prefix)", self.feed.task_name, released)

    def before_run(self, run_context):
        self.feed.renew_lease()  # after a long silence: none of a file another worker has now is trained here
        # The trained prefixes that the steps before this one moved ride on its call to ps 0.
        return v1.train.SessionRunArgs([self._keys, self._ordinals, self.feed.queue.report, self._global_step],
                                       feed_dict=self.feed.report())

    def after_run(self, run_context, run_values):
        keys, ordinals, _, step = run_values.results
        applied = self._reached_after_run() if self._reached_after_run is not None else None
        if applied is not None:
            step = applied
        self.feed.delivered()
        if self._audit:  # written before the files are finished: a kill loses no line of a finished file
            num_files = self.feed.queue.num_files
            self._audit.write(np.stack([keys // num_files, keys % num_files, ordinals], 1).astype("<i8").tobytes())
            self._audit.flush()
        self.feed.trained(keys, ordinals, step=step)
        self._log_finished()
        if self.feed.finished:  # no further step: in sync mode it would join one more round
            run_context.request_stop()
        if time.monotonic() - self._last_heartbeat > self._heartbeat_secs:
            self.feed.heartbeat()
            self._last_heartbeat = time.monotonic()

    def end(self, session):
        self._log_finished()
        self.feed.stop()
        if self._audit:
            self._audit.close()
            self._audit = None
        tally = self.feed.tally
        for epoch in sorted(set(tally.files) | set(tally.again)):
            log_lines.log_epoch_tally(self.feed.task_name, epoch, tally.files[epoch], tally.examples[epoch],
                                      tally.skipped[epoch], tally.again[epoch])

    def _log_finished(self):
        task, num_files = self.feed.task_name, self.feed.queue.num_files
        while self.feed.finished_files:
            key, examples, mine, epochs, epoch_examples, step = self.feed.finished_files.popleft()
            epoch = key // num_files
            if not mine:
                logging.warning("%s: input queue: file %d of epoch %d was given to another worker before this "
                                "one finished it (its lease lapsed); its %d examples trained here are read again",
                                task, key % num_files, epoch, examples)
            for done, count in zip(epochs, epoch_examples):
                log_lines.log_epoch_done(task, done, step, count)
