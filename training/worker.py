"""The worker role: build this replica's graph and train it in a MonitoredTrainingSession."""

import os
import threading
import time
from typing import NamedTuple

import tensorflow as tf
from absl import logging

import input as inputs
import model
from cluster import peers, placement, shutdown, spec
from training import checkpoints, export, optimizers, preemption, watchdog, wire
from training import hooks as training_hooks

v1 = tf.compat.v1

NON_FINITE_LOSS = "NonFiniteLoss"
CHIEF_POLL_SECS = 0.5
# A non-chief's MonitoredTrainingSession gives up at once when the variables are not ready
# (below SessionManager's 30 s poll); see _train_in_session.
NOT_READY_RETRY_SECS = 1
SESSION_NOT_READY = "Session was not ready"
# In sync mode the chief's queue-runner thread is blocked waiting for gradients that will never
# come once training is over; MonitoredSession waits this long for it before closing the session,
# which cancels the wait. TensorFlow's default is 120 s.
SYNC_STOP_GRACE_SECS = 0.5


class TrainingError(Exception):
    """A failure to report in one line, with a non-zero exit."""


class TrainGraph(NamedTuple):
    saver: tf.compat.v1.train.Saver
    train_op: tf.Operation
    loss: tf.Tensor
    accuracy: tf.Tensor
    hooks: list
    chief_only_hooks: list
    steps_done: tf.Tensor | None = None  # with --steps_per_run: the steps one run of train_op took


def build_graph(cfg, stop_requested=None) -> TrainGraph:
    """This replica's training graph: variables on the ps tasks, everything else on this worker.
    `stop_requested()` ends a sync worker's wait for a round (see SyncReplicasHook)."""
    cluster, train = cfg.cluster, cfg.train
    v1.set_random_seed(train.seed)
    device = placement.device_setter(cluster) if cluster.is_distributed else None
    looped = train.steps_per_run > 1
    with v1.device(device):
        global_step = v1.train.get_or_create_global_step()
        shard = inputs.Shard(cluster.replica_index, cluster.num_workers)
        batches = v1.data.make_one_shot_iterator(inputs.batches(cfg.data, shard, train.batch_size))
        # One process has no wire: --wire_dtype applies to clusters only.
        read_through = wire.read_through(wire.WIRE_DTYPES[train.wire_dtype]) if cluster.is_distributed else None

        def forward(summaries):
            features, labels = batches.get_next()
            with v1.variable_scope(v1.get_variable_scope(), custom_getter=read_through, reuse=v1.AUTO_REUSE):
                return model.build(features, labels, cfg.model, inputs.spec(cfg.data), summaries)

        output = forward(summaries=not looped)
        learning_rate = tf.constant(train.learning_rate, name="learning_rate_value")
        v1.summary.scalar("learning_rate", learning_rate)
        optimizer = optimizers.make_optimizer(learning_rate, train)
        train_op, hooks, chief_only_hooks = make_train_op(output.loss, optimizer, global_step, cluster, train,
                                                           stop_requested)
        steps_done = None
        if looped:  # the single step above made the variables and slots, which a loop body cannot
            train_op, output, steps_done = repeat_steps(forward, optimizer, global_step, train, output.auc is not None)
            model.summarize(output)
    # As MonitoredTrainingSession's default saver (sharded: each ps saves its own variables), with
    # --keep_checkpoint_max.
    saver = v1.train.Saver(sharded=True, max_to_keep=train.keep_checkpoint_max, save_relative_paths=True)
    return TrainGraph(saver, train_op, output.loss, output.accuracy, hooks, chief_only_hooks, steps_done)


