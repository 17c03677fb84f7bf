"""train_and_evaluate: each role of a TF_CONFIG cluster on the trainer's dispatch (training/roles.py). A ps
serves until every training replica has finished and returns (training/ps.py); the chief and the workers
train to max_steps and tell the ps tasks (a master, TF_CONFIG's older chief, also evaluates and exports as
TF1's did); the evaluator evaluates each new checkpoint and returns after the final one (at max_steps, or
where the chief's training ended). Without a cluster in TF_CONFIG it trains to max_steps in this process,
evaluating after its saves as a master does, then evaluates the final checkpoint."""

import collections
import time

import tensorflow as tf
from absl import app
from tensorflow.python.platform import tf_logging as logging  # tf.compat.v1.logging: where a program looks

from ps_trainer.cluster import model_dir as layout
from ps_trainer.cluster import shutdown
from ps_trainer.estimator import run_config, settings
from ps_trainer.training import (checkpoints, chief_claim, ending, exit_codes, log_lines, preemption, roles,
                                 worker)
from ps_trainer.training.config import NO_STEP_LIMIT  # NO_STEP_LIMIT: the replicas' own ends


class TrainSpec(collections.namedtuple("TrainSpec", ["input_fn", "max_steps", "hooks", "saving_listeners"])):
    """TF 2.x's: saving_listeners are called around the chief's saves."""

    def __new__(cls, input_fn, max_steps=None, hooks=None, saving_listeners=None):
        if not callable(input_fn):
            raise TypeError("TrainSpec: input_fn must be callable")
        if max_steps is not None and max_steps <= 0:
            raise ValueError(f"TrainSpec: max_steps must be positive, not {max_steps}")
        saving_listeners = tuple(saving_listeners or ())
        for listener in saving_listeners:
            if not isinstance(listener, tf.compat.v1.train.CheckpointSaverListener):
                raise TypeError(f"All saving_listeners must be `CheckpointSaverListener` instances, given: {listener}")
        return super().__new__(cls, input_fn, max_steps, tuple(hooks or ()), saving_listeners)


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
    global step N: ...'). A cluster task runs its role on the trainer's dispatch (training/roles.py) and,
    if it cannot reach its end, exits with the trainer's code for that ending and its one-line reason
    (README's exit codes): 138 for a ps not up within the startup timeout."""
    config = estimator.config
    if not config.cluster.job_name:  # one process: TF1's errors reach the program
        evaluations = _EvaluateAfterSaves(estimator, eval_spec)
        estimator.train(train_spec.input_fn, hooks=train_spec.hooks, max_steps=train_spec.max_steps,
                        saving_listeners=[*train_spec.saving_listeners, evaluations])
        return evaluations.final_evaluation()
    runtime = run_config.runtime_settings(config, config.cluster, train_spec.max_steps)
    code = ending.exit_code_of(lambda: _run_role(runtime, roles.Roles(
        train=lambda server, _: _train_replica(estimator, train_spec, eval_spec, runtime, server),
        evaluate=lambda: _evaluated_to_the_end(estimator, train_spec, eval_spec)), config.serving_checks))
    if code != exit_codes.OK:
        raise SystemExit(code)
    return None


def _run_role(runtime, door, checks) -> int:
    try:
        return roles.run(runtime, door, checks)
    except app.UsageError as err:  # a setting's refusal: trainer.py's flags are PS_TRAINER_FLAGS here
        raise exit_codes.Failure(f"{err} (an Estimator program's trainer flags: {settings.VARIABLE})",
                                 exit_codes.BAD_FLAGS) from None


def _evaluated_to_the_end(estimator, train_spec, eval_spec) -> int:
    _evaluate_each_checkpoint(estimator, train_spec, eval_spec)
    return exit_codes.OK


def _train_replica(estimator, train_spec, eval_spec, runtime, server) -> int:
    """A training replica (the chief, a master, a worker) waits for the ps tasks, trains to max_steps and tells
    the ps tasks; a master (TF_CONFIG's older chief) also evaluates and exports, as TF1's did: after a
    checkpoint save no sooner than throttle_secs after its last evaluation began, and the final checkpoint
    once training ends, with the final export. The chief first claims model_dir, as trainer.py's does
    (training/chief_claim.py), and gives it up at its end. SIGTERM or SIGINT stops it after its current step, as
    trainer.py's replicas (training/preemption.py): the chief saves a checkpoint of that step and it exits 143. A
    chief whose final save failed exits 138 before it tells the ps tasks, as trainer.py's. Returns the exit code."""
    cluster, start = runtime.cluster, time.monotonic()
    claim = None
    if cluster.is_chief:
        claim = chief_claim.claim(estimator.model_dir, cluster.own_address(), cluster.task_name)
    try:
        stop = preemption.Preemption(cluster.task_name, ps_hosts=cluster.ps_hosts).install()
        worker.wait_for_ps(cluster, runtime.train.startup_timeout_secs, estimator.config.startup_timeout_setting)
        evaluations = [_EvaluateAfterSaves(estimator, eval_spec)] if roles.evaluates_while_training(cluster) else []
        try:
            step = estimator._train(train_spec.input_fn, hooks=train_spec.hooks,  # noqa: SLF001  (the Estimator's own training, as train() runs it, on this task's server)
                                    max_steps=train_spec.max_steps,
                                    saving_listeners=[*train_spec.saving_listeners, *evaluations],
                                    target=server.target, stop=stop)
        except tf.compat.v1.train.NanLossDuringTrainingError:
            raise exit_codes.Failure(
                f"{cluster.task_name}: the loss became NaN or Inf (NanTensorHook stopped training); the latest "
                f"checkpoint in {estimator.model_dir} is the last good one. Lower the learning rate or check the data.",
                exit_codes.NON_FINITE_LOSS) from None
        except tf.errors.InvalidArgumentError as err:  # a full dynamic table, a NaN the runtime's update refused
            failure = worker.training_error(err, cluster, estimator.model_dir, global_step=None)
            if failure is None:
                raise
            raise failure from None
        if stop.requested.is_set():
            return worker.preempted(cluster, estimator.model_dir, step, logging.warning)
        config, last_step = estimator.config, runtime.train.train_steps
        if cluster.is_chief and step >= last_step and (config.save_checkpoints_steps or config.save_checkpoints_secs):
            worker.saved_final(cluster, estimator.model_dir, step, last_step)
        shutdown.report_done(server, cluster, estimator.model_dir, step, runtime.train.train_steps)
        log_lines.log_finished(cluster.task_name, {"global_step": step, "seconds": f"{time.monotonic() - start:.1f}"},
                               logging.info)
        for evaluation in evaluations:
            evaluation.final_evaluation()
    finally:
        if claim:
            claim.release()
    return exit_codes.OK


class _EvaluateAfterSaves(tf.compat.v1.train.CheckpointSaverListener):
    """The evaluations of a master, or of train_and_evaluate in one process, while it trains: after a save
    other than its training's first (the model as it was before any step), once throttle_secs have passed since
    the last one began (TF1's _NewCheckpointListenerForEvaluate). The summaries they write are what TF's
    early-stopping hooks read (early_stopping.py)."""

    def __init__(self, estimator, eval_spec):
        self._estimator, self._eval_spec, self._started = estimator, eval_spec, float("-inf")
        self._evaluated, self._metrics, self._saves = None, None, 0

    def after_save(self, session, global_step_value):
        self._saves += 1
        if self._saves > 1 and time.monotonic() - self._started >= self._eval_spec.throttle_secs:
            self._started = time.monotonic()
            self._evaluated = self._estimator.latest_checkpoint()
            self._metrics, _ = _evaluate_and_export(self._estimator, self._eval_spec, self._evaluated,
                                                    is_the_final_export=False)

    def final_evaluation(self) -> tuple[dict, list]:
        """The final checkpoint's evaluation (unless its save was just evaluated) and the final export: its
        metrics and the exports made."""
        final = self._estimator.latest_checkpoint()
        if final != self._evaluated:
            return _evaluate_and_export(self._estimator, self._eval_spec, final, is_the_final_export=True)
        return self._metrics, _export(self._estimator, self._eval_spec, final, self._metrics, is_the_final_export=True)


def _evaluate_and_export(estimator, eval_spec, checkpoint, is_the_final_export) -> tuple[dict, list]:
    metrics = estimator.evaluate(eval_spec.input_fn, steps=eval_spec.steps, hooks=eval_spec.hooks,
                                 checkpoint_path=checkpoint, name=eval_spec.name)
    return metrics, _export(estimator, eval_spec, checkpoint, metrics, is_the_final_export)


def _evaluate_each_checkpoint(estimator, train_spec, eval_spec) -> tuple[dict, list]:
    """Evaluates the new checkpoints as TensorFlow's checkpoints_iterator finds them (one begun within
    throttle_secs of the last evaluation is passed over, but the final one is evaluated at once), each
    followed by EvalSpec's exporters, and returns the final one's metrics and exports: the checkpoint at
    max_steps or, where the chief's training ended short of it (its input ran out, an early-stopping hook
    stopped it), the chief's last one, once the chief's done mark says it ended. A chief that ended in a permanent
    error ends it too (a permanent Failure naming the chief's reason)."""
    started, since, evaluated, metrics = float("-inf"), time.time(), None, None
    train_steps = train_spec.max_steps or NO_STEP_LIMIT
    chief_failure = shutdown.ChiefFailure(estimator.model_dir)

    def chief_ended() -> bool:
        failed = chief_failure.reason()
        if failed is not None:
            raise ending.with_the_chief("evaluator", failed)
        return shutdown.ended_since(estimator.model_dir, 0, train_steps, since) is not None

    for newest in checkpoints.new_checkpoints(estimator.model_dir, checkpoints.MIN_CHECKPOINT_WAIT_SECS, chief_ended):
        step = checkpoints.checkpoint_step(newest)
        final = step is not None and step >= train_steps
        if not final and chief_ended():  # its last save came before its mark
            newest, final = estimator.latest_checkpoint(), True
        if not final and time.monotonic() - started < eval_spec.throttle_secs:
            continue
        started = time.monotonic()
        try:
            metrics = estimator.evaluate(eval_spec.input_fn, steps=eval_spec.steps, hooks=eval_spec.hooks,
                                         checkpoint_path=newest, name=eval_spec.name)
        except (ValueError, tf.errors.NotFoundError) as err:
            if final or tf.io.gfile.glob(newest + ".index"):
                raise
            # The chief's saver removed it meanwhile (keep_checkpoint_max): a newer one is there.
            logging.info("evaluator: checkpoint %s was removed while it was read (%s); taking the newest",
                         newest, type(err).__name__)
            started = float("-inf")
            continue
        evaluated = newest
        exports = _export(estimator, eval_spec, newest, metrics, is_the_final_export=final)
        if final:
            return metrics, exports
    final = estimator.latest_checkpoint()  # the chief ended after its last checkpoint was found
    logging.info("evaluator: the chief's training ended at %s, short of max_steps", final)
    if final != evaluated:
        return _evaluate_and_export(estimator, eval_spec, final, is_the_final_export=True)
    return metrics, _export(estimator, eval_spec, final, metrics, is_the_final_export=True)


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
