"""The evaluator role: outside the cluster, it follows --model_dir and evaluates each new checkpoint
on the held-out split, writing summaries to <model_dir>/eval so TensorBoard shows them beside the
training curves. It exits after evaluating the checkpoint of the final step."""

import os

import tensorflow as tf
from absl import logging

import input as inputs
import model

v1 = tf.compat.v1
EVAL_BATCH = 500
# What the chief evaluates at the end of training: enough for a figure to two digits, bounded so
# that a large held-out split does not hold the end of the job.
FINAL_EVAL_EXAMPLES = 10000


class EvaluationTimeout(Exception):
    pass


def evaluate(cfg, checkpoint: str, max_examples: int | None = None) -> tuple[int, dict[str, float]]:
    """(global step, {'loss', 'accuracy'[, 'auc']}) of `checkpoint` over the held-out split: all of
    it, or its first `max_examples`."""
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
        saver = v1.train.Saver(v1.global_variables())
        init_metrics = v1.local_variables_initializer()
        updates = [update for _, update in metrics.values()]
        results = {name: value for name, (value, _) in metrics.items()}
        with v1.Session() as sess:
            saver.restore(sess, checkpoint)
            sess.run(init_metrics)
            step = int(sess.run(global_step))
            while True:
                try:
                    sess.run(updates)
                except tf.errors.OutOfRangeError:
                    break
            return step, {name: float(value) for name, value in sess.run(results).items()}


def describe(metrics: dict[str, float]) -> str:
    auc = f" auc {metrics['auc']:.3f}" if "auc" in metrics else ""
    return f"held-out loss {metrics['loss']:.4f} accuracy {metrics['accuracy']:.3f}{auc}"


def run(cfg) -> None:
    train = cfg.train
    writer = v1.summary.FileWriter(os.path.join(train.model_dir, "eval"))
    step = None
    try:
        for checkpoint in v1.train.checkpoints_iterator(train.model_dir, min_interval_secs=1,
                                                        timeout=train.eval_timeout_secs):
            step, metrics = evaluate(cfg, checkpoint)
            summary = v1.Summary(value=[v1.Summary.Value(tag=k, simple_value=v) for k, v in metrics.items()])
            writer.add_summary(summary, step)
            writer.flush()
            logging.info("evaluator: step %d: %s", step, describe(metrics))
            if step >= train.train_steps:
                logging.info("evaluator: evaluated the final step's checkpoint; exiting")
                return
    finally:
        writer.close()
    raise EvaluationTimeout(
        f"evaluator: no new checkpoint in {train.model_dir} for {train.eval_timeout_secs} s "
        f"(--eval_timeout_secs); last evaluated step: {step}")
