"""Synchronous training semantics on an in-process cluster, with exact numbers.

Each replica's graph is built with the trainer's own device setter and make_train_op; every
replica's loss is sum(var * g_i), so its gradient is exactly g_i.
"""

import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from ps_trainer import input as inputs
from ps_trainer import model
from ps_trainer.cluster import placement, spec
from tests.support import in_process_cluster, join_all, tf_session, wait_for
from ps_trainer.training import graph as train_graph
from ps_trainer.training import checkpoints, learning, session_loop, worker
from ps_trainer.training.step import single, sync
from ps_trainer.training.config import RunConfig, TrainConfig


v1 = tf.compat.v1
LEARNING_RATE = 0.5
INITIAL = [1.0, 2.0]
GRADIENTS = [[0.1, 0.3], [0.5, 0.7], [10.0, 20.0]]
# How long a test waits to see that a wrong step does not happen: an in-process step takes milliseconds.
NOTHING_HAPPENS_SECS = 1.5
# A plain run that blocks (on a queue or an accumulator) this long is a failure of the test's setup.
PLAIN_RUN_TIMEOUT_MS = 20000


class Replica:
    """One worker's graph and MonitoredTrainingSession on the in-process cluster."""

    def __init__(self, cluster_cfg, server, train_cfg):
        self.cluster = cluster_cfg
        self.train_cfg = train_cfg
        self.session_target = server.target
        self.graph = tf.Graph()
        with self.graph.as_default(), v1.device(placement.device_setter(cluster_cfg)):
            self.global_step = v1.train.get_or_create_global_step()
            self.var = v1.get_variable("var", initializer=tf.constant(INITIAL))
            loss = tf.reduce_sum(self.var * tf.constant(GRADIENTS[cluster_cfg.task_index]))
            optimizer = v1.train.GradientDescentOptimizer(LEARNING_RATE)
            self.train_op, hooks, chief_hooks, *_ = single.make_train_op(
                loss, optimizer, self.global_step, cluster_cfg, train_cfg)
            sync_hook, = (hook for hook in hooks if isinstance(hook, sync.SyncReplicasHook))
            self.sync_hook = sync_hook
            token_queue = sync_hook._optimizer._sync_token_queue
            accumulators = [acc for acc, _ in sync_hook._optimizer._accumulator_list]
            self.num_accumulated = [acc.num_accumulated() for acc in accumulators]
            # What a ps restarted under a round leaves: accumulators empty, at the round's step.
            taken = [acc.take_grad(1) for acc in accumulators]
            with tf.control_dependencies(taken):
                self.lose_the_round = tf.group(*(acc.set_global_step(0) for acc in accumulators))
            # What an aggregation that fails after its take leaves: accumulators empty, a round ahead.
            self.take_the_round = tf.group(*taken)
            # A token of round 1 left in the queue, as by a worker that died before taking it.
            self.leave_spare_token = token_queue.enqueue(tf.constant(1, tf.int64))
            # The record of this worker's push into round 0, as its step writes it once the push is in.
            self.record_a_push_of_round_0 = sync_hook._pushed.scatter_update(
                tf.IndexedSlices(tf.zeros([1], tf.int64), tf.constant([cluster_cfg.task_index])))
            config = spec.session_config(cluster_cfg)
            if not cluster_cfg.is_chief:
                session_loop.wait_for_chief_ready(server.target, config, 30, cluster_cfg.task_name,
                                           checkpoints.report_uninitialized())
            self.session = v1.train.MonitoredTrainingSession(
                master=server.target, is_chief=cluster_cfg.is_chief, hooks=hooks,
                chief_only_hooks=chief_hooks, config=config,
                stop_grace_period_secs=sync.STOP_GRACE_SECS)

    def restarted(self):
        """The same worker in a new process: a new graph and session, to the same server."""
        return Replica(self.cluster, self, self.train_cfg)

    @property
    def target(self):
        return self.session_target

    def close(self):
        if not self.session._is_closed():
            self.session.close()

    def step_in_thread(self, hooks=True):
        """One training step in a thread: through the MonitoredTrainingSession, or (hooks=False) a
        plain session to the same server, which runs the train op even after the last step."""
        outcome = {}

        def step():
            try:
                if hooks:  # a session re-created inside the run builds in the graph it belongs to
                    with self.graph.as_default():
                        self.session.run(self.train_op)
                else:
                    self.run(self.train_op)
                outcome["result"] = "stepped"
            except tf.errors.OutOfRangeError:
                outcome["result"] = "released"
            except tf.errors.CancelledError:
                outcome["result"] = "cancelled"  # its session was closed under it

        thread = threading.Thread(target=step, daemon=True)
        thread.start()
        return thread, outcome

    def run(self, op):
        with self.graph.as_default(), tf_session(self.session_target) as sess:
            sess.run(op, options=v1.RunOptions(timeout_in_ms=PLAIN_RUN_TIMEOUT_MS))

    def wake_workers(self):
        """What the chief's aggregation thread does when its take fails."""
        with self.graph.as_default(), tf_session(self.session_target) as sess:
            self.sync_hook.wake_workers(sess)

    def accumulated(self):
        with self.graph.as_default(), tf_session(self.session_target) as sess:
            return sess.run(self.num_accumulated)

    def read(self):
        """(global step, var) read through a plain session that runs no hooks and no train op."""
        with self.graph.as_default(), tf_session(self.session_target) as sess:
            step, value = sess.run([self.global_step, self.var])
        return int(step), value


