"""The worker role: build this replica's graph (training/graph.py) and train it in a
MonitoredTrainingSession to --train_steps, through ps restarts and sessions that end early."""

import dataclasses
import os
import time
from typing import NamedTuple

import tensorflow as tf
from absl import logging

import input as inputs
from input import work_queue
from model import embeddings
from cluster import model_dir as layout
from cluster import peers, placement, shutdown, spec
from training import checkpoints, chief_claim, evaluator, exit_codes, export, learning, log_lines, preemption
from training import plan, resume, run_record, watchdog
from training import graph as train_graph
from training import hooks as training_hooks
from training.step import momentum, sync, update

v1 = tf.compat.v1

CHIEF_POLL_SECS = 0.5
# A non-chief's MonitoredTrainingSession gives up at once when the variables are not ready
# (below SessionManager's 30 s poll); see _train_in_session.
NOT_READY_RETRY_SECS = 1
SESSION_NOT_READY = "Session was not ready"
# Sessions in a row that may end short of --train_steps with no step done before the worker gives up.
MAX_EARLY_ENDS = 10


class TrainingError(exit_codes.Failure):
    """A failure of training to report in one line; its outcome gives the exit code."""


def wait_for_chief_ready(target, session_config, timeout_secs, task_name, uninitialized,
                         train_cfg=None) -> int | None:
    """Polls until the chief has initialized or restored the variables, every CHIEF_POLL_SECS.
    Returns None then, or the final global step if training turns out to be over already (the
    global step is at --train_steps, or the chief's done mark says so): a worker restarted after the
    end, when a ps has restarted too, would otherwise wait for a chief that is gone.

    MonitoredTrainingSession's own wait for non-chief workers polls every 30 s; entering it once the
    variables are ready means its first check passes. `uninitialized`: checkpoints.report_uninitialized()
    of the graph, built beforehand (a MonitoredTrainingSession that failed can leave the graph finalized).
    """
    global_step = v1.train.get_global_step()
    start = last_log = time.monotonic()
    while True:
        try:
            with v1.Session(target, config=session_config) as sess:
                while True:
                    names = sess.run(uninitialized)
                    if not len(names):
                        return None
                    if train_cfg is not None:
                        over = _training_over(sess, names, global_step, train_cfg)
                        if over is not None:
                            logging.info("%s: training is over (global step %d); not waiting for the chief",
                                         task_name, over)
                            return over
                    now = time.monotonic()
                    if now - start > timeout_secs:
                        raise TrainingError(
                            f"{task_name}: the chief did not initialize the variables within {timeout_secs} s "
                            "(--startup_timeout_secs); is the chief task running?", exit_codes.CHIEF_NOT_READY)
                    if now - last_log >= 10:
                        logging.info("%s: waiting for the chief to initialize %d variables", task_name, len(names))
                        last_log = now
                    time.sleep(CHIEF_POLL_SECS)
        except (tf.errors.UnavailableError, tf.errors.AbortedError) as err:
            # A ps task down while this worker waits (the chaos drill: a second ps killed while the
            # chief restored the first): the chief waits for it as well. Past the timeout, this
            # reaches the top: a transient exit.
            if time.monotonic() - start > timeout_secs:
                raise
            logging.info("%s: a ps task did not answer while waiting for the chief (%s); asking again",
                         task_name, log_lines.error_cause(err.message, 120))
            time.sleep(CHIEF_POLL_SECS)


def _training_over(sess, uninitialized_names, global_step, train_cfg) -> int | None:
    if global_step is not None and global_step.op.name.encode() not in set(uninitialized_names):
        step = int(sess.run(global_step))
        if step >= train_cfg.train_steps:
            return step
    return shutdown.chief_finished_step(train_cfg.model_dir, train_cfg.train_steps, train_cfg.num_epochs)


def wait_for_ps(cluster, timeout_secs):
    ps_tasks = {f"ps {index}": address for index, address in enumerate(cluster.ps_hosts)}
    try:
        peers.wait_for_peers(ps_tasks, timeout_secs, cluster.task_name)
    except peers.PeersUnreachable as err:
        raise TrainingError(str(err), exit_codes.PS_UNREACHABLE) from None


class WorkerHooks(NamedTuple):
    """The session hooks of this worker, with the ones its training loop reads back."""
    all: list
    progress: training_hooks.ProgressHook
    stall_watchdog: watchdog.StallWatchdog
    not_learning: learning.NotLearningHook | None


