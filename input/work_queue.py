"""--input_queue: the training files handed out one at a time from one queue on ps 0, so that every
example of an epoch is trained once, a fast worker takes more files than a slow one, and where the
epoch stands is saved with the model.

The queue's whole state is one int64 variable on ps 0, changed only inside a CriticalSection there,
so that a checkpoint saves it, and a restore brings it back, in one piece:
  [oldest open epoch e, examples trained of e, examples trained of e+1,
   owner of each file in epoch e (M values), owner of each file in epoch e+1 (M values)]
An owner is TODO, DONE or the index of the worker holding that file's lease. Two epochs are open
so that a worker never idles at an epoch's end while a peer trains its last file: it starts on the
next one. A work item is one file of the training split; its key, epoch * M + file index, rides
with every example read from it.

A worker takes a file (take), reads it, and gives it back as done (finish) only once every example
read from it has been trained: the step that used it returned. When a worker (re)creates its
session (its own restart, or a ps restarted and the chief restored the checkpoint) it gives back
every file it held (release) and starts its input again. A worker silent for longer than
--input_queue_lease_secs (a live one heartbeats) loses its files to the next worker that takes one; a
worker that was silent for more than half of it (paused, or stopped by SIGSTOP) renews its lease before
its next step, and if a file it held went to another worker, it trains none of that file's batches it had
read: its session is made again, as after a restart.
The heartbeats are wall-clock times, one slot per worker up to cluster.spec.MAX_REPLICAS (so that a
worker joining a running job has one): no checkpoint holds them, and a restore starts them at 0, which
makes each restored lease a silent worker's (its holder gives it back as its session is re-created).

Beside the state, a second variable on ps 0 holds each open file's trained prefix: how many of its
first examples (in the order the file is read) are trained. A worker reports the prefixes it
advanced with each step it runs (the report rides on the step's own call to ps 0: no extra round
trip), for the steps that returned before it; a take hands out a file with its prefix, and the
reader skips that many examples. A prefix is packed as key * 2^32 + count in the slot
key % (OPEN_EPOCHS * M), and reports are merged by max: a report of an older epoch's file, or a late
one, can never lower or overwrite a newer file's prefix, so reports need no lock. A report carries the
global step its training reached, and is dropped where the global step is behind it: a restore rolled
back that training (a worker that had not yet met the restore sends it), and its examples must be
trained again.

The shuffle buffer trains a file's examples out of order, so its prefix lags what was trained of it
by about the buffer's worth. The same report carries the examples each step trained past their
prefix (key * 2^32 + ordinal), which ps 0 logs in a ring per worker (no lock: each writes its own);
a take hands out a file with those of its ordinals the log holds, and the reader skips them too. The
log is live state, not saved: a restore starts it empty, and a resumed run skips its checkpoint's
prefixes only.

The guarantee: each file of each epoch is finished exactly once, and only when every example read
from it has been trained: none is lost. Beyond what a restore rolls back, an example is trained
twice only when it was trained and not yet reported before its file went to another reader: the
examples of the last steps of a worker killed, or paused past its lease (the step it was running, and
the one before, whose report was to ride on it), or those a ring overwrote (it keeps the newest 8 x
--shuffle_buffer of its worker's). The logs count the examples skipped as an earlier reader's.
"""

import collections
import json
import os
import threading

import numpy as np
import tensorflow as tf
from absl import logging

from ps_trainer.cluster.clock import SYSTEM
from ps_trainer.input import storage

v1 = tf.compat.v1

TODO, DONE = -1, -2
OPEN_EPOCHS = 2
HEAD = 1 + OPEN_EPOCHS  # the oldest open epoch, then the examples trained of each open epoch
# How long a pass that found nothing to take waits before asking again (peers still hold files).
POLL_SECS = 0.2
# Files one pass of a worker's input takes at most: every file in its shuffle buffer stays leased to
# it until trained, so with files smaller than the buffer a pass with no bound would take them all.
FILES_PER_PASS = 4
# How long one call to the queue may take before it is retried (a ps restarting, a network fault).
CALL_TIMEOUT_MS = 10000
# The part of --input_queue_lease_secs a worker may go without a call that tells ps 0 it is alive before its
# next step renews its lease first (a live one heartbeats at a quarter of it).
RENEW_AFTER = 0.5
# FailedPrecondition and NotFound: the queue's variables are not on ps 0 (restarted, not restored yet).
RETRYABLE = (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError,
             tf.errors.DeadlineExceededError, tf.errors.FailedPreconditionError, tf.errors.NotFoundError)