@pytest.fixture
def sync_cluster():
    """Factory: an in-process cluster of 1 ps and `workers` workers, with one Replica per worker."""
    made = []

    def make(workers, replicas_to_aggregate, train_steps=100):
        servers, _, configs = in_process_cluster(num_workers=workers, num_ps=1)
        train_cfg = TrainConfig(train_steps=train_steps, sync_replicas=True,
                                replicas_to_aggregate=replicas_to_aggregate)
        replicas = []
        for cfg, server in zip(configs, servers):
            replica = Replica(cfg, server, train_cfg)
            replicas.append(replica)
            made.append(replica)
        return replicas

    yield make
    for replica in reversed(made):  # non-chief first; the chief's close releases any token waits
        replica.close()


@pytest.mark.servers
def test_a_sync_step_applies_the_exact_average_of_the_gradients(sync_cluster):
    chief, other = sync_cluster(workers=2, replicas_to_aggregate=2)
    join_all([chief.step_in_thread()[0], other.step_in_thread()[0]])
    step, value = chief.read()
    expected = np.array(INITIAL) - LEARNING_RATE * np.mean(GRADIENTS[:2], axis=0)
    assert step == 1
    np.testing.assert_allclose(value, expected, rtol=1e-6)
    # The step each worker's batch went in at: what the input queue's report of it carries.
    assert chief.sync_hook.round_applied == other.sync_hook.round_applied == 1


@pytest.mark.servers
def test_the_chief_cannot_complete_a_step_alone(sync_cluster):
    chief, other = sync_cluster(workers=2, replicas_to_aggregate=2)
    chief_thread, outcome = chief.step_in_thread()
    time.sleep(NOTHING_HAPPENS_SECS)  # elapsed time is the subject: nothing happens in it
    assert chief_thread.is_alive() and "result" not in outcome
    assert chief.read()[0] == 0
    join_all([other.step_in_thread()[0], chief_thread])
    assert chief.read()[0] == 1 and outcome["result"] == "stepped"


@pytest.mark.servers
def test_a_spare_token_does_not_let_the_chief_fill_a_round_alone(sync_cluster):
    chief, other = sync_cluster(workers=2, replicas_to_aggregate=2)
    join_all([chief.step_in_thread()[0], other.step_in_thread()[0]])  # round 0; each took a round-1 token
    chief.run(chief.leave_spare_token)
    # The chief sends its round-1 gradient and takes the spare token: a second gradient from it would
    # complete round 1 alone. It gives the token back and waits for the other worker instead.
    chief_thread, _ = chief.step_in_thread()
    time.sleep(NOTHING_HAPPENS_SECS)  # elapsed time is the subject: nothing happens in it
    assert chief_thread.is_alive() and chief.read()[0] == 1
    join_all([other.step_in_thread()[0], chief_thread])
    step, value = chief.read()
    expected = np.array(INITIAL) - 2 * LEARNING_RATE * np.mean(GRADIENTS[:2], axis=0)
    assert step == 2
    np.testing.assert_allclose(value, expected, rtol=1e-6)
    # The chief's run took the spare token (round 1) and read the global step at 1, but its batch went in at
    # step 2, when round 1 was applied: the step its input-queue report carries (ps 0 restored to 1 drops it).
    assert chief.sync_hook.round_applied == 2


