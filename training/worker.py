"""The worker role: builds this replica's graph (training/graph.py) and its hooks
(training/worker_hooks.py), trains it to --train_steps in MonitoredTrainingSessions (training/session_loop.py),
and ends: tells the ps tasks it is done, and the chief exports the model and evaluates it on held-out data.

run() -> the exit code; train() -> Trained, what training ended with."""

import dataclasses
import os
import time

import tensorflow as tf
from absl import logging

from ps_trainer import input as inputs
from ps_trainer.input import work_queue
from ps_trainer.model.dynamic import storage as table_storage
from ps_trainer.cluster import peers, placement, shutdown, spec
from ps_trainer.training import checkpoints, chief_claim, evaluator, exit_codes, export, log_lines, preemption
from ps_trainer.training import plan, resume, run_record, session_loop, worker_hooks
from ps_trainer.training import graph as train_graph
from ps_trainer.training import momentum
from ps_trainer.training.step import update

v1 = tf.compat.v1

@dataclasses.dataclass(frozen=True)
class Trained:
    """What training ended with."""
    global_step: int  # the global step at the end
    last_step: int  # the step training was to end at: --train_steps, or where the input queue's epochs ended
    own_steps: int  # the training steps this worker ran itself
    loss: float | None  # the last logged batch's (None: no step run)
    accuracy: float | None
    over_at_start: bool = False  # training was over before this worker began (the chief's done mark)


def wait_for_ps(cluster, timeout_secs, timeout_setting: str = "--startup_timeout_secs"):
    """Returns once every ps task listens; a transient Failure naming the missing ones after timeout_secs."""
    ps_tasks = {f"ps {index}": address for index, address in enumerate(cluster.ps_hosts)}
    try:
        peers.wait_for_peers(ps_tasks, timeout_secs, cluster.task_name, timeout_setting=timeout_setting)
    except peers.PeersUnreachable as err:
        raise exit_codes.Failure(str(err), exit_codes.PS_UNREACHABLE) from None


def train(cfg, server=None, stop=None, task_metrics=None) -> Trained:
    """Trains to --train_steps, or until `stop` (a Preemption) is requested."""
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
        raise exit_codes.Failure(
            f"{cfg.cluster.task_name}: --join_address needs the input queue, and this job reads fixed shards (its "
            f"checkpoint {checkpoint} was saved with them)", exit_codes.BAD_FLAGS)
    logging.info("%s: the checkpoint to resume (%s) was saved by a run that read fixed shards: this run reads them "
                 "too, not the input queue (which needs a new --model_dir)", cfg.cluster.task_name, checkpoint)
    return dataclasses.replace(cfg, data=dataclasses.replace(data, input_queue=False, input_queue_by_default=False))


def _train(cfg, server, stop, task_metrics) -> Trained:
    cluster, train_cfg = cfg.cluster, cfg.train
    graph = train_graph.build_graph(cfg, stop.requested.is_set if stop else None)
    log_startup(cfg, task_metrics, graph.input_queue.feed.queue.num_files if graph.input_queue else None)
    hooks = worker_hooks.make_hooks(cfg, graph, stop, task_metrics)
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
        last_step = min(over, train_cfg.train_steps)
        if cluster.is_chief:
            resume.check_final_checkpoint(train_cfg.model_dir, last_step, cluster.task_name)
        return Trained(over, last_step, own_steps=0, loss=None, accuracy=None, over_at_start=True)
    if cluster.is_distributed:
        wait_for_ps(cluster, train_cfg.startup_timeout_secs)
    if cluster.is_chief:
        resume.check_and_record(cfg, graph.input_queue)
    try:
        ended = session_loop.train_to_the_end(cfg, server.target if server else "", _sessions(cfg, graph, hooks), stop)
    except tf.errors.InvalidArgumentError as err:
        error = training_error(err, cluster, train_cfg.model_dir, hooks.progress.global_step)
        if error is None:
            raise
        raise error from None
    except tf.errors.DataLossError as err:
        if not _input_data_loss(err):
            raise
        raise exit_codes.Failure(
            f"{cluster.task_name}: {log_lines.error_cause(err.message)} (an input file is corrupt: a gzipped one "
            "whose data is damaged, say; replace it and restart)", exit_codes.BAD_DATA) from None
    except tf.errors.NotFoundError as err:  # an input file that went away while training read it
        raise exit_codes.Failure(
            f"{cluster.task_name}: {log_lines.error_cause(err.message)} (an input file is gone; put it back and "
            "restart: the checkpoints keep what was trained)", exit_codes.BAD_DATA) from None
    finally:
        hooks.stall_watchdog.stop()
    if hooks.not_learning and hooks.not_learning.failure:
        raise exit_codes.Failure(hooks.not_learning.failure, exit_codes.NOT_LEARNING)
    progress = hooks.progress
    return Trained(ended.global_step, ended.last_step, progress.own_steps, progress.loss, progress.accuracy)


def _sessions(cfg, graph, hooks) -> session_loop.Sessions:
    """This worker's training sessions: its graph's step, saver and hooks."""
    cluster = cfg.cluster
    warm = graph.warm_load if cluster.is_chief else None
    scaffold = v1.train.Scaffold(saver=graph.saver, init_fn=warm.init_fn if warm else None)
    return session_loop.Sessions(
        train_op=graph.step.train_op, scaffold=scaffold,
        hooks=hooks.all, chief_only_hooks=list(graph.step.chief_only_hooks), uninitialized=graph.uninitialized,
        config=spec.session_config(cluster), progress=hooks.progress, input_queue=graph.input_queue,
        not_learning=hooks.not_learning,
        peer_refusal=lambda: run_record.peer_refusal(run_record.read(cfg.train.model_dir), cfg))


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


