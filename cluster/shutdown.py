"""How the ps tasks learn that training is over: the protocol, with its two verbs. A training
replica that has finished calls report_done; a ps calls wait_for_every_replica.

Each ps task owns a FIFO queue (same shared_name on every side, so workers reach the one the ps
reads). A training replica (chief or worker) that has finished, after its session closed and the
chief's last checkpoint is written, enqueues its replica index into every ps queue. A ps exits once
every replica has reported. Indexes, not bare tokens: a worker that is restarted and finishes twice
is still counted once.

A queue lives as long as its ps: a ps restarted after some replicas reported would wait for them
forever. So a replica also leaves a mark in <model_dir>/done/ (the global step it finished at and
its --train_steps), before it tells the queues, and a ps given --model_dir counts the marks made
for its own --train_steps too: the marks of an earlier run to a smaller --train_steps, continued
now with a larger one, are not this run's.

Who is waited for: the replicas of the ps's own cluster, and the workers that joined the running job
since (--join_address), each of which leaves its address in <model_dir>/members/ before it trains.
Once the chief has finished, a replica whose address has refused connections for --worker_gone_secs
(it left the job for good, or its host is gone) is no longer waited for: a worker restarted after that finds
the chief's mark and exits at once, with no ps to talk to.

A chief that ends in a permanent error (exit 1: a rerun fails the same way until someone fixes its cause)
never reports: it leaves <model_dir>/done/chief-failed with its one-line reason instead, and the ps tasks
end with it, as the workers do once their ps is gone (ChiefFailure). A task reads the mark found when it
began as an earlier run's, since this run's chief removes it as it begins; but a ps whose mark from before it
began still stands while the chief's address has refused connections for --startup_timeout_secs takes it as
this run's: a chief that failed before this ps started (refused at its start, say) ends its ps tasks too.
"""

import concurrent.futures
import threading
import time
from collections.abc import Callable

import tensorflow as tf
from absl import logging

from ps_trainer.cluster import model_dir as layout
from ps_trainer.cluster import peers, spec
from ps_trainer.input import storage

WAIT_SLICE_SECS = 0.2


def _done_queue(ps_task: int, num_workers: int):
    with tf.compat.v1.device(f"/job:{spec.PS}/task:{ps_task}"):
        return tf.queue.FIFOQueue(
            capacity=4 * num_workers, dtypes=[tf.int32], shapes=[[]],
            shared_name=f"ps_shutdown_queue_{ps_task}", name=f"ps_shutdown_queue_{ps_task}")


MARK_CHECK_SECS = 5.0
# How long a finished replica waits for the session that told the ps tasks to close (report_done).
CLOSE_GRACE_SECS = 2.0


def mark_done(model_dir: str, replica: int, global_step: int, train_steps: int, num_epochs: int = 0) -> None:
    """Records in model_dir that `replica` finished a run to train_steps (or --num_epochs, when given) at
    global_step (written whole, then renamed)."""
    epochs = f" num_epochs={num_epochs}" if num_epochs else ""
    storage.write_whole(layout.done_mark(model_dir, replica),
                        f"global_step={global_step} train_steps={train_steps}{epochs}\n")


def chief_finished_step(model_dir: str | None, train_steps: int, num_epochs: int = 0) -> int | None:
    """The global step at which the chief finished a run to train_steps, by its mark; else None."""
    return finished_step(model_dir, 0, train_steps, num_epochs)


def _mark(path: str, since: float | None = None) -> tuple[int, int, int] | None:
    """A done mark's (global_step, train_steps, num_epochs); None if there is none, it is unreadable, or it was
    written before `since` (time.time()), when given."""
    try:
        if since is not None and tf.io.gfile.stat(path).mtime_nsec < since * 1e9:
            return None
        with tf.io.gfile.GFile(path) as mark:
            fields = dict(field.split("=", 1) for field in mark.read().split())
        return int(fields["global_step"]), int(fields["train_steps"]), int(fields.get("num_epochs", 0))
    except (tf.errors.NotFoundError, ValueError, KeyError):
        return None