def repeat_steps(forward, optimizer, global_step, train, with_auc):
    """--steps_per_run: up to that many training steps in one tf.while_loop, so in one session.run.

    Each iteration is a whole step (next batch, forward, gradients, update, global step + 1); the
    loop also ends at --train_steps, so the last run stops there. Returns the loop's op, the last
    step's loss and metrics (for logging and summaries, between runs) and the steps it took.
    """
    # The global step is carried from each update to the next check: a read in the loop's condition
    # could run before the previous iteration's increment and let the loop pass --train_steps.
    def keep_going(done, step_reached, *_):
        return tf.logical_and(done < train.steps_per_run, step_reached < train.train_steps)

    def step(done, *_):
        output = forward(summaries=False)
        with tf.control_dependencies([apply_update(output.loss, optimizer, global_step)]):
            metrics = [output.loss, output.accuracy] + ([output.auc] if with_auc else [])
            return [done + 1, global_step.read_value()] + [tf.identity(metric) for metric in metrics]

    start = [tf.constant(0), global_step.read_value()] + [tf.constant(0.0)] * (3 if with_auc else 2)
    done, _, loss, accuracy, *auc = tf.while_loop(keep_going, step, start, name="steps_per_run")
    output = model.ModelOutput(None, None, loss, accuracy, auc[0] if auc else None)
    return done.op, output, done


def make_train_op(loss, optimizer, global_step, cluster, train, stop_requested=None):
    """The update op, plus the hooks it needs on every worker and on the chief only.

    With train.sync_replicas, gradients go through SyncReplicasOptimizer: train.replicas_to_aggregate
    of them are averaged per step, and the rest (backup workers' late ones) are dropped as stale;
    `stop_requested()` ends a worker's wait for a round that is missing a peer's gradient.
    """
    hooks, chief_only_hooks = [], []
    if train.sync_replicas:
        optimizer = v1.train.SyncReplicasOptimizer(
            optimizer, replicas_to_aggregate=train.replicas_to_aggregate,
            total_num_replicas=cluster.num_workers)
    train_op = apply_update(loss, optimizer, global_step)
    if train.sync_replicas:
        # num_tokens=0: no worker, the chief included, starts step k+1 before step k's update is
        # applied; and the hook keeps every worker to one gradient per round, so the chief cannot
        # fill a round with its own gradients when a peer is down.
        hooks.append(training_hooks.SyncReplicasHook(optimizer, cluster.is_chief, num_tokens=0, train_op=train_op,
                                                     stop_requested=stop_requested))
        chief_only_hooks.append(
            training_hooks.CloseQueueAtEndHook(optimizer._sync_token_queue))  # pylint: disable=protected-access
    hooks.append(v1.train.StopAtStepHook(last_step=train.train_steps))
    return train_op, hooks, chief_only_hooks


def apply_update(loss, optimizer, global_step):
    """Gradients of the loss applied to the variables, global step + 1."""
    # Colocated: the gradient of an op on the ps (a wire cast, an embedding gather) is computed there.
    grads_and_vars = guard_finite(loss, optimizer.compute_gradients(loss, colocate_gradients_with_ops=True))
    return optimizer.apply_gradients(grads_and_vars, global_step=global_step)


def guard_finite(loss, grads_and_vars):
    """Makes every gradient wait for a check that the loss is finite.

    A NaN or Inf loss then fails the step before any update reaches the ps, so the variables and the
    latest checkpoint stay the last good ones.
    """
    check = tf.debugging.assert_all_finite(loss, f"{NON_FINITE_LOSS}: the loss is NaN or Inf")
    with tf.control_dependencies([check]):
        return [(_identity(grad), var) for grad, var in grads_and_vars if grad is not None]


def _identity(grad):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(tf.identity(grad.values), grad.indices, grad.dense_shape)
    return tf.identity(grad)


def wait_for_chief_ready(target, session_config, timeout_secs, task_name):
    """Polls until the chief has initialized or restored the variables, every CHIEF_POLL_SECS.

    MonitoredTrainingSession's own wait for non-chief workers polls every 30 s; entering it once the
    variables are ready means its first check passes.
    """
    uninitialized = v1.report_uninitialized_variables(v1.global_variables())
    start = last_log = time.monotonic()
    with v1.Session(target, config=session_config) as sess:
        while True:
            names = sess.run(uninitialized)
            if not len(names):
                return
            now = time.monotonic()
            if now - start > timeout_secs:
                raise TrainingError(
                    f"{task_name}: the chief did not initialize the variables within {timeout_secs} s "
                    "(--startup_timeout_secs); is the chief task running?")
            if now - last_log >= 10:
                logging.info("%s: waiting for the chief to initialize %d variables", task_name, len(names))
                last_log = now
            time.sleep(CHIEF_POLL_SECS)