def log_momentum(task_name, train_cfg):
    """Says once which momentum is in use and why; warns about a combination known not to learn."""
    choice = train_cfg.momentum_choice
    if train_cfg.optimizer not in momentum.OPTIMIZERS_WITH_MOMENTUM or choice is None:
        return
    logging.info("%s: %s, %s", task_name, train_cfg.optimizer, choice.reason)
    if choice.warning:
        logging.warning("%s: %s", task_name, choice.warning)


def training_error(err, cluster, model_dir: str, global_step: int | None):
    """The one-line Failure of an InvalidArgumentError that ended training: a NaN loss the runtime's update
    refused, a full dynamic table, a bad input record; else None."""
    if update.NON_FINITE_LOSS in err.message:
        after = f" after global step {global_step}" if global_step is not None else ""
        return exit_codes.Failure(
            f"{cluster.task_name}: the loss became NaN or Inf{after}; "
            f"training stopped before applying it, so the latest checkpoint in {model_dir} "
            "is the last good one. Lower --learning_rate or check the data.", exit_codes.NON_FINITE_LOSS)
    full = table_storage.full_table_message(err.message)
    if full:
        return exit_codes.Failure(f"{cluster.task_name}: {full}", exit_codes.TABLE_FULL)
    bad_record = inputs.bad_record_message(err.message)
    if bad_record:
        return exit_codes.Failure(f"{cluster.task_name}: {bad_record} (--skip_bad_records skips such records, "
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


def saved_final(cluster, model_dir: str, global_step: int, last_step: int) -> str:
    """The chief's final checkpoint, once training reached last_step; a transient Failure (CHECKPOINT_NOT_SAVED)
    if the newest one holds less (its final save failed). Raised before the ps tasks are told training is over:
    they keep the trained variables for a restarted chief to save."""
    final = tf.train.latest_checkpoint(model_dir)
    if (checkpoints.checkpoint_step(final) or 0) < last_step:
        raise exit_codes.Failure(
            f"{cluster.task_name}: trained to global step {global_step}, but its final checkpoint could not be saved "
            f"in {model_dir} (the newest is {final}); restart once the storage takes it",
            exit_codes.CHECKPOINT_NOT_SAVED)
    return final


def preempted(cluster, model_dir: str, global_step: int, log=logging.warning) -> int:
    """Logs that a training replica stopped for a preemption at global_step (the chief: what its last save holds)
    and returns its exit code. Not done: the ps tasks keep serving for its restart."""
    saved = _saved_at_preemption(model_dir) if cluster.is_chief else ""
    log("%s preempted at global step %s%s; restart it to resume", cluster.task_name, global_step, saved)
    return exit_codes.PREEMPTED


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
        os._exit(code)
    return code


def _run(cfg, server, task_metrics) -> tuple[int, bool]:
    """run()'s training and ending: the exit code, and whether to leave without the interpreter's shutdown."""
    start = time.monotonic()
    stop = preemption.Preemption(cfg.cluster.task_name, ps_hosts=cfg.cluster.ps_hosts).install()
    if cfg.cluster.joins:  # before it trains: the ps tasks then wait for it to finish too
        other = shutdown.held_elsewhere(cfg.train.model_dir, cfg.cluster.replica_index, cfg.cluster.join_address)
        if other:
            raise exit_codes.Failure(
                f"--task_index={cfg.cluster.task_index}: a worker at {other} joined the job with that index and "
                "still serves; give each joining worker an index of its own", exit_codes.BAD_FLAGS)
        shutdown.join(cfg.train.model_dir, cfg.cluster.replica_index, cfg.cluster.join_address)
    trained = train(cfg, server, stop, task_metrics)
    if stop.requested.is_set():
        return preempted(cfg.cluster, cfg.train.model_dir, trained.global_step), False
    if trained.global_step < trained.last_step:  # train() returns only at the end; never exit 0 short of it
        raise exit_codes.Failure(f"{cfg.cluster.task_name}: training ended at global step {trained.global_step}, "
                                 f"short of --train_steps={cfg.train.train_steps}")
    final_checkpoint = None
    if cfg.cluster.is_chief:
        final_checkpoint = saved_final(cfg.cluster, cfg.train.model_dir, trained.global_step, trained.last_step)
    signalled = True
    if server is not None and trained.over_at_start:  # the ps tasks read the mark, if any is left
        shutdown.mark_done(cfg.train.model_dir, cfg.cluster.replica_index, trained.global_step,
                           cfg.train.train_steps, cfg.train.num_epochs)
    elif server is not None:
        signalled = shutdown.report_done(server, cfg.cluster, cfg.train.model_dir, trained.global_step,
                                         cfg.train.train_steps, cfg.train.num_epochs)
    held_out = {}
    if cfg.cluster.is_chief:
        if cfg.train.export_saved_model:
            export.export(cfg, final_checkpoint)
        held_out = _final_evaluation(cfg, final_checkpoint)
        if task_metrics:
            task_metrics.held_out({name[len("heldout_"):]: float(value) for name, value in held_out.items()})
    log_lines.log_finished(cfg.cluster.task_name, {
        "global_step": trained.global_step, "local_steps": trained.own_steps, "loss": _fmt(trained.loss, 4),
        "accuracy": _fmt(trained.accuracy, 3), **held_out, "seconds": f"{time.monotonic() - start:.1f}"})
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
