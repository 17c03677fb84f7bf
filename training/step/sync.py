"""Synchronous training: SyncReplicasOptimizer and the rules that make it safe in a cluster whose
tasks fail and come back.

- The sync branch of the train op (`wrap_optimizer`, `hooks`): gradients of --replicas_to_aggregate
  replicas averaged per step, the rest (backup workers' late ones) dropped as stale.
- The token rule (SyncReplicasHook): num_tokens=0, so no worker, the chief included, starts step k+1
  before step k's update is applied; and one gradient per worker per round, across sessions and
  restarts, so a chief whose peer is down cannot fill a round alone.
- The queue close (CloseQueueAtEndHook): the token queue is closed only at the real end, which
  wakes workers waiting for a round that will never come.
- The grace period (STOP_GRACE_SECS): how long a closing session waits for the chief's aggregation
  thread, blocked on gradients that will never come once training is over.
"""

import threading
from typing import NamedTuple

import numpy as np
import tensorflow as tf
from absl import logging

from ps_trainer.cluster.clock import SYSTEM
from ps_trainer.training import checkpoints, log_lines

v1 = tf.compat.v1
# MonitoredSession waits this long for the chief's queue-runner thread before closing the session,
# which cancels its wait for gradients. TensorFlow's default is 120 s.
STOP_GRACE_SECS = 0.5
# How often a worker that gave back a second token of a sync round checks whether the round is done.
ROUND_POLL_SECS = 0.05
# Tokens no round has (negative: minus the wake's number, counted on the ps by `sync_wakes`): put in
# the token queue, one per worker, when the chief's aggregation fails, to wake the workers (the chief
# among them) blocked waiting for a token, so that they re-create their sessions. A wake token older
# than the session that takes it (left by a worker that was down) is dropped, not obeyed: re-creating
# a session again would leave its pushed gradient and its aggregation behind in the ps. "Older" is
# read from that one counter on the ps, never from clocks: hosts whose clocks disagree agree on it.


# How long the chief's take of an accumulator's leftover gradients may wait before a zero gradient goes
# in to complete a take queued ahead of it (_Emptying).
TAKE_WAIT_SECS = 2
# Zero gradients per aggregated replica after which the chief gives up emptying an accumulator.
MAX_ZERO_PUSHES_PER_REPLICA = 10


def wrap_optimizer(optimizer, cluster, train):
    return v1.train.SyncReplicasOptimizer(optimizer, replicas_to_aggregate=train.replicas_to_aggregate,
                                          total_num_replicas=cluster.num_replicas)


def hooks(sync_optimizer, train_op, cluster, train, stop_requested=None):
    """(hooks of every worker, hooks of the chief only) for a train op built with a wrapped optimizer;
    `stop_requested()` ends a worker's wait for a round that is missing a peer's gradient."""
    every_worker = [SyncReplicasHook(sync_optimizer, cluster.is_chief, num_tokens=0, train_op=train_op,
                                     num_workers=cluster.num_replicas, replica_index=cluster.replica_index,
                                     stop_requested=stop_requested)]
    chief_only = [CloseQueueAtEndHook(sync_optimizer._sync_token_queue,  # noqa: SLF001  (SyncReplicasOptimizer's state, which it does not expose)
                                      train.train_steps)]
    return every_worker, chief_only


class CloseQueueAtEndHook(v1.train.SessionRunHook):
    """Closes a queue when the session ends with training over (the global step at last_step).

    Used on the sync chief for SyncReplicasOptimizer's token queue: a non-chief worker that has
    already sent its gradient for a step that will never be aggregated is blocked on that queue.
    Closing it turns the wait into OutOfRangeError, which MonitoredSession takes as a clean end.
    Only then: a closed queue stays closed for as long as its ps runs, so a chief that stops
    early (preempted, a failed session) must leave it open for the rounds still to come.
    """

    def __init__(self, queue, last_step):
        self._close_op = queue.close(cancel_pending_enqueues=True)
        self._last_step = last_step

    def begin(self):
        self._global_step = v1.train.get_global_step()

    def end(self, session):
        if int(session.run(self._global_step)) >= self._last_step:
            session.run(self._close_op)