def wait_for_ps(cluster, timeout_secs):
    ps_tasks = {f"ps {index}": address for index, address in enumerate(cluster.ps_hosts)}
    try:
        peers.wait_for_peers(ps_tasks, timeout_secs, cluster.task_name)
    except peers.PeersUnreachable as err:
        raise TrainingError(str(err)) from None


def train(cfg, server=None, stop=None) -> training_hooks.ProgressHook:
    """Trains to --train_steps, or until `stop` (a Preemption) is requested; returns the progress
    hook with the final step, loss and accuracy."""
    cluster, train_cfg = cfg.cluster, cfg.train
    graph = build_graph(cfg, stop.requested.is_set if stop else None)
    if cluster.is_chief and cluster.is_distributed:
        report = ", ".join(f"{dev} {size / 2**20:.2f} MiB"
                           for dev, size in placement.bytes_per_ps(v1.get_default_graph()).items())
        logging.info("%s: variables placed: %s", cluster.task_name, report)
    task_dir = cluster.task_name.replace(":", "_")
    progress = training_hooks.ProgressHook(
        cluster.task_name, graph.loss, graph.accuracy, train_cfg.train_steps, train_cfg.batch_size,
        train_cfg.log_every_n_steps, summary_dir=os.path.join(train_cfg.model_dir, "workers", task_dir),
        steps_done=graph.steps_done, steps_per_run=train_cfg.steps_per_run)
    target = server.target if server else ""
    config = spec.session_config(cluster)
    if cluster.is_distributed:
        wait_for_ps(cluster, train_cfg.startup_timeout_secs)
    if cluster.is_chief:
        checkpoints.remove_interrupted_saves(train_cfg.model_dir, cluster.task_name)
    stall_watchdog = watchdog.StallWatchdog(
        cluster.task_name,
        watchdog.stall_cause(train_cfg.sync_replicas, train_cfg.replicas_to_aggregate, cluster.num_workers),
        train_cfg.stall_warning_secs, train_cfg.stall_timeout_secs)
    hooks = graph.hooks + [progress, stall_watchdog] + ([preemption.PreemptionHook(stop)] if stop else [])
    if train_cfg.profile_steps:
        hooks.append(training_hooks.ProfileHook(cluster.task_name, *train_cfg.profile_steps,
                                                os.path.join(train_cfg.model_dir, "profile", task_dir)))
    scaffold = v1.train.Scaffold(saver=graph.saver)
    try:
        while not _train_in_session(cfg, target, config, graph, scaffold, hooks, progress):
            logging.info("%s: the variables on the ps are not initialized (did a ps task restart?); "
                         "waiting for the chief to restore them", cluster.task_name)
    except tf.errors.InvalidArgumentError as err:
        error = _training_error(err, cluster, train_cfg, progress)
        if error is None:
            raise
        raise error from None
    finally:
        stall_watchdog.stop()
    return progress