@pytest.mark.servers
def test_a_worker_restarted_after_pushing_its_gradient_counts_once_in_that_round(sync_cluster):
    chief, other = sync_cluster(workers=2, replicas_to_aggregate=2)
    waiting, outcome = other.step_in_thread()  # pushes its round-0 gradient, then waits for a token
    wait_for_a_gradient(chief, "the other worker's round-0 gradient never reached the accumulators")
    other.close()  # its process dies while it waits; a new one starts at global step 0, round 0 again
    join_all([waiting])
    assert outcome["result"] == "cancelled"
    restarted = other.restarted()
    try:
        again, _ = restarted.step_in_thread()
        # A second round-0 gradient from it would complete round 0 without the chief's.
        time.sleep(NOTHING_HAPPENS_SECS)  # elapsed time is the subject: nothing happens in it
        assert again.is_alive() and chief.read()[0] == 0
        join_all([chief.step_in_thread()[0], again])
    finally:
        restarted.close()
    step, value = chief.read()
    assert step == 1
    np.testing.assert_allclose(value, np.array(INITIAL) - LEARNING_RATE * np.mean(GRADIENTS[:2], axis=0), rtol=1e-6)


@pytest.mark.servers
@pytest.mark.parametrize("chief_clock_behind_secs", [0, 600])
def test_a_round_lost_with_a_failed_aggregation_is_pushed_again_by_every_worker(sync_cluster, monkeypatch,
                                                                               chief_clock_behind_secs):
    # Seen under load: a ps restarted under round 0, both workers had pushed into it, the chief's
    # take failed, and in their new sessions both found their round-0 push on record and sent
    # stale gradients: round 0 could never complete. And the wake tokens once carried the chief's
    # wall clock: with the chief's clock behind, the other worker took them for old and slept on.
    chief, other = sync_cluster(workers=2, replicas_to_aggregate=2)
    waiting = other_pushes_round_0_and_the_chief_stops(chief, other)
    chief.run(chief.lose_the_round)
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() - chief_clock_behind_secs)
    chief.wake_workers()
    monkeypatch.setattr(time, "time", real_time)
    a_restarted_chief_completes_round_0(chief, waiting)


def other_pushes_round_0_and_the_chief_stops(chief, other):
    """The other worker's step, waiting for its token once its round-0 gradient is in the accumulators;
    the chief closed (which ends its take, else first in line for the gradients)."""
    waiting, _ = other.step_in_thread()
    wait_for_a_gradient(chief, "the other worker's round-0 gradient never reached the accumulators")
    chief.close()
    return waiting


def wait_for_a_gradient(chief, failure, timeout=30):
    wait_for(lambda: min(chief.accumulated()) >= 1, timeout, failure)


def a_restarted_chief_completes_round_0(chief, waiting):
    """A new chief's step and the waiting worker's complete round 0 with the exact mean of both gradients."""
    chief = chief.restarted()
    try:
        join_all([chief.step_in_thread()[0], waiting], timeout=30)
    finally:
        chief.close()
    step, value = chief.read()
    assert step == 1
    np.testing.assert_allclose(value, np.array(INITIAL) - LEARNING_RATE * np.mean(GRADIENTS[:2], axis=0), rtol=1e-6)