def finished_step(model_dir: str | None, replica: int, train_steps: int, num_epochs: int = 0) -> int | None:
    """The global step at which `replica` finished a run to train_steps (a run with --num_epochs: to
    its epochs or train_steps, whichever came first), by its mark; else None."""
    mark = _mark(layout.done_mark(model_dir, replica)) if model_dir else None
    if mark is None or mark[1:] != (train_steps, num_epochs):
        return None
    return mark[0] if mark[0] >= train_steps or num_epochs else None


def ended_since(model_dir: str, replica: int, train_steps: int, since: float) -> int | None:
    """The global step in `replica`'s mark of a run to train_steps written at `since` (time.time()) or later,
    reached or not: an Estimator program's training also ends where its input runs out or an early-stopping
    hook stops it. None without such a mark (a mark written before `since` is an earlier run's)."""
    mark = _mark(layout.done_mark(model_dir, replica), since)
    return mark[0] if mark and mark[1] == train_steps else None


def mark_chief_failed(model_dir: str, reason: str) -> None:
    """Records in model_dir that the chief ended in a permanent error, for `reason` (written whole, then renamed;
    the time makes each mark differ from any earlier one)."""
    storage.write_whole(layout.chief_failed(model_dir), f"{time.time():.6f} {reason}\n")


def clear_chief_failed(model_dir: str) -> None:
    """Removes an earlier run's mark that its chief failed, as this run's chief begins."""
    try:
        tf.io.gfile.remove(layout.chief_failed(model_dir))
    except tf.errors.NotFoundError:
        pass


class ChiefFailure:
    """Whether the chief of this run ended in a permanent error: its mark in model_dir, other than the one there
    when this watch began (an earlier run's)."""

    def __init__(self, model_dir: str | None):
        self.model_dir = model_dir
        self._earlier = self._read()

    def _read(self) -> str | None:
        if not self.model_dir:
            return None
        try:
            with tf.io.gfile.GFile(layout.chief_failed(self.model_dir)) as mark:
                return mark.read()
        except tf.errors.NotFoundError:
            return None

    def reason(self) -> str | None:
        """The chief's one-line reason, once it marked a permanent error since this watch began; else None."""
        text = self._read()
        return _reason_in(text) if text and text != self._earlier else None

    def earlier_standing(self) -> str | None:
        """The reason of the mark there when this watch began, while it is still there (no chief began since)."""
        return _reason_in(self._earlier) if self._earlier and self._read() == self._earlier else None


def _reason_in(mark: str) -> str:
    return mark.split(" ", 1)[-1].strip()


def marked_done(model_dir: str | None, replicas, train_steps: int, num_epochs: int = 0) -> set[int]:
    """The replicas (of those given) whose mark in model_dir says they finished a run to train_steps
    (and num_epochs)."""
    return {replica for replica in replicas if finished_step(model_dir, replica, train_steps, num_epochs) is not None}


def join(model_dir: str, replica: int, address: str) -> None:
    """Records in model_dir that a worker joined the running job as `replica`, at address."""
    storage.write_whole(layout.member(model_dir, replica), f"address={address}\n")


def held_elsewhere(model_dir: str, replica: int, address: str,
                   probe: Callable[[str], bool] = peers.is_listening) -> str | None:
    """The address of another live worker that joined as `replica` (a second joiner given the same
    --task_index), else None. A record of this address, or of one that serves no more (a joiner
    restarted elsewhere), is not another's."""
    other = joined(model_dir).get(replica)
    return other if other and other != address and probe(other) else None


def joined(model_dir: str | None) -> dict[int, str]:
    """The workers that joined the job since it started: replica index -> host:port."""
    if not model_dir or not tf.io.gfile.isdir(layout.members_dir(model_dir)):
        return {}
    members = {}
    for name in tf.io.gfile.listdir(layout.members_dir(model_dir)):
        replica = layout.replica_of(name)
        if replica is None:
            continue  # a member being written (.tmp)
        try:
            with tf.io.gfile.GFile(layout.member(model_dir, replica)) as record:
                members[replica] = record.read().strip().removeprefix("address=")
        except tf.errors.NotFoundError:
            continue
    return members