class SyncReplicasHook(v1.train.SessionRunHook):
    """SyncReplicasOptimizer's session hook, from its public API, with a chief queue runner that ends
    quietly, and at most one gradient per worker in a round.

    As TensorFlow's own hook: after each session is created it checks the variables are ready, runs
    the local init (the chief's also sets up the accumulators), adds num_tokens initial tokens, and
    on the chief starts the queue runner that aggregates gradients and hands out tokens. Unlike it,
    the queue runner takes CancelledError as its end: when training is over that thread is blocked
    waiting for gradients that will never come, the session's close cancels the wait, and TF's
    runner would report that as an error (a traceback on every clean sync run). And it never closes
    the token queue: TF's runner closes it when its session stops, which is how TF wakes the chief
    when aggregation fails (a ps restarting), but a closed queue ends every worker's next wait for a
    token with OutOfRangeError, which MonitoredSession takes for the end of the input: workers would
    report "finished" far short of --train_steps (the queue is closed only at the real end, by
    CloseQueueAtEndHook). Instead, a failed aggregation puts one wake token per worker in the queue;
    a step that takes one newer than its session raises AbortedError, and MonitoredSession
    re-creates the session.

    One gradient per round: each completed round puts one token per worker into a single shared
    queue, and a step pushes a gradient, then takes a token (the round its next gradient joins).
    A worker that takes a second token of the round its last gradient joined (left by a worker
    that died, or taken before a slower peer got to it) would push a second gradient into that
    round, and a chief whose peer is down would then fill every round alone and "train in sync"
    by itself. This hook sees the token each step took (the train op's value); on a second token
    of the same round it gives it back to the queue, waits until that round is applied, and takes
    a token of a newer round. A stalled round then stays stalled (the watchdog says why) until the
    missing worker is back, or until `stop_requested()`.

    One gradient per round across sessions: a worker whose session is re-created (or whose process
    restarts) while it waits for a token has pushed its gradient already, and a new session starts
    at the global step, the same round: its next push would count twice. So every push also
    records, on the ps that holds the global step, the round it joined (`sync_round_pushed`, one
    entry per replica, written once the accumulators have the gradient). A new session that finds
    its entry at the current round sends its next gradient one round stale: the accumulators drop
    it, and the worker goes on to wait for its token as before. The record is no checkpoint's: a ps
    restarted comes back without it (it is set up again), and a restore clears it (the rounds are
    numbered anew). A restore also empties the accumulators and opens them to any round until the
    chief's sync init (`_before_restore`).
    """

    def __init__(self, sync_optimizer, is_chief, num_tokens, train_op, num_workers, replica_index,
                 stop_requested=None, clock=SYSTEM):
        self._optimizer = sync_optimizer
        self._clock = clock  # what its wait for a round polls on (cluster/clock.py)
        self._is_chief = is_chief
        self._num_workers = num_workers
        self._replica = replica_index
        with v1.device(v1.train.get_global_step().device):
            self._pushed = v1.Variable(tf.fill([num_workers], tf.constant(-1, tf.int64)), trainable=False,
                                       collections=[], name="sync_round_pushed")
            self._wakes = v1.Variable(tf.constant(0, tf.int64), trainable=False, collections=[], name="sync_wakes")
            # The end of training's close, for any worker that finds it over (--num_epochs): wakes
            # every worker waiting for a round, as CloseQueueAtEndHook does at --train_steps.
            queue = sync_optimizer._sync_token_queue  # noqa: SLF001  (SyncReplicasOptimizer's state, which it does not expose)
            self.close_token_queue = queue.close(cancel_pending_enqueues=True)
            self._queue_closed = queue.is_closed()
        self._num_tokens = num_tokens
        self._token = train_op  # SyncReplicasOptimizer's train op assigns the token taken: its value
        self._stop_requested = stop_requested or (lambda: False)
        self._last_token = None
        self._take_token = None
        # True from a session's start until its first step when that step's gradient goes stale (the
        # worker pushed into the round before this session): what that step trained is dropped.
        self.drops_next_push = False

    @property
    def round_applied(self) -> int | None:
        """After a step's run (this hook's after_run): the global step at which the round its gradient joined
        was applied, the token it holds (None before the first). The input queue's report of the step's
        examples carries it: ps 0, restored to a step before it, drops the report and the examples are trained
        again."""
        return self._last_token

    def begin(self):
        # Called for every MonitoredTrainingSession: build the ops once. A session whose creation
        # failed leaves the graph finalized, and the next session reuses these hooks.
        if self._take_token is not None:
            return
        opt = self._optimizer
        self._ready_op = opt.ready_for_local_init_op
        if self._is_chief:
            self._local_init_op = opt.chief_init_op
            self._init_tokens_op = opt.get_init_tokens_op(self._num_tokens)
            self._aggregate_op, = opt.get_chief_queue_runner().enqueue_ops
        else:
            self._local_init_op = opt.local_step_init_op
            self._init_tokens_op = None
        local_step = opt._local_step  # noqa: SLF001  (SyncReplicasOptimizer's state, which it does not expose)
        queue = opt._sync_token_queue  # noqa: SLF001  (SyncReplicasOptimizer's state, which it does not expose)
        self._global_step = v1.train.get_global_step()
        with v1.device(self._global_step.device):  # where SyncReplicasOptimizer puts its queue ops
            self._give_back = queue.enqueue(local_step)
            token = queue.dequeue()
            # A failed aggregation can take the round's gradients with it (a restarted ps's
            # accumulators come back empty): the records of who pushed into it are cleared before
            # anyone is woken, so every worker pushes again. A surviving accumulator then averages
            # a worker's gradient twice in that one round; a round nobody re-pushes never completes.
            # This op needs only the queue's ps: it must run while another ps is down.
            with tf.control_dependencies([self._pushed.initializer]):
                wake = self._wakes.assign_add(1)
                self._wake_workers = queue.enqueue_many(tf.fill([self._num_workers], -wake))
            self._wakes_set_up = self._wakes.is_initialized()
            self._read_wakes = self._wakes.read_value()
        # An aggregation that failed past its take leaves the accumulators a round ahead, dropping
        # the re-pushed gradients as stale: each is set back to the global step's round before the
        # wake, one by one, so that an accumulator on a ps that is down holds up no other.
        self._back_to_round, self._reopen = [], []
        variables = {var.name: var for var in v1.global_variables() + v1.trainable_variables()}
        for accumulator, device in opt._accumulator_list if self._is_chief else ():  # noqa: SLF001  (SyncReplicasOptimizer's state, which it does not expose)
            with v1.device(device):
                self._back_to_round.append(accumulator.set_global_step(self._global_step))
                self._reopen.append(_Emptying(accumulator.num_accumulated(), accumulator.take_grad(1),
                                              _zero_push(accumulator, variables), accumulator.set_global_step(0),
                                              MAX_ZERO_PUSHES_PER_REPLICA * opt._replicas_to_aggregate))  # noqa: SLF001  (SyncReplicasOptimizer's state, which it does not expose)
        if self._is_chief:
            v1.add_to_collection(checkpoints.RESET_BEFORE_RESTORE, self._before_restore)
        self._take_token = v1.assign(local_step, token)  # on this worker, with its local step
        self._read_local_step = local_step.read_value()
        self._local_step_value = v1.placeholder(tf.int64, [], name="sync_local_step_value")
        self._set_local_step = v1.assign(local_step, self._local_step_value)
        # The token's dequeue waits for this worker's pushes to the accumulators; so does the record.
        pushes = self._token.op.inputs[1].op.control_inputs
        with v1.device(self._pushed.device):
            self._pushed_set_up = self._pushed.is_initialized()
            self._read_every_push = self._pushed.read_value()
            self._read_pushed = self._read_every_push[self._replica]
            self._round_of_push = v1.placeholder(tf.int64, [], name="sync_round_of_push")
            with tf.control_dependencies(pushes):
                self._record_push = self._pushed.scatter_update(
                    tf.IndexedSlices(tf.reshape(self._round_of_push, [1]), tf.constant([self._replica]))).op

    def after_create_session(self, session, coord):
        not_ready = session.run(self._ready_op)
        if len(not_ready):
            raise RuntimeError(f"variables not initialized before the sync replicas init: {not_ready}")
        session.run(self._local_init_op)
        self._last_token = int(session.run(self._read_local_step))
        if not session.run(self._pushed_set_up):
            session.run(self._pushed.initializer)
        if not session.run(self._wakes_set_up):
            session.run(self._wakes.initializer)
        if self._is_chief and self._round_taken_by_a_lost_aggregation(session):
            self.wake_workers(session)  # before this session's wake count: the chief's own wake token is old
        self.drops_next_push = int(session.run(self._read_pushed)) == self._last_token
        if self.drops_next_push:
            session.run(self._set_local_step, {self._local_step_value: self._last_token - 1})
            logging.info("this worker pushed its gradient for sync round %d already (before this session): its next "
                         "one goes as stale and is dropped, so that the round counts it once", self._last_token)
        self._wakes_before_session = int(session.run(self._read_wakes))
        if self._init_tokens_op is not None:
            session.run(self._init_tokens_op)
        if self._is_chief:
            thread = threading.Thread(target=self._aggregate, args=(session, coord), name="sync_aggregation",
                                      daemon=True)
            coord.register_thread(thread)  # joined, then cancelled by the session's close, at the end
            thread.start()

    def _round_taken_by_a_lost_aggregation(self, session) -> bool:
        """Whether the current round's gradients on record are no longer in the accumulators: the last
        chief's aggregation took them and ended with it (killed between its take and its apply). Every
        worker that pushed would then send its next gradient as stale, and the round never completes
        (seen: a sync run stalled 80 s after its chief was killed, until a gRPC error re-made the
        sessions). Read before the new aggregation starts."""
        if not self._reopen:
            return False
        pushes = np.asarray(session.run(self._read_every_push))
        on_record = int(np.sum(pushes == self._last_token))
        held = min(int(count) for count in session.run([emptying.count for emptying in self._reopen]))
        if on_record <= held:
            return False
        logging.warning("sync round %d: %d gradient(s) on record, %d in the accumulators: the last chief's "
                        "aggregation took them and ended with it; clearing the records and waking the workers to "
                        "push them again", self._last_token, on_record, held)
        return True

    def _before_restore(self, session):
        """Called by the chief's saver just before it restores a checkpoint over the ps tasks (a ps
        restarted), which moves the global step back: clears the records of who pushed, and on a ps
        that kept running, empties each accumulator and opens it to any round.

        Opened, because the other workers step as soon as the restore ends, before this chief's sync
        init sets the accumulators to the restored step: one still at a later round dropped a
        worker's gradient as stale while a restarted ps's kept it, and the round never completed
        (seen: a 2-minute stall in the two-ps drill). Emptied, because gradients left from a round
        the restore undoes would complete the next round there alone, while the restarted ps's
        accumulators still wait: the aggregation then waits on one ps only, and no one notices when
        another restarts (seen: a 2-minute stall in the sync chaos drill).
        """
        session.run(self._pushed.initializer)
        for emptying in self._reopen:
            emptying.empty(session)
            session.run(emptying.reopen)

    def _aggregate(self, session, coord):
        """The chief's aggregation loop: a round each time enough gradients have arrived."""
        try:
            while not coord.should_stop():
                session.run(self._aggregate_op)
        except (tf.errors.OutOfRangeError, tf.errors.CancelledError):
            return  # the session closed, or the queue closed at the end of training
        except tf.errors.OpError as err:
            logging.warning("sync aggregation failed (%s: %s); clearing the round's push records and waking the "
                            "workers to re-create their sessions",
                            type(err).__name__, log_lines.error_cause(err.message, 200))
            try:
                self.wake_workers(session)
            except RuntimeError:  # "Attempted to use a closed Session": its step failed too, and closed it
                pass  # the workers' own calls to the ps fail the same way, and re-create their sessions

    def wake_workers(self, session):
        """After a failed aggregation: sets the accumulators it can reach back to the global step's
        round, clears the records of who pushed into the round, then puts one wake token per worker
        in the token queue."""
        for back in self._back_to_round:
            try:
                session.run(back, options=v1.RunOptions(timeout_in_ms=5000))
            except tf.errors.OpError:
                pass  # its ps is down: it comes back empty, set to the round by the chief's next session
        try:
            session.run(self._wake_workers, options=v1.RunOptions(timeout_in_ms=10000))
        except tf.errors.OpError:
            pass  # the queue's own ps is down: every wait on it fails by itself

    def before_run(self, run_context):
        return v1.train.SessionRunArgs([self._token, self._record_push], {self._round_of_push: self._last_token})

    def after_run(self, run_context, run_values):
        self.drops_next_push = False
        token = self._awake(run_context.session, int(run_values.results[0]))
        if token == self._last_token:
            token = self._give_back_and_wait(run_context, token)
        self._last_token = token

    def _give_back_and_wait(self, run_context, token):
        """Returns the second token of round `token`, waits until that round is applied, and takes a
        token of the current round (dropping tokens of rounds already applied)."""
        session = run_context.session
        try:
            session.run(self._give_back)
        except (tf.errors.OutOfRangeError, tf.errors.CancelledError):
            run_context.request_stop()  # the chief closed the queue: training is over
            return token
        logging.log_every_n_seconds(
            logging.INFO, "took a second token of sync round %d: gave it back; waiting for the round's "
            "other gradients before sending another", 60, token)
        # Round `token` is in progress while the global step equals it. A step below it means the
        # chief restored an older checkpoint (the rounds are numbered anew): waiting for `token` to
        # pass would wait on this worker's own gradients. A wake since this session began means the
        # round failed with its aggregation and will not pass: this worker takes no token meanwhile,
        # so it reads the wake count itself (seen in the chaos drill: a chief polling for 2 minutes).
        while True:
            step, wakes, closed = session.run([self._global_step, self._read_wakes, self._queue_closed])
            if int(step) != token:
                break
            if closed:  # training is over: the round will not come
                run_context.request_stop()
                return token
            if int(wakes) > self._wakes_before_session:
                raise tf.errors.AbortedError(None, None, "woken while waiting for sync round %d: the chief's "
                                             "aggregation failed; re-creating the session" % token)
            if self._stop_requested():
                run_context.request_stop()
                return token
            self._clock.sleep(ROUND_POLL_SECS)
        while True:
            token = self._awake(session, int(session.run(self._take_token)))
            if token >= int(session.run(self._global_step)):
                return token


    def _awake(self, session, token: int) -> int:
        """The token of a round; on a wake token newer than this session, AbortedError (which
        re-creates the session); an older one is dropped and a token of a round taken instead."""
        while token < 0:
            if -token > self._wakes_before_session:
                raise tf.errors.AbortedError(None, None, "woken: the chief's sync aggregation failed (a ps "
                                             "task restarted?); re-creating the session")
            token = int(session.run(self._take_token))
        return token


