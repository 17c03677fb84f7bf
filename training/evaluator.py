"""The evaluator role: outside the cluster, it follows --model_dir and evaluates each new checkpoint
on the held-out split, writing summaries to <model_dir>/eval so TensorBoard shows them beside the
training curves. It exits after evaluating the checkpoint of the final step. A checkpoint it cannot
read (a shard cut short, a missing index) is named in one line and skipped, and it waits for the
next: it never stops on one, nor evaluates a model from scratch in its place. A chief that ends in a permanent
error ends it too (exit 1, with the chief's reason: cluster/shutdown.py). The run's model, data
settings and last step come from <model_dir>/run.json (training/run_record.py), not from its own
flags, so it builds the graph the checkpoints hold."""

import time

import numpy as np
import tensorflow as tf
from absl import logging

from ps_trainer import input as inputs
from ps_trainer import model
from ps_trainer.cluster import model_dir as layout
from ps_trainer.cluster import shutdown, spec
from ps_trainer.training import checkpoints, ending, gauc, log_lines, run_record

v1 = tf.compat.v1
EVAL_BATCH = 500
# What the chief evaluates at the end of training: enough for a figure to two digits, bounded so
# that a large held-out split does not hold the end of the job.
FINAL_EVAL_EXAMPLES = 10000


class EvaluationTimeout(Exception):
    pass


class UnreadableCheckpoint(Exception):
    pass


def evaluate(cfg, checkpoint: str, max_examples: int | None = None) -> tuple[int, dict[str, float]]:
    """(global step, {'loss', 'accuracy'[, 'auc'][, 'gauc', 'gauc_groups', 'gauc_skipped']}) of
    `checkpoint` over the held-out split: all of it, or its first `max_examples`."""
    graph = tf.Graph()
    with graph.as_default():
        global_step = v1.train.get_or_create_global_step()
        dataset = inputs.batches(cfg.data, inputs.Shard(0, 1), EVAL_BATCH, split="eval", repeat=False)
        if max_examples:
            dataset = dataset.unbatch().take(max_examples).batch(EVAL_BATCH)
        features, labels = v1.data.make_one_shot_iterator(dataset).get_next()
        output = model.build(features, labels, cfg.model, inputs.spec(cfg.data))
        metrics = {"loss": v1.metrics.mean(output.loss, weights=tf.shape(labels)[0]),
                   "accuracy": v1.metrics.mean(output.accuracy, weights=tf.shape(labels)[0])}
        if output.auc is not None:  # over the whole split, not averaged per batch
            metrics["auc"] = v1.metrics.auc(labels, output.probabilities[:, 1], num_thresholds=1000)
        # --group_column: each batch's (group, label, score), for the group AUC over the whole split.
        grouped = ((features[cfg.data.group_column], labels, output.probabilities[:, 1])
                   if cfg.data.group_column else None)
        saver = v1.train.Saver()  # the variables and the tables (model/dynamic/storage.py's ID -> row maps)
        deltas = checkpoints.delta_restorer(output.graph_tables, checkpoint)
        init_metrics = v1.local_variables_initializer()
        updates = [update for _, update in metrics.values()]
        results = {name: value for name, (value, _) in metrics.items()}
        with v1.Session(config=spec.graph_rewrites()) as sess:
            try:
                checkpoints.restore_with_deltas(sess, saver.restore, deltas, checkpoint)
            except checkpoints.UNREADABLE as err:
                raise UnreadableCheckpoint(f"checkpoint {checkpoint} cannot be read "
                                           f"({log_lines.error_cause(str(err))})") from err
            sess.run(init_metrics)
            step = int(sess.run(global_step))
            batches = []
            while True:
                try:
                    if grouped is None:
                        sess.run(updates)
                    else:
                        batches.append(sess.run((updates, grouped))[1])
                except tf.errors.OutOfRangeError:
                    break
            figures = {name: float(value) for name, value in sess.run(results).items()}
    if grouped is not None:  # no batch at all: an empty split, whose group AUC is NaN of 0 groups
        by_group = gauc.group_auc(*(np.concatenate(parts) for parts in zip(*batches)) if batches else ([], [], []))
        figures.update(gauc=by_group.value, gauc_groups=by_group.groups, gauc_skipped=by_group.skipped)
    return step, figures


def describe(metrics: dict[str, float]) -> str:
    auc = f" auc {metrics['auc']:.3f}" if "auc" in metrics else ""
    grouped = (f" gauc {metrics['gauc']:.3f} ({metrics['gauc_groups']:.0f} groups; {metrics['gauc_skipped']:.0f} of "
               "one class skipped)" if "gauc" in metrics else "")
    return f"held-out loss {metrics['loss']:.4f} accuracy {metrics['accuracy']:.3f}{auc}{grouped}"


def run(cfg) -> None:
    train = cfg.train
    writer = v1.summary.FileWriter(layout.eval_dir(train.model_dir))
    step = None
    followed = None
    chief_failure = shutdown.ChiefFailure(train.model_dir)
    wait_secs = min(train.eval_timeout_secs, shutdown.MARK_CHECK_SECS)  # reads the chief's failure mark between waits
    waiting_since = time.monotonic()  # the start, or the end of the last checkpoint's evaluation

    def given_up() -> bool:
        failed = chief_failure.reason()
        if failed is not None:
            raise ending.with_the_chief("evaluator", failed)
        return time.monotonic() - waiting_since >= train.eval_timeout_secs

    try:
        for checkpoint in checkpoints.new_checkpoints(train.model_dir, wait_secs, given_up):
            run_cfg, followed = _following_the_run(cfg, followed)
            try:
                step, metrics = evaluate(run_cfg, checkpoint)
            except UnreadableCheckpoint as err:
                logging.error("evaluator: %s: skipped; waiting for the next one", err)
                waiting_since = time.monotonic()
                continue
            waiting_since = time.monotonic()
            summary = v1.Summary(value=[v1.Summary.Value(tag=k, simple_value=v) for k, v in metrics.items()])
            writer.add_summary(summary, step)
            writer.flush()
            logging.info("evaluator: step %d: %s", step, describe(metrics))
            if step >= run_cfg.train.train_steps:
                logging.info("evaluator: evaluated the final step's checkpoint; exiting")
                return
    finally:
        writer.close()
    raise EvaluationTimeout(
        f"evaluator: no new checkpoint in {train.model_dir} for {train.eval_timeout_secs} s "
        f"(--eval_timeout_secs); last evaluated step: {step}")


def _following_the_run(cfg, logged):
    """cfg as the run in model_dir has it (re-read at each checkpoint: a rerun may train further), and
    what was last logged about it, so each change is said once."""
    record = run_record.read(cfg.train.model_dir)
    if record is None:
        if logged != "own":
            logging.warning("evaluator: %s has no %s (a run of an older trainer?): using this task's own flags",
                            cfg.train.model_dir, layout.RUN_RECORD)
        return cfg, "own"
    run_cfg, changed = run_record.follow(cfg, record)
    if changed != logged:
        logging.info("evaluator: following the run in %s: %s", cfg.train.model_dir,
                     " ".join(changed) or "its settings match this task's flags")
    return run_cfg, changed
