"""train_and_evaluate: each role of a TF_CONFIG cluster on this project's runtime. A ps serves until every
training replica has finished and returns (cluster/shutdown.py); the chief and the workers train to
max_steps and tell the ps tasks; the evaluator evaluates each new checkpoint and returns after the one
at max_steps. Without a cluster in TF_CONFIG it trains to max_steps in this process, then evaluates."""

import collections
import threading
import time

import tensorflow as tf
from absl import logging

from ps_trainer.cluster import model_dir as layout
from ps_trainer.cluster import shutdown, spec
from ps_trainer.training import checkpoints, log_lines
from ps_trainer.training.config import NO_STEP_LIMIT  # max_steps=None: a ps waits for the replicas' own ends
CHECKPOINT_POLL_SECS = 1.0


class TrainSpec(collections.namedtuple("TrainSpec", ["input_fn", "max_steps", "hooks"])):
    def __new__(cls, input_fn, max_steps=None, hooks=None):
        if not callable(input_fn):
            raise TypeError("TrainSpec: input_fn must be callable")
        if max_steps is not None and max_steps <= 0:
            raise ValueError(f"TrainSpec: max_steps must be positive, not {max_steps}")
        return super().__new__(cls, input_fn, max_steps, tuple(hooks or ()))


class EvalSpec(collections.namedtuple("EvalSpec", ["input_fn", "steps", "name", "hooks", "exporters",
                                                   "start_delay_secs", "throttle_secs"])):
    def __new__(cls, input_fn, steps=100, name=None, hooks=None, exporters=None, start_delay_secs=120,
                throttle_secs=600):
        if not callable(input_fn):
            raise TypeError("EvalSpec: input_fn must be callable")
        if steps is not None and steps <= 0:
            raise ValueError(f"EvalSpec: steps must be positive or None, not {steps}")
        exporters = tuple(exporters) if isinstance(exporters, (list, tuple)) else ((exporters,) if exporters else ())
        names = [exporter.name for exporter in exporters]
        if len(set(names)) != len(names):
            raise ValueError(f"EvalSpec: exporters need names of their own: {names}")
        return super().__new__(cls, input_fn, steps, name, tuple(hooks or ()), exporters, start_delay_secs,
                               throttle_secs)


def train_and_evaluate(estimator, train_spec: TrainSpec, eval_spec: EvalSpec):
    """Runs this task's role. As TF1's: in one process it returns (the evaluation's metrics, the exports its
    exporters made); on a cluster, None (the evaluator logs each evaluation's metrics: 'Saving dict for
    global step N: ...')."""
    config = estimator.config
    cluster = config.cluster
    if config.task_type == spec.EVALUATOR:
        _evaluate_each_checkpoint(estimator, train_spec, eval_spec)
        return None
    if not cluster.is_distributed:
        estimator.train(train_spec.input_fn, hooks=train_spec.hooks, max_steps=train_spec.max_steps)
        checkpoint = estimator.latest_checkpoint()
        metrics = estimator.evaluate(eval_spec.input_fn, steps=eval_spec.steps, hooks=eval_spec.hooks,
                                     checkpoint_path=checkpoint, name=eval_spec.name)
        return metrics, _export(estimator, eval_spec, checkpoint, metrics, is_the_final_export=True)
    server = spec.start_server(cluster)
    train_steps = train_spec.max_steps or NO_STEP_LIMIT
    if cluster.job_name == spec.PS:
        logging.info("ps %d: serving on %s for %d training replica(s)", cluster.task_index,
                     cluster.ps_hosts[cluster.task_index], cluster.num_replicas)
        shutdown.wait_for_every_replica(server, cluster, estimator.model_dir, train_steps, threading.Event())
        logging.info("ps %d: every training replica finished; exiting", cluster.task_index)
        return None
    step = estimator._train(train_spec.input_fn, hooks=train_spec.hooks,  # pylint: disable=protected-access
                            max_steps=train_spec.max_steps, target=server.target)
    shutdown.report_done(server, cluster, estimator.model_dir, step, train_steps)
    log_lines.log_trained_to(cluster.task_name, step)
    return None


def _evaluate_each_checkpoint(estimator, train_spec, eval_spec) -> tuple[dict, list]:
    """Evaluates every new checkpoint (no sooner than throttle_secs after the last evaluation began, but
    the final one at once), each followed by EvalSpec's exporters, and returns the final one's metrics and
    exports: the checkpoint at max_steps. As in TF1, a run whose input ends before max_steps leaves it
    waiting."""
    evaluated, started, metrics = None, float("-inf"), None
    train_steps = train_spec.max_steps or NO_STEP_LIMIT
    while True:
        newest = estimator.latest_checkpoint()
        step = checkpoints.checkpoint_step(newest)
        final = step is not None and step >= train_steps
        due = final or time.monotonic() - started >= eval_spec.throttle_secs
        if newest != evaluated and newest is not None and due:
            started, evaluated = time.monotonic(), newest
            try:
                metrics = estimator.evaluate(eval_spec.input_fn, steps=eval_spec.steps, hooks=eval_spec.hooks,
                                             checkpoint_path=newest, name=eval_spec.name)
            except (ValueError, tf.errors.NotFoundError) as err:
                if final or tf.io.gfile.glob(newest + ".index"):
                    raise
                # The chief's saver removed it meanwhile (keep_checkpoint_max): a newer one is there.
                logging.info("evaluator: checkpoint %s was removed while it was read (%s); taking the newest",
                             newest, type(err).__name__)
                continue
            exports = _export(estimator, eval_spec, newest, metrics, is_the_final_export=final)
            if final:
                return metrics, exports
        time.sleep(CHECKPOINT_POLL_SECS)


def _export(estimator, eval_spec, checkpoint, metrics, is_the_final_export) -> list:
    """Runs EvalSpec's exporters after an evaluation, each into <model_dir>/export/<name>; the exports made."""
    made = []
    for exporter in eval_spec.exporters:
        exported = exporter.export(estimator, layout.export_dir(estimator.model_dir, exporter.name), checkpoint,
                                   metrics, is_the_final_export)
        if exported is not None:
            logging.info("exporter %s: wrote %s", exporter.name, exported.decode())
            made.append(exported)
    return made
