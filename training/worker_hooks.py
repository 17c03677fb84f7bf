"""The session hooks a worker trains with: the step's own, then progress, the stall watchdog, preemption,
not-learning, the tables' upkeep, delta checkpoints, live rows and profiling."""

from typing import NamedTuple

import tensorflow as tf

from ps_trainer import input as inputs
from ps_trainer.cluster import model_dir as layout
from ps_trainer.model.dynamic import storage as table_storage, upkeep as table_upkeep
from ps_trainer.training import hooks as training_hooks
from ps_trainer.training import learning, preemption, watchdog

v1 = tf.compat.v1


class WorkerHooks(NamedTuple):
    """The session hooks of this worker, with the ones its training loop reads back."""
    all: list
    progress: training_hooks.ProgressHook
    stall_watchdog: watchdog.StallWatchdog
    not_learning: learning.NotLearningHook | None


def make_hooks(cfg, graph, stop=None, task_metrics=None) -> WorkerHooks:
    """The hooks of this worker's graph (training/graph.py); `stop`: its Preemption, if any."""
    cluster, train_cfg = cfg.cluster, cfg.train
    progress = training_hooks.ProgressHook(
        cluster.task_name, graph.step.metrics.loss, graph.step.metrics.accuracy, train_cfg.train_steps,
        train_cfg.batch_size * train_cfg.accumulate_batches,
        train_cfg.log_every_n_steps, summary_dir=layout.worker_dir(train_cfg.model_dir, cluster.task_dir),
        steps_done=graph.step.steps_done, steps_per_run=train_cfg.step_path.steps_per_run,
        measure_staleness=cluster.is_distributed and not train_cfg.sync_replicas, metrics=task_metrics)
    stall_watchdog = watchdog.for_task(cluster, train_cfg)
    # The input queue's hook after the step's: in sync mode a step's batch counts once its round is applied.
    hooks = [*graph.step.hooks] + ([graph.input_queue] if graph.input_queue else []) + [progress, stall_watchdog] + (
        [preemption.PreemptionHook(stop)] if stop else [])
    not_learning = None
    if train_cfg.not_learning != "off":
        not_learning = learning.NotLearningHook(
            cluster.task_name, graph.step.metrics.loss, graph.step.labels, inputs.spec(cfg.data).num_classes,
            every_n_runs=train_cfg.log_every_n_steps // train_cfg.step_path.steps_per_run,
            warmup_global_steps=learning.warmup_steps(train_cfg.train_steps), action=train_cfg.not_learning,
            cause=learning.likely_cause(train_cfg, graph.own_update))
        hooks.append(not_learning)
    if graph.tables.needs:
        hooks.append(training_hooks.TableUpkeepHook(graph.tables, table_upkeep.UPKEEP_EVERY_N_RUNS))
    if cluster.is_chief and graph.saver.deltas is not None:
        hooks.append(training_hooks.DeltaSaverHook(graph.saver, train_cfg.model_dir, train_cfg.incremental_save_secs))
    live_rows = v1.get_collection(table_storage.LIVE_ROWS)
    if live_rows and cluster.is_chief:
        hooks.append(training_hooks.LiveRowsHook(cluster.task_name, live_rows, train_cfg.log_every_n_steps))
    if train_cfg.profile_steps:
        hooks.append(training_hooks.ProfileHook(cluster.task_name, *train_cfg.profile_steps,
                                                layout.profile_dir(train_cfg.model_dir, cluster.task_dir)))
    return WorkerHooks(hooks, progress, stall_watchdog, not_learning)
