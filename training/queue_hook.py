"""The worker's session hook of --input_queue (input/work_queue.py): a new session gives back the
files the worker held and starts its input afresh; each step counts what it trained by file, and
the files trained to their end are finished; the lines a user checks an epoch by are logged here."""

import time

import tensorflow as tf
from absl import logging

from input import work_queue
from training import log_lines

v1 = tf.compat.v1


class InputQueueHook(v1.train.SessionRunHook):
    """keys: the file key of each example of the step's batch; initializer: the input iterator's;
    drops_first_step() (sync): the new session's first gradient goes stale, so its batch must be empty.

    In sync training it runs after the sync hook: a step's batch is counted once its round is applied.
    """

    def __init__(self, feed: work_queue.ItemFeed, keys, initializer, lease_secs: float, drops_first_step=None):
        self.feed, self._keys, self._initializer = feed, keys, initializer
        self._drops_first_step = drops_first_step or (lambda: False)
        self._heartbeat_secs = lease_secs / 4
        self._last_heartbeat = time.monotonic()

    def after_create_session(self, session, coord):
        released = self.feed.restart(skip_first_pass=self._drops_first_step())
        session.run(self._initializer)
        if released:
            logging.info("%s: input queue: gave back the %d file(s) this worker held (its input starts "
                         "afresh; what it had trained of them is read again)", self.feed.task_name, released)

    def before_run(self, run_context):
        return v1.train.SessionRunArgs(self._keys)

    def after_run(self, run_context, run_values):
        self.feed.trained(run_values.results)
        self._log_finished()
        if self.feed.finished:  # no further step: in sync mode it would join one more round
            run_context.request_stop()
        if time.monotonic() - self._last_heartbeat > self._heartbeat_secs:
            self.feed.heartbeat()
            self._last_heartbeat = time.monotonic()

    def end(self, session):
        self._log_finished()
        self.feed.stop()
        tally = self.feed.tally
        for epoch in sorted(set(tally.files) | set(tally.again)):
            log_lines.log_epoch_tally(self.feed.task_name, epoch, tally.files[epoch], tally.examples[epoch],
                                      tally.again[epoch])

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