def _train_in_session(cfg, target, config, graph, scaffold, hooks, progress) -> bool:
    """Trains in one MonitoredTrainingSession until the end or a stop request. Returns False if this
    non-chief worker must wait for the chief again.

    A non-chief's MonitoredTrainingSession re-creates its session after a ps restarts, and then
    waits for the chief to restore the variables, polling every 30 s. With max_wait_secs under
    that poll, its first not-ready check raises DeadlineExceededError instead: this worker polls
    with wait_for_chief_ready and enters a new session (the hooks and scaffold are reused).
    """
    cluster, train_cfg = cfg.cluster, cfg.train
    if not cluster.is_chief:
        wait_for_chief_ready(target, config, train_cfg.startup_timeout_secs, cluster.task_name)
    try:
        with v1.train.MonitoredTrainingSession(
                master=target,
                is_chief=cluster.is_chief,
                checkpoint_dir=train_cfg.model_dir,
                hooks=hooks,
                chief_only_hooks=graph.chief_only_hooks,
                scaffold=scaffold,
                save_checkpoint_steps=train_cfg.save_checkpoint_steps,
                save_checkpoint_secs=train_cfg.save_checkpoint_secs,
                save_summaries_steps=train_cfg.save_summaries_steps,
                save_summaries_secs=None,
                log_step_count_steps=0,
                config=config,
                max_wait_secs=train_cfg.startup_timeout_secs if cluster.is_chief else NOT_READY_RETRY_SECS,
                stop_grace_period_secs=SYNC_STOP_GRACE_SECS if train_cfg.sync_replicas else 10,
        ) as sess:
            # StopAtStepHook looks only after a step: a worker (re)started once training is over
            # would push one more update. ProgressHook read the global step when the session began.
            # After that StopAtStepHook alone decides: it reads the variable itself, where
            # ProgressHook's per-step figure is an estimate (in sync mode a step can return before
            # the chief's queue runner has applied that round).
            if progress.global_step < train_cfg.train_steps:
                while not sess.should_stop():
                    sess.run(graph.train_op)
    except tf.errors.DeadlineExceededError as err:
        if cluster.is_chief or SESSION_NOT_READY not in err.message:
            raise
        return False
    return True


def _training_error(err, cluster, train_cfg, progress):
    """A one-line TrainingError for a NaN loss or a bad input record, else None."""
    if NON_FINITE_LOSS in err.message:
        return TrainingError(
            f"{cluster.task_name}: the loss became NaN or Inf after global step {progress.global_step}; "
            f"training stopped before applying it, so the latest checkpoint in {train_cfg.model_dir} "
            "is the last good one. Lower --learning_rate or check the data.")
    bad_record = inputs.bad_record_message(err.message)
    if bad_record:
        return TrainingError(f"{cluster.task_name}: {bad_record} (--skip_bad_records skips such records, "
                             "logging each)")
    return None


def run(cfg, server=None) -> int:
    """Trains, tells the ps tasks this worker is done, logs the outcome, returns the exit code."""
    start = time.monotonic()
    stop = preemption.Preemption(cfg.cluster.task_name).install()
    progress = train(cfg, server, stop)
    if stop.requested.is_set():
        # Not done: the ps tasks keep serving for this worker's restart.
        saved = " (the chief saved a checkpoint there)" if cfg.cluster.is_chief else ""
        logging.warning("%s preempted at global step %s%s; restart it to resume", cfg.cluster.task_name,
                        progress.global_step, saved)
        return preemption.EXIT_PREEMPTED
    if server is not None:
        _signal_done_bounded(server, cfg.cluster)
    if cfg.cluster.is_chief and cfg.train.export_saved_model:
        export.export(cfg, tf.train.latest_checkpoint(cfg.train.model_dir))
    # key=value, so the local launcher and the tests read the same line a person does.
    logging.info("%s finished: global_step=%s local_steps=%d loss=%s accuracy=%s seconds=%.1f",
                 cfg.cluster.task_name, progress.global_step, progress.local_steps,
                 _fmt(progress.loss, 4), _fmt(progress.accuracy, 3), time.monotonic() - start)
    return 0


def _fmt(value, digits):
    return "n/a" if value is None else f"{value:.{digits}f}"


def _signal_done_bounded(server, cluster, timeout_secs=30.0):
    # A session to a ps that is gone can wait long in creation; never let that keep a worker alive.
    thread = threading.Thread(target=shutdown.signal_worker_done, args=(server, cluster, timeout_secs),
                              daemon=True)
    thread.start()
    thread.join(timeout_secs + 5)
    if thread.is_alive():
        logging.warning("%s: gave up telling the ps tasks it is done", cluster.task_name)