@pytest.mark.servers
def test_after_an_aggregation_that_failed_past_its_take_a_woken_workers_push_counts(sync_cluster):
    # Seen in the link-cut drill: the take succeeded, the apply did not (the channel closed), so the
    # accumulators counted round 1 and dropped the re-pushed round-0 gradients as stale: a stall.
    chief, other = sync_cluster(workers=2, replicas_to_aggregate=2)
    waiting = other_pushes_round_0_and_the_chief_stops(chief, other)
    chief.run(chief.take_the_round)
    chief.wake_workers()  # the other worker re-creates its session and pushes round 0 again, before any new chief
    wait_for_a_gradient(chief, "the woken worker's round-0 gradient was dropped as stale")
    a_restarted_chief_completes_round_0(chief, waiting)


@pytest.mark.servers
def test_a_round_taken_by_an_aggregation_that_died_with_its_chief_is_pushed_again(sync_cluster):
    # Seen in the suite: the chief killed between its aggregation's take and its apply; both workers' pushes
    # of the round on record, none in the accumulators: each sent its next gradient as stale, and the round
    # stalled until a gRPC error re-made the sessions. The restarted chief now wakes the workers to push again.
    chief, other = sync_cluster(workers=2, replicas_to_aggregate=2)
    waiting = other_pushes_round_0_and_the_chief_stops(chief, other)
    chief.run(chief.record_a_push_of_round_0)  # the chief had pushed too; its aggregation took both, then died
    chief.run(chief.take_the_round)
    assert max(chief.accumulated()) == 0
    a_restarted_chief_completes_round_0(chief, waiting)


@pytest.mark.servers
def test_a_backup_workers_stale_gradient_is_dropped(sync_cluster):
    chief, second, backup = sync_cluster(workers=3, replicas_to_aggregate=2)
    join_all([chief.step_in_thread()[0], second.step_in_thread()[0]])
    after_round = np.array(INITIAL) - LEARNING_RATE * np.mean(GRADIENTS[:2], axis=0)
    np.testing.assert_allclose(chief.read()[1], after_round, rtol=1e-6)
    # The backup computed its gradient at step 0; step 1 is already applied, so it is stale.
    backup_thread, outcome = backup.step_in_thread()
    join_all([backup_thread])
    step, value = chief.read()
    assert step == 1 and outcome["result"] == "stepped"
    np.testing.assert_allclose(value, after_round, rtol=1e-6)


@pytest.mark.servers
def test_a_worker_waiting_for_a_token_is_released_when_the_chief_ends_at_the_last_step(sync_cluster):
    chief, other = sync_cluster(workers=2, replicas_to_aggregate=2, train_steps=1)
    join_all([chief.step_in_thread()[0], other.step_in_thread()[0]])  # round 0: the global step is 1, the last
    waiting, outcome = other.step_in_thread(hooks=False)  # a gradient for a round that will never come
    time.sleep(NOTHING_HAPPENS_SECS)  # elapsed time is the subject: nothing happens in it
    assert waiting.is_alive()
    started = time.monotonic()
    chief.close()
    join_all([waiting], timeout=15)
    assert outcome["result"] == "released"
    assert time.monotonic() - started < 10


@pytest.mark.servers
def test_a_chief_that_ends_short_of_the_last_step_leaves_the_token_queue_open(sync_cluster):
    # A closed token queue ends every later wait for a token with OutOfRangeError, which a
    # MonitoredSession takes for the end of the input: a worker would "finish" short of the last step.
    chief, other = sync_cluster(workers=2, replicas_to_aggregate=2, train_steps=100)
    waiting, outcome = other.step_in_thread()
    wait_for_a_gradient(chief, "the other worker's round-0 gradient never reached the accumulators")
    chief.close()  # as a chief preempted, or whose session failed, at global step 0
    time.sleep(NOTHING_HAPPENS_SECS)  # elapsed time is the subject: nothing happens in it
    assert waiting.is_alive() and "result" not in outcome
    other.run(other.leave_spare_token)  # the queue still takes tokens (a new chief's), and the worker goes on
    join_all([waiting], timeout=15)
    assert outcome["result"] == "stepped"