class Roll:
    """One ps's roll of the training replicas it waits for: its cluster's, and those that joined since.
    A replica is off the roll once done (told, or marked in model_dir), or once the chief is done and
    the replica's address has refused connections for gone_secs. A chief failure mark there when the roll began
    is this run's once the chief's address has refused connections for chief_start_secs while it stands."""

    def __init__(self, cluster: spec.ClusterConfig, model_dir: str | None, train_steps: int, num_epochs: int = 0,
                 gone_secs: float = 60.0, probe: Callable[[str], bool] = peers.is_listening,
                 clock: Callable[[], float] = time.monotonic, chief_start_secs: float = 600.0):
        self.who = f"ps {cluster.task_index}"
        self.addresses = cluster.replica_addresses()
        self.model_dir, self.train_steps, self.num_epochs = model_dir, train_steps, num_epochs
        self.gone_secs, self.probe, self.clock = gone_secs, probe, clock
        self.chief_start_secs = chief_start_secs
        self._chief_silent_since: float | None = None
        self.done: set[int] = set()
        self.gone: set[int] = set()
        self.silent_since: dict[int, float] = {}
        self.chief_failure = ChiefFailure(model_dir)
        self.chief_failed: str | None = None  # the chief's reason, once it ended in a permanent error unfinished

    def pending(self) -> set[int]:
        return set(self.addresses) - self.done - self.gone

    def reported(self, replica: int) -> None:
        """`replica` told this ps it is done."""
        self.done.add(replica)
        logging.info("%s: training replica %d finished; waiting for %s", self.who, replica,
                     sorted(self.pending()) or "nobody")

    def _earlier_failure_stands(self) -> str | None:
        """The failure mark found when the roll began, once the chief's address has refused connections for
        chief_start_secs while the mark stood (a chief that begins removes it): no chief of this run is coming."""
        earlier = self.chief_failure.earlier_standing()
        if earlier is None or 0 not in self.addresses or self.probe(self.addresses[0]):
            self._chief_silent_since = None
            return None
        now = self.clock()
        if self._chief_silent_since is None:
            self._chief_silent_since = now
        if now - self._chief_silent_since < self.chief_start_secs:
            return None
        logging.warning("%s: the chief (%s) has refused connections for %.0f s, and model_dir's mark that it failed "
                        "still stands: taking that mark as this run's", self.who, self.addresses[0],
                        now - self._chief_silent_since)
        return earlier

    def over(self) -> bool:
        """No replica is left to wait for, or the chief ended in a permanent error: nothing more will train."""
        return not self.pending() or self.chief_failed is not None

    def check(self) -> None:
        """Reads model_dir's members and marks, and, once the chief is done, probes the replicas left."""
        for replica, address in joined(self.model_dir).items():
            if replica not in self.addresses:
                self.addresses[replica] = address
                logging.info("%s: training replica %d joined the job at %s; waiting for it too", self.who, replica,
                             address)
        marked = marked_done(self.model_dir, self.pending(), self.train_steps, self.num_epochs)
        if marked:
            self.done |= marked
            logging.info("%s: training replica(s) %s finished (marked in model_dir); "
                         "waiting for %s", self.who, sorted(marked), sorted(self.pending()) or "nobody")
        if 0 not in self.done:  # a chief that fails once done (in its export, say) trained to the end
            self.chief_failed = self.chief_failure.reason() or self._earlier_failure_stands()
        left = sorted(self.pending())
        if 0 not in self.done or not left:
            return
        now = self.clock()
        with concurrent.futures.ThreadPoolExecutor(min(len(left), 32)) as pool:  # hosts gone time out at once
            serving = dict(zip(left, pool.map(self.probe, [self.addresses[replica] for replica in left])))
        for replica in left:
            if serving[replica]:
                self.silent_since.pop(replica, None)
                continue
            since = self.silent_since.setdefault(replica, now)
            if now - since >= self.gone_secs:
                self.gone.add(replica)
                logging.warning("%s: training replica %d (%s) has served nothing for %.0f s since the chief "
                                "finished: it left the job; not waiting for it (waiting for %s)", self.who, replica,
                                self.addresses[replica], now - since, sorted(self.pending()) or "nobody")