def files_per_pass(num_files: int, num_workers: int) -> int:
    """Files a pass of one worker's input takes at most: FILES_PER_PASS, or fewer when the files are
    few, its share of them (rounded up). With 4 files and 2 workers, a worker that started first took
    all 4 in its first pass and its peer trained nothing all epoch."""
    return max(1, min(FILES_PER_PASS, -(-num_files // max(num_workers, 1))))


def few_files_warning(num_files: int, num_workers: int, num_epochs: int) -> str | None:
    """Why some workers will idle, or None: a file is read by one worker at a time, so an epoch keeps at
    most num_files workers busy (twice that while two epochs overlap, which the last of --num_epochs
    never does). With one file (Criteo's train.txt) and --num_epochs=1, one worker trained alone."""
    if num_files >= num_workers:
        return None
    overlap = "" if num_epochs == 1 else f" ({OPEN_EPOCHS * num_files} while two epochs overlap)"
    return (f"--input_queue: {num_files} training file(s) for {num_workers} workers: a file is read by one worker "
            f"at a time, so at most {num_files} of them train within an epoch{overlap} and the others wait. Split "
            f"the data into {num_workers} or more files to keep every worker busy (GNU split -n l/{num_workers} keeps "
            "rows whole; give each CSV part the header)")


STATE = "input_queue/state"  # the state variable's name in the checkpoints
PREFIXES = "input_queue/trained_prefix"  # the trained prefixes' (a checkpoint without them: OlderLayout)
COUNT_BITS = 32  # a prefix's count in the low bits of its packed value, the file's key above them
NO_ENTRY = -1  # an empty place of the log of examples trained past their prefixes
# That log has a ring per worker the job started with, up to this many (a joining worker, or one past them,
# shares one: their writes can meet, and an example whose entry is lost so is trained again), each of
# AHEAD_PER_BUFFER times --shuffle_buffer places (at least AHEAD_MIN): a worker's examples ahead of their
# files' prefixes number about its shuffle buffer's, and the ring keeps the newest.
MAX_AHEAD_RINGS = 64
AHEAD_PER_BUFFER = 8
AHEAD_MIN = 4096


def ahead_log_shape(num_workers: int, shuffle_buffer: int) -> tuple[int, int]:
    """(rings, places in each) of the log of examples trained past their prefixes."""
    return max(1, min(num_workers, MAX_AHEAD_RINGS)), max(AHEAD_MIN, AHEAD_PER_BUFFER * shuffle_buffer)


def saved_without_queue(checkpoint: str | None) -> bool:
    """Whether `checkpoint` exists and was saved by a run that read fixed shards."""
    return checkpoint is not None and STATE not in tf.train.load_checkpoint(checkpoint).get_variable_to_shape_map()


def resume_refusal(checkpoint: str | None, num_files: int, data_dir: str) -> str | None:
    """Why a run with --input_queue cannot resume from `checkpoint` (the newest in its model_dir), or None."""
    if checkpoint is None:
        return None
    saved = tf.train.load_checkpoint(checkpoint).get_variable_to_shape_map().get(STATE)
    if saved is None:
        return (f"--input_queue: the checkpoint {checkpoint} was saved without the input queue, so where its epoch "
                "stands is unknown; resume without --input_queue, or start it in a new --model_dir")
    held = (saved[0] - HEAD) // OPEN_EPOCHS
    if held != num_files:
        return (f"--input_queue: {data_dir} holds {num_files} training file(s), the input queue in {checkpoint} "
                f"{held}: where its epoch stands means nothing for other files; put the files back, or start "
                "a new --model_dir")
    return None


def files_of(paths: list[str]) -> list[list]:
    """The training files as the queue numbers them: [name, bytes] each, in order. The name without its
    directory: the same files moved elsewhere are the same files."""
    return [[os.path.basename(path), tf.io.gfile.stat(path).length] for path in paths]


def files_refusal(record: str, files: list[list], has_checkpoint: bool, data_dir: str) -> str | None:
    """Why the chief cannot resume the run whose files `record` lists (a file in its model_dir) over `files`
    (files_of the training split), or None. Its checkpoint's epochs, and the done marks of a run that finished,
    are of the files it recorded: over other files it would go on with their places (a run with --num_epochs
    that had finished trained nothing and exited 0)."""
    recorded = _recorded_files(record)
    if not has_checkpoint or recorded is None or recorded == files:
        return None
    then, now = dict(map(tuple, recorded)), dict(map(tuple, files))
    changes = ([f"{name} was {then[name]:,} bytes and is {now[name]:,}" for name in then if now.get(name, then[name])
                != then[name]] + [f"{name} is new" for name in now if name not in then]
               + [f"{name} is gone" for name in then if name not in now]) or ["the same files in another order"]
    more = f" and {len(changes) - 2} more" if len(changes) > 2 else ""
    return (f"--input_queue: the training files in {data_dir} are not those the run in {os.path.dirname(record)} "
            f"read ({'; '.join(changes[:2])}{more}; {record} lists those): its "
            "checkpoint's epochs are of those files, and would be taken for these. Put those files back, or train "
            "these in a new --model_dir")


def record_files(record: str, files: list[list]) -> None:
    """Records in `record` the files a run's queue is over (the chief, at each start that resumes nothing or
    passed files_refusal)."""
    if _recorded_files(record) != files:
        storage.write_whole(record, json.dumps(files))


def _recorded_files(record: str) -> list[list] | None:
    try:
        with tf.io.gfile.GFile(record) as f:
            return json.loads(f.read())
    except (tf.errors.NotFoundError, ValueError):  # none, or cut short
        return None


def _first_line(message: str) -> str:
    """An error's first line that is not graph mode's heading."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return next((line for line in lines if not line.startswith("Graph execution error")), "")[:160]


def initial_state(num_files: int) -> np.ndarray:
    return np.concatenate([np.zeros(HEAD, np.int64), np.full(OPEN_EPOCHS * num_files, TODO, np.int64)])


def unpack(state, num_files: int):
    """(oldest open epoch, examples trained per open epoch, owners [OPEN_EPOCHS, num_files]) of a state
    vector: numpy in, numpy out; tensors in, tensors out."""
    if isinstance(state, np.ndarray):
        return int(state[0]), state[1:HEAD], state[HEAD:].reshape(OPEN_EPOCHS, num_files)
    return state[0], state[1:HEAD], tf.reshape(state[HEAD:], [OPEN_EPOCHS, num_files])


def _pack(epoch, examples, owners):
    return tf.concat([tf.reshape(epoch, [1]), examples, tf.reshape(owners, [-1])], 0)


class WorkQueue:
    """The queue's state on `device` (ps 0) and the ops one worker runs on it.

    take -> (key, every epoch done, leases reclaimed from silent workers, the file's trained prefix, the
            ordinals of its examples trained past that prefix, sorted); key -1: nothing to take now.
    over -> every epoch of --num_epochs is done.
    finish(key, examples) -> (the lease was still this worker's, [epochs completed, -1 for none],
                              [examples trained of each], the global step).
    release -> files this worker held, now TODO again.   heartbeat: this worker is alive.
    renew -> (the oldest open epoch, the owners [OPEN_EPOCHS, num_files]) as this worker's heartbeat is
            written, under the lock: a take that reclaims a silent worker's files comes before it or after.
    now: the time (seconds since the epoch) the calls above judge leases by; tf.timestamp() unless fed.
    report (fed report_keys, report_counts, report_step, report_ahead) -> raises those files' trained
            prefixes to the counts and logs the examples trained past them (key * 2^32 + ordinal) in this
            worker's ring, unless the global step is behind report_step (a restore rolled that training back).
    """

    def __init__(self, num_files: int, worker: int, max_workers: int, num_epochs: int, lease_secs: float,
                 device, global_step, not_saved: str | None = None, ahead_shape: tuple[int, int] = (1, AHEAD_MIN)):
        """worker: this worker's index (below max_workers, which sizes the heartbeats: joining workers
        included). not_saved: a graph collection of variables that no checkpoint holds; the heartbeats,
        wall-clock times, join it, and so does the log of examples trained past their prefixes (sized by
        ahead_shape, ahead_log_shape's: a restore starts it empty, and the restored prefixes alone say
        what was trained)."""
        self.num_files, self.worker, self.num_epochs = num_files, worker, num_epochs
        self.lease_secs = float(lease_secs)
        # Not where replica_device_setter would put them: all on ps 0 (device None clears the scope).
        with v1.device(None), v1.device(device), v1.variable_scope("input_queue"):
            self.state = v1.get_variable("state", initializer=initial_state(num_files), trainable=False,
                                         use_resource=True)
            self.last_seen = v1.get_variable("last_seen", [max_workers], tf.float64, trainable=False,
                                             initializer=v1.zeros_initializer(), use_resource=True)
            if not_saved:
                v1.add_to_collection(not_saved, self.last_seen)
            self.prefixes = v1.get_variable("trained_prefix", initializer=np.zeros(OPEN_EPOCHS * num_files, np.int64),
                                            trainable=False, use_resource=True)
            rings, places = ahead_shape
            self._ring, self._ring_places = worker % rings, places  # its own ring: no lock on its writes
            self.ahead_log = v1.get_variable("trained_ahead", initializer=np.full(rings * places, NO_ENTRY, np.int64),
                                             trainable=False, use_resource=True)
            self.ahead_written = v1.get_variable("trained_ahead_written", initializer=np.zeros(rings, np.int64),
                                                 trainable=False, use_resource=True)
            if not_saved:
                for variable in (self.ahead_log, self.ahead_written):
                    v1.add_to_collection(not_saved, variable)
            self.report_keys = v1.placeholder_with_default(tf.zeros([0], tf.int64), [None], "report_keys")
            self.report_counts = v1.placeholder_with_default(tf.zeros([0], tf.int64), [None], "report_counts")
            self.report_step = v1.placeholder_with_default(tf.constant(0, tf.int64), [], "report_step")
            self.report_ahead = v1.placeholder_with_default(tf.zeros([0], tf.int64), [None], "report_ahead")
            counts = tf.minimum(self.report_counts, (1 << COUNT_BITS) - 1)  # more never happens; less is safe
            # The wall-clock time the leases and heartbeats are judged by: now, unless a test feeds another.
            self.now = v1.placeholder_with_default(tf.timestamp(), [], "now")

            def raise_prefixes():
                with tf.control_dependencies([tf.raw_ops.ResourceScatterMax(
                        resource=self.prefixes.handle, indices=self.report_keys % (OPEN_EPOCHS * num_files),
                        updates=tf.bitwise.left_shift(self.report_keys, COUNT_BITS) + counts), self._log_ahead()]):
                    return tf.constant(True)

            # No lock: the prefixes merge by max, and each worker writes its own ring of the log.
            self.report = tf.cond(tf.cast(tf.identity(global_step), tf.int64) >= self.report_step, raise_prefixes,
                                  lambda: tf.constant(False))
            section = tf.CriticalSection(name="lock", shared_name="input_queue_lock")
            self.take = section.execute(self._take)
            self.key = v1.placeholder(tf.int64, [], "finished_key")
            self.examples = v1.placeholder(tf.int64, [], "finished_examples")
            finished = section.execute(self._finish)
            self.release = section.execute(self._release)
            self.renew = section.execute(self._renew)
            self.heartbeat = self._seen(self.now)
            self.over = self.state.read_value()[0] >= num_epochs if num_epochs else tf.constant(False)
        with tf.control_dependencies(tf.nest.flatten(finished)):  # read where the global step lives
            self.finish = (*finished, tf.identity(global_step))

    def _log_ahead(self):
        """Appends the reported examples trained past their prefixes (key * 2^32 + ordinal) to this worker's
        ring of the log, past its last write (the newest overwrite the oldest)."""
        entries = self.report_ahead[-self._ring_places:]
        count = tf.size(entries, out_type=tf.int64)
        first = tf.gather(self.ahead_written.read_value(), self._ring)
        places = self._ring * self._ring_places + (first + tf.range(count)) % self._ring_places
        # The count moves on only once it was read: in a graph nothing else orders a read and a write of one
        # variable, and a count read after its own add would place these entries over the last report's.
        with tf.control_dependencies([first]):
            moved = self.ahead_written.scatter_add(tf.IndexedSlices(tf.reshape(count, [1]), [self._ring]))
        return tf.group(moved, tf.raw_ops.ResourceScatterUpdate(resource=self.ahead_log.handle, indices=places,
                                                                updates=entries))

    def _ahead_of(self, key, prefix):
        """The ordinals of file `key` the ring holds past `prefix`, sorted, each once."""
        log = self.ahead_log.read_value()
        ours = tf.equal(tf.bitwise.right_shift(log, COUNT_BITS), key) & (key >= 0)
        ordinals = tf.bitwise.bitwise_and(tf.boolean_mask(log, ours), (1 << COUNT_BITS) - 1)
        ordinals = tf.unique(tf.boolean_mask(ordinals, ordinals >= prefix)).y
        return tf.sort(ordinals)

    def _seen(self, now):
        return self.last_seen.scatter_update(tf.IndexedSlices(tf.reshape(now, [1]), [self.worker]))

    def _write(self, epoch, examples, owners, now):
        return [self.state.assign(_pack(epoch, examples, owners)), self._seen(now)]

    def _take(self):
        now = self.now
        epoch, examples, owners = unpack(self.state.read_value(), self.num_files)
        silent = now - tf.gather(self.last_seen.read_value(), tf.maximum(owners, 0)) > self.lease_secs
        expired = (owners >= 0) & tf.not_equal(owners, self.worker) & silent
        owners = tf.where(expired, tf.constant(TODO, tf.int64), owners)
        rows = epoch + tf.range(OPEN_EPOCHS, dtype=tf.int64)
        open_rows = rows < self.num_epochs if self.num_epochs else tf.fill([OPEN_EPOCHS], True)
        todo = tf.reshape(tf.equal(owners, TODO) & open_rows[:, None], [-1])
        found = tf.reduce_any(todo)
        position = tf.argmax(tf.cast(todo, tf.int32), output_type=tf.int64)
        flat = tf.reshape(owners, [-1])
        flat = tf.where(found & tf.equal(tf.range(tf.size(flat, tf.int64)), position),
                        tf.constant(self.worker, tf.int64), flat)
        with tf.control_dependencies(self._write(epoch, examples, flat, now)):
            key = tf.where(found, epoch * self.num_files + position, tf.constant(-1, tf.int64))
            over = tf.constant(False) if not self.num_epochs else epoch >= self.num_epochs
            prefix = self._prefix(key)
            return key, over, tf.reduce_sum(tf.cast(expired, tf.int64)), prefix, self._ahead_of(key, prefix)

    def _prefix(self, key):
        """The trained prefix reported for file `key` (0 for none, or for key -1)."""
        packed = tf.gather(self.prefixes.read_value(), tf.maximum(key, 0) % (OPEN_EPOCHS * self.num_files))
        ours = tf.equal(tf.bitwise.right_shift(packed, COUNT_BITS), key)
        return tf.where(ours, tf.bitwise.bitwise_and(packed, (1 << COUNT_BITS) - 1), tf.constant(0, tf.int64))

    def _finish(self):
        now = self.now
        epoch, examples, owners = unpack(self.state.read_value(), self.num_files)
        row, item = self.key // self.num_files - epoch, self.key % self.num_files
        position = tf.clip_by_value(row, 0, OPEN_EPOCHS - 1) * self.num_files + item
        flat = tf.reshape(owners, [-1])
        mine = (row >= 0) & (row < OPEN_EPOCHS) & tf.equal(tf.gather(flat, position), self.worker)
        flat = tf.where(mine & tf.equal(tf.range(tf.size(flat, tf.int64)), position), tf.constant(DONE, tf.int64),
                        flat)
        examples += tf.where(mine, tf.one_hot(tf.clip_by_value(row, 0, OPEN_EPOCHS - 1), OPEN_EPOCHS,
                                              dtype=tf.int64) * self.examples, tf.zeros([OPEN_EPOCHS], tf.int64))
        owners = tf.reshape(flat, [OPEN_EPOCHS, self.num_files])
        completed, completed_examples = [], []
        for _ in range(OPEN_EPOCHS):  # the next epoch can be complete already, when its files were quicker
            complete = tf.reduce_all(tf.equal(owners[0], DONE))
            completed.append(tf.where(complete, epoch, tf.constant(-1, tf.int64)))
            completed_examples.append(examples[0])
            fresh = tf.fill([1, self.num_files], tf.constant(TODO, tf.int64))
            owners = tf.where(complete, tf.concat([owners[1:], fresh], 0), owners)
            examples = tf.where(complete, tf.concat([examples[1:], [0]], 0), examples)
            epoch += tf.cast(complete, tf.int64)
        with tf.control_dependencies(self._write(epoch, examples, owners, now)):
            return tf.identity(mine), tf.stack(completed), tf.stack(completed_examples)

    def _renew(self):
        epoch, _, owners = unpack(self.state.read_value(), self.num_files)
        with tf.control_dependencies([self._seen(self.now)]):
            return tf.identity(epoch), tf.identity(owners)

    def _release(self):
        now = self.now
        epoch, examples, owners = unpack(self.state.read_value(), self.num_files)
        held = tf.equal(owners, self.worker)
        with tf.control_dependencies(self._write(epoch, examples, tf.where(held, tf.constant(TODO, tf.int64), owners),
                                                 now)):
            return tf.reduce_sum(tf.cast(held, tf.int64))


class EpochTally:
    """What one worker finished of each epoch: files, their examples, of those the ones an earlier
    reader had trained (skipped here), and the examples it trained of files then handed to another."""

    def __init__(self):
        self.files, self.examples, self.skipped, self.again = (collections.Counter() for _ in range(4))


class ItemFeed:
    """This worker's side of the queue: the files its input pipeline reads, and what it has trained.

    The input pipeline (tf.data threads) calls items() and counts what it reads of each file; the
    session hook (training/queue_hook.py) counts what each step trained, finishes the files trained
    to their end, and restart()s the feed when its session is (re)created. A generation number
    tells the pipeline of an earlier session, whose files were given back, to stop taking any.

    The pipeline never makes the feed's session, and never waits for a queue it cannot reach: a step
    may be waiting on its read, and a session being closed waits for that step. A call of the
    pipeline's that fails hands its error to the training session's Coordinator (MonitoredSession
    then makes the session again, and restart() makes the feed's) and ends the pipeline. Waiting
    instead would stop the chief for good when ps 0 restarted: its queue comes back only with the
    restore that the chief's next session makes.

    In sync training (empty_batches) a round needs every worker's gradient, so a worker must step
    while a peer trains the last files of the run: a pass that takes no file ends with an empty
    batch (input.queued_batches), whose gradient is zero, and passes follow one another with no
    pause, paced by the rounds. The run's end is closed (end_op: the sync token queue's close) by the
    worker that finds every epoch done, which wakes the workers waiting for a round that will not come.
    """

    def __init__(self, queue: WorkQueue, task_name: str, empty_batches: bool = False,
                 files_per_pass: int = FILES_PER_PASS, clock=SYSTEM):
        """clock (cluster/clock.py): the time renew_lease() judges this worker's silences by, and what a take
        that found no file waits on."""
        self.queue, self.task_name = queue, task_name
        self._clock = clock
        self._seen_at = clock()  # when the last call that tells ps 0 this worker is alive began
        self._silence = 0.0  # the longest time between two such calls since the lease was last renewed
        self.files_per_pass = files_per_pass
        self.empty_batches = empty_batches
        self.end_op = None
        self.generation = 0
        self.finished = False  # every epoch of --num_epochs is done
        self._took_nothing = False  # the last pass ended with no file taken
        self._skip_pass = False  # the next pass takes nothing: its batch is empty
        self.tally = EpochTally()
        self._lock = threading.Lock()
        self._session_factory = None
        self._session = None
        self._dropped = []  # sessions a pipeline call gave up, for the hook's thread to close (_close_dropped)
        self._coord = None  # the training session's Coordinator, while that session lasts
        self._read, self._trained = collections.Counter(), collections.Counter()
        self._ended = set()
        # Each file's trained prefix (how many of its first examples are trained, those its take
        # skipped included), the ordinals trained past it, and the files whose prefix moved since
        # the last report; the examples trained past their prefixes since the last report (key * 2^32 +
        # ordinal); and the ordinals past its prefix that each file's take skipped (sorted).
        self._prefix, self._skipped, self._ahead, self._moved = {}, {}, collections.defaultdict(set), set()
        self._moved_ahead, self._skip_ahead = [], {}
        self._moved_at = 0  # the global step the moves since the last report were trained by
        self._unsent = None  # a report not known to have reached ps 0 (its step failed): sent with the next
        self.finished_files = collections.deque()  # (key, examples, still ours, epochs completed, ..., step)

    def connect(self, make_session) -> None:
        """make_session() -> a session on the cluster, for the feed's own calls to the queue."""
        self._session_factory = make_session

    def _call(self, fetches, feed_dict=None, pipeline: bool = False, seen: bool = False):
        """Runs fetches on the queue, once; after a failure the hook's thread opens a new session at its
        next call (pipeline: the caller is the input pipeline, which never opens one; seen: the call writes
        this worker's heartbeat).

        A call that fails for a reason a new session can mend (RETRYABLE) raises AbortedError, which
        MonitoredSession takes for a preemption: it makes its session again, and this worker gives back
        the files it held (restart). A call timed out after CALL_TIMEOUT_MS is one of those: ps 0, or
        this process itself, paused or overloaded (a process stopped by SIGSTOP mid-call finds its
        deadline passed as it resumes)."""
        if self._session is None and (pipeline or self._stopping()):
            raise tf.errors.AbortedError(None, None, f"{self.task_name}: the input queue's session was lost with "
                                         "an earlier call; the next training session makes it again")
        began = self._clock()
        try:
            if self._session is None:
                self._session = self._session_factory()
            result = self._session.run(fetches, feed_dict=feed_dict,
                                       options=v1.RunOptions(timeout_in_ms=CALL_TIMEOUT_MS))
            if seen:
                self._silence = max(self._silence, self._clock() - self._seen_at)
                self._seen_at = max(self._seen_at, began)
            return result
        except RETRYABLE as err:
            if pipeline:
                # The pipeline calls inside a step of the training session, whose close (once the error reaches
                # MonitoredSession) waits for that step: a session closed here can wait on that close in turn,
                # and both waited for good (seen after a ps 0 restart). The hook's thread closes it.
                self._dropped.append(self._session)
                self._session = None
            else:
                self._close_session()
            raise tf.errors.AbortedError(
                None, None, f"{self.task_name}: the input queue on ps 0 did not answer ({type(err).__name__} after "
                f"{self._clock() - began:.1f} s: {_first_line(err.message)})") from err

    def _stopping(self) -> bool:
        """The training session is being closed, or a call of the pipeline's failed."""
        return self._coord is not None and self._coord.should_stop()

    def _lost(self, err: tf.errors.OpError) -> None:
        """A call of the pipeline's failed: the training session is made again (its Coordinator takes
        the AbortedError), and the pipeline ends (passes() and items() see the Coordinator stopping)."""
        if self._coord is None:  # no training session to hand it to (a test driving the feed by hand)
            raise err
        if not self._coord.should_stop():  # once it is stopping (closed, or an earlier error), it has one
            logging.info("%s; the training session is made again", err.message)
            self._coord.request_stop((type(err), err, err.__traceback__))

    def _over(self, pipeline: bool = False) -> None:
        """Every epoch is done: the pipeline ends, and the workers waiting for a sync round are woken."""
        self.finished = True
        if self.end_op is None:
            return
        try:
            self._call(self.end_op, pipeline=pipeline)
        except (*RETRYABLE, tf.errors.OutOfRangeError) as err:  # closed already, or its ps is down
            logging.info("%s: input queue: every epoch is done; closing the sync token queue failed (%s)",
                         self.task_name, _first_line(err.message))

    def all_done(self) -> bool:
        """Every epoch of --num_epochs is done, as this worker saw or as the queue says."""
        if not self.finished and self.queue.num_epochs and bool(self._call(self.queue.over)):
            self.finished = True
        return self.finished

    def _close_session(self):
        session, self._session = self._session, None
        self._close_dropped(session)

    def _close_dropped(self, *more):
        """Closes the sessions the pipeline gave up, and `more`: the hook's thread calls it, outside any step. Each is
        popped from the list, so one the pipeline drops meanwhile stays for the next call."""
        sessions = [*more]
        while self._dropped:
            sessions.append(self._dropped.pop())
        for session in sessions:
            if session is not None:
                try:
                    session.close()
                except tf.errors.OpError:
                    pass

    # The input pipeline's side.
    def passes(self):
        """Pass numbers for the pipeline: a pass reads the files it can take, then its shuffle buffer
        drains (so the files it read get finished) before the next pass asks for more."""
        generation, number = self.generation, 0
        while generation == self.generation and not self.finished and not self._stopping():
            yield number
            number += 1

    def items(self):
        """(key, file index, generation, trained prefix to skip, the ordinals past it to skip) of each file
        this pass takes, until none is left to take now."""
        generation, taken = self.generation, 0
        with self._lock:
            if self._skip_pass and generation == self.generation:
                self._skip_pass, self._took_nothing = False, True
                return
        while True:
            # Under the lock: a restart() (which gives back this worker's files) comes before this
            # take or after it, never between its check and its take.
            with self._lock:
                if generation != self.generation or self._stopping():
                    return
                try:
                    result = self._call(self.queue.take, pipeline=True, seen=True)
                except RETRYABLE as err:
                    self._lost(err)
                    return
            key, over, reclaimed, start = (int(value) for value in result[:4])
            ahead = np.asarray(result[4], np.int64)
            if reclaimed:
                logging.warning("%s: input queue: took back %d file(s) from workers silent for more than %.0f s",
                                self.task_name, reclaimed, self.queue.lease_secs)
            if over:
                self._over(pipeline=True)
                self._took_nothing = False
                return
            if key < 0:
                break
            taken += 1
            with self._lock:
                if generation != self.generation:  # given back by a restart() since the take
                    return
                self._prefix[key], self._skipped[key] = start, start + ahead.size
                self._skip_ahead[key] = ahead
                self._ahead[key] = set(ahead.tolist())  # the prefix moves over them as their gaps are trained
            yield key, key % self.queue.num_files, generation, start, ahead
            if taken == self.files_per_pass:
                break
        self._took_nothing = not taken
        if not taken and not self.empty_batches:
            self._clock.sleep(POLL_SECS)

    def took_nothing(self) -> bool:
        """The pass that just ended took no file (the pipeline reads it after the pass's batches)."""
        return self._took_nothing

    def read_block(self, generation, key, count, start):
        """Counts a block of `count` examples read from file `key` (those before `start`, its trained
        prefix, and those its take skipped past it, as trained); returns the ordinal of its first in the
        file."""
        key, count, start = int(key), int(count), int(start)
        with self._lock:
            first = self._read[key]
            if int(generation) == self.generation:
                self._read[key] += count
                skipped = self._skip_ahead.get(key, np.zeros(0, np.int64))
                past_prefix = np.searchsorted(skipped, first + count) - np.searchsorted(skipped, max(first, start))
                self._trained[key] += min(max(start - first, 0), count) + int(past_prefix)
        return first

    def read_to_end(self, generation, key):
        with self._lock:
            if int(generation) == self.generation:
                self._ended.add(int(key))
        # A file empty, or trained to its end before it was taken (its prefix skipped all of it): no
        # step will count it.
        try:
            self.trained(np.array([], np.int64), generation=int(generation))
        except RETRYABLE as err:
            self._lost(err)
        return key

    def counted(self, blocks: tf.data.Dataset, key, generation, skip: bool, start=0, ahead=None) -> tf.data.Dataset:
        """One file's resolved blocks (input/records.py), each example tagged with the file's key and its
        ordinal among the file's examples, and counted as read; the first `start` examples (the file's
        trained prefix) and those of `ahead` (ordinals trained past it, sorted) are dropped; after its
        last block, the file is marked read to its end."""
        ahead = tf.zeros([0], tf.int64) if ahead is None else ahead
        ahead_or_none = tf.concat([ahead, [-1]], 0)  # -1: no ordinal's, past the last

        def tag(*element):
            problems, values = element if skip else (None, element)
            n = tf.size(values[1], out_type=tf.int64)
            first = tf.reshape(tf.py_function(self.read_block, [generation, key, n, start], tf.int64), [])
            ordinals = first + tf.range(n)

            def untrained():
                trained = tf.equal(tf.gather(ahead_or_none, tf.searchsorted(ahead, ordinals)), ordinals)
                keep = (ordinals >= start) & ~trained
                return tf.nest.map_structure(lambda value: tf.boolean_mask(value, keep), (values, ordinals))

            # Only the blocks that reach into what was trained are masked (after a handover).
            lo, hi = tf.unstack(tf.searchsorted(ahead, tf.stack([first, first + n])))
            values, ordinals = tf.cond((first >= start) & (hi <= lo), lambda: (values, ordinals), untrained)
            tagged = (*values, tf.fill(tf.shape(ordinals), key), ordinals)
            return (problems, tagged) if skip else tagged

        tagged = blocks.map(tag)
        end = tf.data.Dataset.from_tensors(key).map(
            lambda k: tf.py_function(self.read_to_end, [generation, k], tf.int64))
        return tagged.concatenate(end.flat_map(lambda _: tagged.take(0)))

    # The session hook's side.
    def restart(self, skip_first_pass: bool = False, coord=None) -> int:
        """A new session: the pipeline of the last one stops taking files, the files this worker held
        are TODO again; returns how many. skip_first_pass: the first pass takes no file (its one
        batch is empty), for a first step whose gradient is dropped. coord: the session's Coordinator,
        which takes the errors of the pipeline's calls.

        What the last session's last steps trained is reported first, as stop() does: a session made
        again after an error ends with no stop(), and the next reader would train those examples again
        (a restore that rolled them back drops the report: it carries their global step)."""
        self._close_dropped()
        report = self.report()
        with self._lock:
            self.generation += 1
            self._coord = coord
            self._skip_pass = skip_first_pass
            self._read.clear()
            self._trained.clear()
            self._ended.clear()
            self._forget_prefixes()
            if len(report[self.queue.report_keys]) or len(report[self.queue.report_ahead]):
                self._call(self.queue.report, report)
            self._unsent = None
            return int(self._call(self.queue.release, seen=True))

    def _forget_prefixes(self):
        self._moved_at = 0
        self._moved_ahead.clear()
        self._skip_ahead.clear()
        self._prefix.clear()
        self._skipped.clear()
        self._ahead.clear()
        self._moved.clear()

    def stop(self) -> None:
        """The session ended: the pipeline stops taking files, and the files this worker held go back to
        the queue, for the peers still stepping (a run that ends at --train_steps ends on each worker
        at its own step, and a peer's last steps may need them)."""
        report = self.report()  # what the last steps trained: the peers that take the files skip it
        with self._lock:
            self.generation += 1
            try:
                # Two calls, in this order: in one, a peer's take could run between the release and
                # the report, and read the file's prefix without this worker's last steps (seen: the
                # elastic test's joiner trained the last batch of a worker that left a second time).
                self._call(self.queue.report, report)
                self._unsent = None
                self._call(self.queue.release, seen=True)
            except RETRYABLE:  # ps 0 is down: the lease lapses, or the restore brings the files back
                pass
            self._forget_prefixes()
            self._coord = None
        self._close_session()

    def heartbeat(self) -> None:
        self._call(self.queue.heartbeat, seen=True)

    def renew_lease(self) -> None:
        """Before a step: if this worker told ps 0 nothing for more than RENEW_AFTER of its lease at some time
        since the last renewal (now, or between two calls: a take of its pipeline's may be the first call
        after a pause), renews it, and raises AbortedError (MonitoredSession makes the session again:
        restart()) if a file it holds was reclaimed meanwhile by a worker that took it, or finished by one: the
        batches read of it here would train its examples a second time."""
        silent = max(self._silence, self._clock() - self._seen_at)
        if silent <= RENEW_AFTER * self.queue.lease_secs:
            return
        epoch, owners = self._call(self.queue.renew, seen=True)
        self._silence = 0.0
        with self._lock:
            held = list(self._prefix)
        num_files = self.queue.num_files
        lost = [key for key in held if not 0 <= key // num_files - epoch < OPEN_EPOCHS
                or owners[key // num_files - epoch, key % num_files] != self.queue.worker]
        if lost:
            raise tf.errors.AbortedError(None, None, (
                f"{self.task_name}: input queue: silent for {silent:.0f} s (its lease: {self.queue.lease_secs:.0f} s), "
                f"and {len(lost)} file(s) it held went to another worker meanwhile: its input starts afresh, "
                "training none of what it had read of them"))

    def trained(self, keys: np.ndarray, ordinals: np.ndarray | None = None, generation=None, step: int = 0) -> None:
        """Counts one step's examples by file (ordinals: each one's in its file, which move the files'
        trained prefixes; step: the global step that step reached), and finishes the files trained to
        their end: each is added to
        finished_files as (key, examples, still ours, epochs completed, their examples, global step).
        generation: the pipeline's, when the pipeline calls; nothing is done once the session it
        belongs to has ended (its files went back to the queue)."""
        pipeline = generation is not None
        done = []
        with self._lock:
            if generation is not None and generation != self.generation:
                return
            for key in np.unique(keys).tolist():
                mine = keys == key
                self._trained[key] += int(mine.sum())
                if ordinals is not None and key in self._prefix:
                    self._advance(key, ordinals[mine], step)
            for key in [k for k in self._ended if self._trained[k] >= self._read[k]]:
                self._ended.discard(key)
                examples = self._read.pop(key, 0)  # a file with no block (an empty CSV) was never counted
                self._trained.pop(key, None)
                for held in (self._prefix, self._ahead, self._skip_ahead):  # a long session holds only open files
                    held.pop(key, None)
                self._moved.discard(key)
                done.append((key, examples, self._skipped.pop(key, 0)))
        for key, examples, skipped in done:
            result = self._call(self.queue.finish, {self.queue.key: key, self.queue.examples: examples},
                                pipeline=pipeline)
            mine, completed, completed_examples, step = result
            epoch = key // self.queue.num_files
            if mine:
                self.tally.files[epoch] += 1
                self.tally.examples[epoch] += examples
                self.tally.skipped[epoch] += skipped
            else:
                self.tally.again[epoch] += examples - skipped
            self.finished_files.append((key, examples, bool(mine), [int(e) for e in completed if e >= 0],
                                        [int(n) for e, n in zip(completed, completed_examples) if e >= 0],
                                        int(step)))
            if self.queue.num_epochs and self.queue.num_epochs - 1 in completed:
                self._over(pipeline)

    def _advance(self, key: int, ordinals: np.ndarray, step: int) -> None:
        """Moves file `key`'s trained prefix over the ordinals just trained by global step `step` (under
        the lock)."""
        ahead, prefix = self._ahead[key], self._prefix[key]
        ahead.update(ordinals.tolist())
        while prefix in ahead:
            ahead.remove(prefix)
            prefix += 1
        moved = prefix != self._prefix[key]
        if moved:
            self._prefix[key] = prefix
            self._moved.add(key)
        past = ordinals[ordinals >= prefix]  # trained ahead of the prefix: reported for a next reader to skip
        if moved or past.size:
            self._moved_at = max(self._moved_at, int(step))
        self._moved_ahead.extend(((key << COUNT_BITS) + past).tolist())

    def report(self) -> dict:
        """The feed of the queue's report op: the files whose trained prefix moved since the last report,
        their prefixes, and the global step they were trained by; each move is reported once it reached
        ps 0 (delivered()): until then each report carries the last one's too. A step that failed lost the
        report it carried, and the next reader of those files would train their examples again. Merged
        reports are safe: prefixes merge by max, and a take skips a logged ordinal however often it is logged."""
        queue = self.queue
        with self._lock:
            keys = sorted(self._moved)
            step, self._moved_at = self._moved_at, 0
            self._moved.clear()
            ahead, self._moved_ahead = np.array(self._moved_ahead, np.int64), []
            report = {queue.report_keys: np.array(keys, np.int64),
                      queue.report_counts: np.array([self._prefix[key] for key in keys], np.int64),
                      queue.report_step: step, queue.report_ahead: ahead}
            if self._unsent is not None:
                report = {name: max(self._unsent[name], value) if name is queue.report_step
                          else np.concatenate([self._unsent[name], value]) for name, value in report.items()}
            self._unsent = report
            return report

    def delivered(self) -> None:
        """The step that carried the last report() returned: ps 0 has it."""
        self._unsent = None