@pytest.mark.inprocess
def test_the_hooks_build_their_ops_once_so_a_second_session_works_in_a_finalized_graph():
    # A MonitoredTrainingSession whose creation fails (a ps restarting) leaves the graph finalized, and
    # the worker enters the next one with the same hooks: their begin() must not add ops again.
    cluster_cfg = spec.ClusterConfig(("ps0:1",), ("w0:1", "w1:1"), "worker", 0)
    train_cfg = TrainConfig(train_steps=10, sync_replicas=True, replicas_to_aggregate=2)
    cfg = RunConfig(cluster_cfg, train_cfg, model.ModelConfig(), inputs.DataConfig(synthetic_examples=100))
    graph = tf.Graph()
    with graph.as_default():
        built = train_graph.build_graph(cfg)
        not_learning = learning.NotLearningHook("worker:0", built.step.metrics.loss, built.step.labels, 10, 10, 0,
                                                "stop", "")
        hooks = [*built.step.hooks, *built.step.chief_only_hooks, not_learning]
        for hook in hooks:
            hook.begin()
        graph.finalize()
        for hook in hooks:
            hook.begin()
        for hook in hooks:  # never run: no session here. Say so, or TF logs it at exit.
            if isinstance(hook, sync.SyncReplicasHook):
                hook._optimizer.ready_for_local_init_op.mark_used()


class CancelOnce(v1.train.SessionRunHook):
    """Fails one step with CancelledError, as a step does when a ps task restarts under it."""

    def __init__(self, at_run):
        self.runs, self.at_run, self.raised = 0, at_run, False

    def after_run(self, run_context, run_values):
        self.runs += 1
        if self.runs == self.at_run and not self.raised:
            self.raised = True
            raise tf.errors.CancelledError(None, None, "RecvFromRemoteAsync is cancelled.")


@pytest.mark.servers
def test_a_cancelled_step_starts_a_new_session_and_training_reaches_its_end(tmp_path, monkeypatch):
    # An async worker of an in-process cluster (1 ps, 1 worker) through the trainer's own loop.
    servers, _, (cluster_cfg,) = in_process_cluster(num_workers=1, num_ps=1)
    cancel = CancelOnce(at_run=20)
    build = train_graph.build_graph

    def build_with_cancel(cfg, stop=None):
        graph = build(cfg, stop)
        return graph._replace(step=graph.step._replace(hooks=(*graph.step.hooks, cancel)))

    monkeypatch.setattr(train_graph, "build_graph", build_with_cancel)
    cfg = RunConfig(
        cluster=cluster_cfg,
        train=TrainConfig(train_steps=60, model_dir=str(tmp_path), log_every_n_steps=10, not_learning="off",
                          save_checkpoint_secs=None, save_checkpoint_steps=1000),
        model=model.ModelConfig(), data=inputs.DataConfig(synthetic_examples=2000))
    with tf.Graph().as_default():
        trained = worker.train(cfg, servers[0])
    assert cancel.raised and trained.global_step >= 60


def chiefs_sync_graph():
    """In the default graph: the sync chief's train op of one weight vector, for 2 workers, its hooks' ops
    built; (global step, the weights, their accumulator)."""
    step = v1.train.get_or_create_global_step()
    weights = v1.get_variable("w", initializer=tf.constant(INITIAL))
    optimizer = sync.wrap_optimizer(v1.train.GradientDescentOptimizer(LEARNING_RATE),
                                    spec.ClusterConfig(ps_hosts=("ps:1",), worker_hosts=("w0:1", "w1:1"),
                                                       job_name="worker", task_index=0),
                                    TrainConfig(sync_replicas=True, replicas_to_aggregate=2))
    train_op = optimizer.minimize(tf.reduce_sum(weights * tf.constant(GRADIENTS[0])), global_step=step)
    sync.SyncReplicasHook(optimizer, True, 0, train_op, num_workers=2, replica_index=0).begin()
    accumulator, _ = optimizer._accumulator_list[0]
    return step, weights, accumulator