def wait_for_every_replica(server, cluster: spec.ClusterConfig, model_dir: str | None, train_steps: int,
                           stop: threading.Event, num_epochs: int = 0, gone_secs: float = 60.0,
                           chief_start_secs: float = 600.0) -> Roll:
    """The ps's verb: blocks until every training replica on the Roll is off it, the chief ended in a permanent
    error, or `stop` is set (some are pending then); returns the Roll. It reads model_dir at once, then every
    MARK_CHECK_SECS.

    The dequeue blocks in a helper thread while this thread waits on events, so signal handlers
    run. At the end, closing the queue ends the blocked dequeue; the helper is always joined, since
    a process that exits with a thread inside a TensorFlow call aborts.
    """
    graph = tf.Graph()
    with graph.as_default():
        queue = _done_queue(cluster.task_index, cluster.num_replicas)
        dequeue, close = queue.dequeue(), queue.close(cancel_pending_enqueues=True)
    roll = Roll(cluster, model_dir, train_steps, num_epochs, gone_secs, chief_start_secs=chief_start_secs)
    told = []  # replicas the queue named, for this thread to enter on the roll
    with tf.compat.v1.Session(server.target, graph=graph, config=spec.session_config(cluster)) as sess:

        def drain():
            try:
                while True:
                    told.append(int(sess.run(dequeue)))
            except tf.errors.OutOfRangeError:
                pass  # closed at the end

        drainer = threading.Thread(target=drain, name="ps_shutdown_queue")
        drainer.start()
        next_check = time.monotonic()
        while not stop.is_set():
            while told:
                roll.reported(told.pop(0))
            if time.monotonic() >= next_check:
                roll.check()
                next_check = time.monotonic() + MARK_CHECK_SECS
            if roll.over():
                break
            drainer.join(WAIT_SLICE_SECS)
        sess.run(close)
        drainer.join()
    return roll


def report_done(server, cluster: spec.ClusterConfig, model_dir: str | None, global_step: int, train_steps: int,
                num_epochs: int = 0, timeout_secs: float = 30.0) -> bool:
    """A finished replica's verb: marks it done in model_dir, then tells every ps. False if telling
    them is still under way after the timeout (the ps tasks also read the mark, so none is left waiting),
    or if the session that told them is still closing CLOSE_GRACE_SECS later.

    A session to a ps that is gone can wait long in creation, and in its close (a ps that read the mark
    and exited before this replica's word reached it): it runs in a daemon thread, never keeping this
    process alive; the caller must then leave without the interpreter's shutdown.
    """
    if model_dir:
        mark_done(model_dir, cluster.replica_index, global_step, train_steps, num_epochs)
    tried = threading.Event()
    thread = threading.Thread(target=_tell_every_ps, args=(server, cluster, timeout_secs, tried), daemon=True)
    thread.start()
    if not tried.wait(timeout_secs + 5):
        logging.warning("%s: gave up telling the ps tasks it is done (they read its mark in model_dir)",
                        cluster.task_name)
        return False
    thread.join(CLOSE_GRACE_SECS)
    if thread.is_alive():
        logging.info("%s: told the ps tasks it is done; not waiting longer for the session that told them to "
                     "close (a ps that is gone can hold it)", cluster.task_name)
        return False
    return True


def _tell_every_ps(server, cluster: spec.ClusterConfig, timeout_secs: float, tried: threading.Event) -> None:
    """Tells every ps that this worker is done, sets `tried`, then closes its session. A ps that is gone
    already is logged, not fatal."""
    graph = tf.Graph()
    with graph.as_default():
        enqueues = [_done_queue(ps, cluster.num_replicas).enqueue(tf.constant(cluster.replica_index))
                    for ps in range(cluster.num_ps)]
    options = tf.compat.v1.RunOptions(timeout_in_ms=int(timeout_secs * 1000))
    with tf.compat.v1.Session(server.target, graph=graph, config=spec.session_config(cluster)) as sess:
        try:
            for ps, enqueue in enumerate(enqueues):
                try:
                    sess.run(enqueue, options=options)
                except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
                        tf.errors.AbortedError, tf.errors.CancelledError) as err:
                    logging.warning("could not tell ps %d that %s is done: %s", ps, cluster.task_name,
                                    err.message.splitlines()[0])
        finally:
            tried.set()