def train(cfg, server=None, stop=None, task_metrics=None) -> training_hooks.ProgressHook:
    """Trains to --train_steps, or until `stop` (a Preemption) is requested; returns the progress
    hook with the final step, loss and accuracy."""
    # A graph of its own, entered: inside a function that tf.data traces, a py_func asks whether the
    # outermost context is eager, and when TensorFlow started eager it is unless a graph was entered,
    # so the function would be pinned to /job:localhost, a device no cluster task has.
    with tf.Graph().as_default():
        return _train(_settle_input(cfg), server, stop, task_metrics)


def _settle_input(cfg):
    """The input path on resume (training/plan.settled_input): the queue chosen by default gives way
    to the fixed shards of the checkpoint to resume."""
    data = cfg.data
    if not (data.input_queue and data.input_queue_by_default):
        return cfg
    checkpoint = tf.train.latest_checkpoint(cfg.train.model_dir)
    path = plan.settled_input(plan.InputPath(data.input_queue, data.input_queue_by_default),
                              work_queue.saved_without_queue(checkpoint))
    if path.queue:
        return cfg
    if cfg.cluster.joins:
        raise TrainingError(f"{cfg.cluster.task_name}: --join_address needs the input queue, and this job reads "
                            f"fixed shards (its checkpoint {checkpoint} was saved with them)", exit_codes.BAD_FLAGS)
    logging.info("%s: the checkpoint to resume (%s) was saved by a run that read fixed shards: this run reads them "
                 "too, not the input queue (which needs a new --model_dir)", cfg.cluster.task_name, checkpoint)
    return dataclasses.replace(cfg, data=dataclasses.replace(data, input_queue=False, input_queue_by_default=False))


def _train(cfg, server, stop, task_metrics) -> training_hooks.ProgressHook:
    cluster, train_cfg = cfg.cluster, cfg.train
    graph = train_graph.build_graph(cfg, stop.requested.is_set if stop else None)
    log_startup(cfg, task_metrics, graph.input_queue.feed.queue.num_files if graph.input_queue else None)
    hooks = make_hooks(cfg, graph, stop, task_metrics)
    if graph.input_queue:
        target, tf_graph = server.target if server else "", v1.get_default_graph()
        graph.input_queue.feed.connect(lambda: v1.Session(target, graph=tf_graph, config=spec.session_config(cluster)))
    if graph.input_queue and cluster.is_chief:  # before "training is over": that may be of other files
        resume.check_training_files(cfg)
    over = shutdown.chief_finished_step(train_cfg.model_dir, train_cfg.train_steps, train_cfg.num_epochs)
    if over is not None:
        # Restarted after the end (an orchestrator restarting a finished task): the ps tasks may be
        # gone, and waiting for them would end only at --startup_timeout_secs. The chief's mark comes
        # after its final checkpoint: a chief still exports and evaluates that, which needs no ps.
        logging.info("%s: training is over (the chief finished at global step %d); not waiting for the ps tasks",
                     cluster.task_name, over)
        # The end is --train_steps (an async peer's last push can land after the chief's final save, so
        # the mark's step may be past it and past that checkpoint), or where the epochs ended.
        hooks.progress.global_step, hooks.progress.last_step = over, min(over, hooks.progress.last_step)
        hooks.progress.over_at_start = True
        if cluster.is_chief:
            resume.check_final_checkpoint(train_cfg.model_dir, hooks.progress.last_step, cluster.task_name)
        return hooks.progress
    if cluster.is_distributed:
        wait_for_ps(cluster, train_cfg.startup_timeout_secs)
    if cluster.is_chief:
        resume.check_and_record(cfg, graph.input_queue)
    try:
        train_until_done(cfg, server.target if server else "", graph, hooks, stop)
    except tf.errors.InvalidArgumentError as err:
        error = _training_error(err, cluster, train_cfg, hooks.progress)
        if error is None:
            raise
        raise error from None
    except tf.errors.DataLossError as err:
        if not _input_data_loss(err):
            raise
        raise TrainingError(f"{cluster.task_name}: {log_lines.error_cause(err.message)} (an input file is corrupt: "
                            "a gzipped one whose data is damaged, say; replace it and restart)",
                            exit_codes.BAD_DATA) from None
    except tf.errors.NotFoundError as err:  # an input file that went away while training read it
        raise TrainingError(f"{cluster.task_name}: {log_lines.error_cause(err.message)} (an input file is gone; "
                            "put it back and restart: the checkpoints keep what was trained)",
                            exit_codes.BAD_DATA) from None
    finally:
        hooks.stall_watchdog.stop()
    if hooks.not_learning and hooks.not_learning.failure:
        raise TrainingError(hooks.not_learning.failure, exit_codes.NOT_LEARNING)
    return hooks.progress