@pytest.mark.inprocess
def test_after_a_restore_a_ps_that_kept_its_rounds_counts_the_first_push_of_the_restored_round_alone(tmp_path):
    # Seen in the two-ps sync drill: ps 0 kept running at round 61 while ps 1 restarted; the chief
    # restored step 50, the other worker was ready at once and pushed its round-50 gradient before the
    # chief's sync init set the accumulators back: ps 0's accumulators dropped it as stale, ps 1's
    # kept it, and round 50 stalled for two minutes. And a gradient left from round 61 must not join
    # round 50 (the sync chaos drill: it completed a round on one ps alone). One session stands for
    # both ps tasks here.
    with tf.Graph().as_default():
        step, weights, accumulator = chiefs_sync_graph()
        rounds_ahead = accumulator.set_global_step(61)
        push_of_round_61 = accumulator.apply_grad(tf.constant([5.0, 5.0]), local_step=61)
        push_of_round_50 = accumulator.apply_grad(tf.constant([1.0, 1.0]), local_step=50)
        take = accumulator.take_grad(1)
        lose_the_weights = tf.raw_ops.DestroyResourceOp(resource=weights.handle)  # as their ps restarted
        saver = checkpoints.LiveStateSaver(checkpoints.report_uninitialized())
        with tf_session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(step.assign(50))
            path = saver.save(sess, str(tmp_path / "model.ckpt"), global_step=step)
            sess.run([step.assign(61), rounds_ahead])
            sess.run(push_of_round_61)  # a round the restore undoes: its gradient must not count
            sess.run(lose_the_weights)
            saver.restore(sess, path)
            assert sess.run([step, weights]) == [50, pytest.approx(INITIAL)]
            sess.run(push_of_round_50)
            assert sess.run(accumulator.num_accumulated()) == 1
            assert sess.run(take).tolist() == [1.0, 1.0]


@pytest.mark.inprocess
def test_a_restore_empties_an_accumulator_behind_a_take_of_a_session_that_is_gone(tmp_path, monkeypatch):
    # Seen once in the two-ps sync drill: ps 1 kept a take of the chief's aggregation from before ps 0
    # restarted (its step's cancellation never reached ps 1). Takes complete in order, so the
    # restore's take of the round's leftover gradient waited behind it for three minutes, and the
    # other worker waited for the restore. Here that take is one left waiting in a thread.
    monkeypatch.setattr(sync, "TAKE_WAIT_SECS", 0.2)
    with tf.Graph().as_default():
        step, weights, accumulator = chiefs_sync_graph()
        started = tf.queue.FIFOQueue(1, tf.int32)
        with tf.control_dependencies([started.enqueue(1)]):
            take_of_a_round = accumulator.take_grad(2)
        leftover_push = accumulator.apply_grad(tf.constant([5.0, 5.0]), local_step=0)
        push = accumulator.apply_grad(tf.constant([1.0, 3.0]), local_step=0)
        lose_the_weights = tf.raw_ops.DestroyResourceOp(resource=weights.handle)  # as their ps restarted
        saver = checkpoints.LiveStateSaver(checkpoints.report_uninitialized())
        with tf_session() as sess:
            sess.run(v1.global_variables_initializer())
            path = saver.save(sess, str(tmp_path / "model.ckpt"), global_step=step)
            sess.run(lose_the_weights)
            earlier, outcome = threading.Thread(target=lambda: outcome.update(taken=sess.run(take_of_a_round)),
                                                daemon=True), {}
            earlier.start()
            sess.run(started.dequeue())
            time.sleep(0.5)  # elapsed time is the subject: its take, right after the enqueue, waits in the accumulator
            sess.run(leftover_push)
            def restore_in_graph():
                with sess.graph.as_default():
                    outcome["restored"] = saver.restore(sess, path)

            restore = threading.Thread(target=restore_in_graph, daemon=True)
            restore.start()
            restore.join(timeout=20)
            assert "restored" in outcome, "the restore waited behind the earlier take, or failed"
            earlier.join(timeout=5)
            assert "taken" in outcome and sess.run(accumulator.num_accumulated()) == 0
            sess.run(push)  # the next round's first push counts alone
            assert sess.run(accumulator.num_accumulated()) == 1
            within = v1.RunOptions(timeout_in_ms=PLAIN_RUN_TIMEOUT_MS)  # a take still queued would block it
            assert sess.run(accumulator.take_grad(1), options=within).tolist() == [1.0, 3.0]