def _zero_push(accumulator, variables):
    """A zero gradient that every round accepts (its local step is the largest), shaped from the accumulator
    (dense, of a fully defined shape) or from its variable (SyncReplicasOptimizer names each accumulator
    after its variable); None when neither says the shape."""
    attr = accumulator.accumulator_ref.op.get_attr
    var = variables.get(attr("shared_name").decode().removesuffix("/grad_accum"))
    last = tf.constant(tf.int64.max, tf.int64)
    if isinstance(accumulator, v1.SparseConditionalAccumulator):
        if var is None:
            return None
        row = tf.zeros(tf.concat([[1], tf.shape(var, out_type=tf.int64)[1:]], 0), accumulator.dtype)
        return accumulator.apply_grad(tf.constant([0], tf.int64), row, local_step=last)
    shape = tf.TensorShape(attr("shape"))
    if not shape.is_fully_defined():
        if var is None:
            return None
        shape = tf.shape(var)
    return accumulator.apply_grad(tf.zeros(shape, accumulator.dtype), local_step=last)


class _Emptying(NamedTuple):
    """The ops the chief's restore uses to empty one accumulator and open it to any round."""
    count: tf.Tensor
    take: tf.Tensor
    zero_push: tf.Operation
    reopen: tf.Operation
    max_zero_pushes: int

    def empty(self, session):
        """Takes the gradients the accumulator holds.

        A take can be queued behind another that waits for a whole round: an aggregation step of an
        earlier session whose cancellation never reached this ps (as the logs read the one time it was
        seen, in the two-ps sync drill: the chief's restore waited three minutes, until gRPC closed the
        connection). Takes
        complete in order, so while this one waits, a zero gradient goes in every TAKE_WAIT_SECS until
        each take ahead has what it waits for; what they take goes to steps that are gone. Raises
        AbortedError (the chief re-creates its session) once max_zero_pushes have not emptied it.
        """
        pushes = 0
        while int(session.run(self.count)):
            done, failed = threading.Event(), []
            threading.Thread(target=_run_and_signal, args=(session, self.take, done, failed),
                             name="sync_empty_accumulator", daemon=True).start()
            while not done.wait(TAKE_WAIT_SECS):
                if self.zero_push is None or pushes >= self.max_zero_pushes:
                    raise tf.errors.AbortedError(None, None, f"the sync accumulator {self.take.op.inputs[0].op.name} "
                                                 f"was not emptied ({pushes} zero gradients); re-creating the session")
                logging.warning("emptying the sync accumulator %s before the restore: its take waits behind "
                                "another; a zero gradient goes in", self.take.op.inputs[0].op.name)
                session.run(self.zero_push)
                pushes += 1
            if failed:
                raise failed[0]


def _run_and_signal(session, fetch, done: threading.Event, failed: list):
    try:
        session.run(fetch)
    except Exception as err:  # raised again by the waiting thread
        failed.append(err)
    done.set()