def _input_data_loss(err: tf.errors.DataLossError) -> bool:
    """An input file's damage (its iterator's error), not a checkpoint's."""
    return "Iterator" in err.message


def log_startup(cfg, task_metrics=None, queued_files: int | None = None) -> None:
    """What this worker trains with: where the variables went (the chief), the momentum, the data.
    queued_files: the training files the input queue hands out, or None without it."""
    cluster = cfg.cluster
    if cluster.is_chief and cluster.is_distributed:
        bytes_per_ps = placement.bytes_per_ps(v1.get_default_graph())
        if task_metrics:
            task_metrics.ps_bytes(bytes_per_ps)
        growing = placement.growing_per_ps(v1.get_default_graph())
        report = ", ".join(f"{dev} {size / 2**20:.2f} MiB" + (f" and {growing[dev]} variables that grow with their "
                                                             "tables" if dev in growing else "")
                           for dev, size in bytes_per_ps.items())
        logging.info("%s: variables placed: %s", cluster.task_name, report)
    log_momentum(cluster.task_name, cfg.train)
    logging.info("%s: reading %s", cluster.task_name,
                 inputs.describe(cfg.data, inputs.Shard(cluster.replica_index, cluster.num_replicas)))
    if cluster.is_chief and queued_files is not None:
        few = work_queue.few_files_warning(queued_files, cluster.num_replicas, cfg.train.num_epochs)
        if few:
            logging.warning("%s: %s", cluster.task_name, few)


def make_hooks(cfg, graph, stop=None, task_metrics=None) -> WorkerHooks:
    """The step's own hooks, then progress, the stall watchdog, preemption, not-learning, profiling."""
    cluster, train_cfg = cfg.cluster, cfg.train
    progress = training_hooks.ProgressHook(
        cluster.task_name, graph.step.metrics.loss, graph.step.metrics.accuracy, train_cfg.train_steps,
        train_cfg.batch_size * train_cfg.accumulate_batches,
        train_cfg.log_every_n_steps, summary_dir=layout.worker_dir(train_cfg.model_dir, cluster.task_dir),
        steps_done=graph.step.steps_done, steps_per_run=train_cfg.steps_per_run,
        measure_staleness=cluster.is_distributed and not train_cfg.sync_replicas, metrics=task_metrics)
    stall_watchdog = watchdog.StallWatchdog(
        cluster.task_name,
        watchdog.stall_cause(train_cfg.sync_replicas, train_cfg.replicas_to_aggregate, cluster.num_replicas),
        train_cfg.stall_warning_secs, train_cfg.stall_timeout_secs)
    # The input queue's hook after the step's: in sync mode a step's batch counts once its round is applied.
    hooks = [*graph.step.hooks] + ([graph.input_queue] if graph.input_queue else []) + [progress, stall_watchdog] + (
        [preemption.PreemptionHook(stop)] if stop else [])
    not_learning = None
    if train_cfg.not_learning != "off":
        not_learning = learning.NotLearningHook(
            cluster.task_name, graph.step.metrics.loss, graph.step.labels, inputs.spec(cfg.data).num_classes,
            every_n_runs=train_cfg.log_every_n_steps // train_cfg.steps_per_run,
            warmup_global_steps=learning.warmup_steps(train_cfg.train_steps), action=train_cfg.not_learning,
            cause=learning.likely_cause(train_cfg))
        hooks.append(not_learning)
    if graph.tables.needs:
        hooks.append(training_hooks.TableUpkeepHook(graph.tables, embeddings.UPKEEP_EVERY_N_RUNS))
    if cluster.is_chief and graph.saver.deltas is not None:
        hooks.append(training_hooks.DeltaSaverHook(graph.saver, train_cfg.model_dir, train_cfg.incremental_save_secs))
    live_rows = v1.get_collection(embeddings.LIVE_ROWS)
    if live_rows and cluster.is_chief:
        hooks.append(training_hooks.LiveRowsHook(cluster.task_name, live_rows, train_cfg.log_every_n_steps))
    if train_cfg.profile_steps:
        hooks.append(training_hooks.ProfileHook(cluster.task_name, *train_cfg.profile_steps,
                                                layout.profile_dir(train_cfg.model_dir, cluster.task_dir)))
    return WorkerHooks(hooks, progress, stall_watchdog, not_learning)


def train_until_done(cfg, target, graph, hooks: WorkerHooks, stop=None) -> None:
    """Sessions one after another until the global step reaches --train_steps, a stop is requested or
    the run is found not learning: a session ends early when a ps restarts or the input ends."""
    cluster, train_cfg, progress = cfg.cluster, cfg.train, hooks.progress
    config = spec.session_config(cluster)
    scaffold = v1.train.Scaffold(saver=graph.saver)
    early_ends = 0
    while True:
        start_step = progress.global_step
        if not _train_in_session(cfg, target, config, graph, scaffold, hooks.all, progress):
            logging.info("%s: the variables on the ps are not initialized (did a ps task restart?); "
                         "waiting for the chief to restore them", cluster.task_name)
            continue
        if ((stop and stop.requested.is_set()) or (hooks.not_learning and hooks.not_learning.failure)
                or progress.global_step >= train_cfg.train_steps):
            return
        if graph.input_queue and _all_epochs_done(graph.input_queue.feed):
            progress.last_step = progress.global_step = _global_step_now(target, config, cluster)
            logging.info("%s: input queue: all %d epoch(s) trained; training ends at global step %d",
                         cluster.task_name, train_cfg.num_epochs, progress.last_step)
            return
        # Only the global step says training is over. A session can end short of it with no
        # error: an OutOfRangeError (a closed queue, an input that ran out) ends a
        # MonitoredSession as cleanly as the last step does.
        early_ends = early_ends + 1 if progress.global_step == start_step else 0
        if early_ends >= MAX_EARLY_ENDS:
            raise TrainingError(
                f"{cluster.task_name}: {early_ends} sessions in a row ended at global step "
                f"{progress.global_step} with no step done, short of --train_steps={train_cfg.train_steps} "
                "(an input that ends, or a queue closed); giving up", exit_codes.INPUT_ENDED)
        logging.warning("%s: the session ended at global step %s, short of --train_steps=%d; starting a "
                        "new one", cluster.task_name, progress.global_step, train_cfg.train_steps)
        time.sleep(CHIEF_POLL_SECS)


def _all_epochs_done(feed: work_queue.ItemFeed) -> bool:
    """--input_queue: every epoch is done (a sync worker can be woken by the end before its input saw it)."""
    try:
        return feed.all_done()
    except work_queue.RETRYABLE:  # ps 0 restarting: the next session asks again
        return False


def _global_step_now(target, config, cluster) -> int:
    """The global step as the ps holds it (the progress hook's figure is this worker's last step's)."""
    with v1.Session(target, config=config) as sess:
        return int(sess.run(v1.train.get_global_step()))


def log_momentum(task_name, train_cfg):
    """Says once which momentum is in use and why; warns about a combination known not to learn."""
    choice = train_cfg.momentum_choice
    if train_cfg.optimizer not in momentum.OPTIMIZERS_WITH_MOMENTUM or choice is None:
        return
    logging.info("%s: %s, %s", task_name, train_cfg.optimizer, choice.reason)
    if choice.warning:
        logging.warning("%s: %s", task_name, choice.warning)


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
        over = wait_for_chief_ready(target, config, train_cfg.startup_timeout_secs, cluster.task_name,
                                    graph.uninitialized, train_cfg)
        if over is not None:
            progress.global_step = over
            return True
        # The chief wrote run.json before it initialized the variables this worker waited for.
        refusal = run_record.peer_refusal(run_record.read(train_cfg.model_dir), cfg)
        if refusal:
            raise TrainingError(f"{cluster.task_name}: {refusal}", exit_codes.BAD_FLAGS)
    try:
        with v1.train.MonitoredTrainingSession(
                master=target,
                is_chief=cluster.is_chief,
                checkpoint_dir=train_cfg.model_dir,
                hooks=hooks,
                chief_only_hooks=list(graph.step.chief_only_hooks),
                scaffold=scaffold,
                save_checkpoint_steps=train_cfg.save_checkpoint_steps,
                save_checkpoint_secs=train_cfg.save_checkpoint_secs,
                save_summaries_steps=train_cfg.save_summaries_steps,
                save_summaries_secs=None,
                log_step_count_steps=0,
                config=config,
                max_wait_secs=train_cfg.startup_timeout_secs if cluster.is_chief else NOT_READY_RETRY_SECS,
                stop_grace_period_secs=sync.STOP_GRACE_SECS if train_cfg.sync_replicas else 10,
        ) as sess:
            # StopAtStepHook looks only after a step: a worker (re)started once training is over
            # would push one more update. ProgressHook read the global step when the session began.
            # After that StopAtStepHook alone decides: it reads the variable itself, where
            # ProgressHook's per-step figure is an estimate (in sync mode a step can return before
            # the chief's queue runner has applied that round).
            if progress.global_step < train_cfg.train_steps:
                while not sess.should_stop():
                    sess.run(graph.step.train_op)
    except tf.errors.DeadlineExceededError as err:
        if cluster.is_chief or SESSION_NOT_READY not in err.message:
            raise
        return False
    except tf.errors.CancelledError:
        # MonitoredSession recreates its session on Aborted and Unavailable only. When a ps task
        # restarts mid-step, the step can end Cancelled instead (a receive cancelled because the ps
        # aborted a request it saw twice, seen in the chaos soak): the same recoverable failure.
        if not cluster.is_distributed:
            raise
        logging.warning("%s: a step was cancelled (a ps task or the network failed mid-step); starting a new "
                        "session", cluster.task_name)
    return True


def _training_error(err, cluster, train_cfg, progress):
    """A one-line TrainingError for a NaN loss or a bad input record, else None."""
    if update.NON_FINITE_LOSS in err.message:
        return TrainingError(
            f"{cluster.task_name}: the loss became NaN or Inf after global step {progress.global_step}; "
            f"training stopped before applying it, so the latest checkpoint in {train_cfg.model_dir} "
            "is the last good one. Lower --learning_rate or check the data.", exit_codes.NON_FINITE_LOSS)
    full = embeddings.full_table_message(err.message)
    if full:
        return TrainingError(f"{cluster.task_name}: {full}", exit_codes.TABLE_FULL)
    bad_record = inputs.bad_record_message(err.message)
    if bad_record:
        return TrainingError(f"{cluster.task_name}: {bad_record} (--skip_bad_records skips such records, "
                             "logging each)", exit_codes.BAD_DATA)
    return None


def _saved_at_preemption(model_dir: str) -> str:
    """What the chief's last save holds, read from it: an async peer can step between the save's read
    of the global step and the progress line's."""
    newest = tf.train.latest_checkpoint(model_dir)
    if newest is None:
        return " (no checkpoint saved)"
    held = int(tf.train.load_checkpoint(newest).get_tensor("global_step"))
    return f" (the chief saved a checkpoint of global step {held}: {os.path.basename(newest)})"


def run(cfg, server=None, task_metrics=None) -> int:
    """Trains, tells the ps tasks this worker is done, logs the outcome, returns the exit code. The
    chief first claims model_dir (training/chief_claim.py), and gives it up at its end."""
    cluster = cfg.cluster
    claim = None
    if cluster.is_chief and cfg.train.model_dir:
        claim = chief_claim.claim(cfg.train.model_dir, cluster.own_address() if cluster.is_distributed else "",
                                  cluster.task_name)
    try:
        code, leave_at_once = _run(cfg, server, task_metrics)
    finally:
        if claim:
            claim.release()
    if leave_at_once:
        # A thread still inside a TensorFlow call when the interpreter shuts down aborts the
        # process; training is over and logged, so leave without running the shutdown.
        logging.flush()
        os._exit(code)  # pylint: disable=protected-access
    return code


def _run(cfg, server, task_metrics) -> tuple[int, bool]:
    """run()'s training and ending: the exit code, and whether to leave without the interpreter's shutdown."""
    start = time.monotonic()
    stop = preemption.Preemption(cfg.cluster.task_name, ps_hosts=cfg.cluster.ps_hosts).install()
    if cfg.cluster.joins:  # before it trains: the ps tasks then wait for it to finish too
        other = shutdown.held_elsewhere(cfg.train.model_dir, cfg.cluster.replica_index, cfg.cluster.join_address)
        if other:
            raise TrainingError(f"--task_index={cfg.cluster.task_index}: a worker at {other} joined the job with that "
                                "index and still serves; give each joining worker an index of its own",
                                exit_codes.BAD_FLAGS)
        shutdown.join(cfg.train.model_dir, cfg.cluster.replica_index, cfg.cluster.join_address)
    progress = train(cfg, server, stop, task_metrics)
    if stop.requested.is_set():
        # Not done: the ps tasks keep serving for this worker's restart.
        saved = _saved_at_preemption(cfg.train.model_dir) if cfg.cluster.is_chief else ""
        logging.warning("%s preempted at global step %s%s; restart it to resume", cfg.cluster.task_name,
                        progress.global_step, saved)
        return exit_codes.PREEMPTED, False
    if progress.global_step < progress.last_step:  # train() returns only at the end; never exit 0 short of it
        raise TrainingError(f"{cfg.cluster.task_name}: training ended at global step {progress.global_step}, "
                            f"short of --train_steps={cfg.train.train_steps}")
    final_checkpoint = tf.train.latest_checkpoint(cfg.train.model_dir) if cfg.cluster.is_chief else None
    if cfg.cluster.is_chief and (checkpoints.checkpoint_step(final_checkpoint) or 0) < progress.last_step:
        # Before the ps tasks are told: they keep the trained variables for a restarted chief to save.
        raise TrainingError(
            f"{cfg.cluster.task_name}: trained to global step {progress.global_step}, but its final checkpoint "
            f"could not be saved in {cfg.train.model_dir} (the newest is {final_checkpoint}); restart once "
            "the storage takes it", exit_codes.CHECKPOINT_NOT_SAVED)
    signalled = True
    if server is not None and progress.over_at_start:  # the ps tasks read the mark, if any is left
        shutdown.mark_done(cfg.train.model_dir, cfg.cluster.replica_index, progress.global_step,
                           cfg.train.train_steps, cfg.train.num_epochs)
    elif server is not None:
        signalled = shutdown.report_done(server, cfg.cluster, cfg.train.model_dir, progress.global_step,
                                         cfg.train.train_steps, cfg.train.num_epochs)
    held_out = {}
    if cfg.cluster.is_chief:
        if cfg.train.export_saved_model:
            export.export(cfg, final_checkpoint)
        held_out = _final_evaluation(cfg, final_checkpoint)
        if task_metrics:
            task_metrics.held_out({name[len("heldout_"):]: float(value) for name, value in held_out.items()})
    log_lines.log_finished(cfg.cluster.task_name, {
        "global_step": progress.global_step, "local_steps": progress.local_steps, "loss": _fmt(progress.loss, 4),
        "accuracy": _fmt(progress.accuracy, 3), **held_out, "seconds": f"{time.monotonic() - start:.1f}"})
    return exit_codes.OK, not signalled


def _final_evaluation(cfg, checkpoint) -> dict[str, str]:
    """Evaluates the final checkpoint on (a bounded part of) the held-out split and logs it: the
    figure that says what the job trained, where the last batch's loss says little. Returns the
    fields for the 'finished:' line."""
    try:
        step, metrics = evaluator.evaluate(cfg, checkpoint, max_examples=evaluator.FINAL_EVAL_EXAMPLES)
    except (FileNotFoundError, tf.errors.NotFoundError) as err:  # no held-out split beside the data
        logging.warning("%s: no held-out evaluation of the final checkpoint: %s (--eval_data_dir names one)",
                        cfg.cluster.task_name, err)
        return {}
    except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as err:
        # Only the held-out data's: a final checkpoint that cannot be read is no finished job.
        bad_record = inputs.bad_record_message(err.message)
        if bad_record is None and not (isinstance(err, tf.errors.DataLossError) and _input_data_loss(err)):
            raise
        # Training reached its end and its checkpoint (and export) stand: the job is done, its figure is not.
        logging.error("%s: no held-out evaluation of the final checkpoint: %s (the held-out data; "
                      "--skip_bad_records skips bad records)", cfg.cluster.task_name,
                      bad_record or log_lines.error_cause(err.message))
        return {}
    logging.info("%s: final checkpoint (global step %d): %s", cfg.cluster.task_name, step,
                 evaluator.describe(metrics))
    return {f"heldout_{name}": f"{value:.4f}" if isinstance(value, float) else str(value)
            for name, value in metrics.items()}


def _fmt(value, digits):
    return "n/a" if value is None else f"{value:.{digits}f}"
