"""TF 2.x's early stopping (tf.estimator.experimental.stop_if_*_hook, make_early_stopping_hook): a training hook
that ends training once a function of the evaluations so far says so.

The chief's hook calls the function every run_every_secs (or run_every_steps) and, when it returns True, sets
the boolean variable `signal_early_stopping/STOP` (on a ps, as every variable) and ends its own training; each
other replica's hook reads that variable with every step and ends its training once it is set. The stop_if_*
functions read the evaluations' summaries in the Estimator's eval_dir, which the evaluator (or a master, or
train_and_evaluate in one process) writes after each evaluation. Training so ended is over: the chief's last
checkpoint is at the step it stopped at, and every task exits 0.
"""

import collections
import operator
import os

import tensorflow as tf
from tensorflow.python.platform import tf_logging as logging  # tf.compat.v1.logging: where a program looks

v1 = tf.compat.v1

STOP_SCOPE, STOP_NAME = "signal_early_stopping", "STOP"  # TF's name of the variable, kept in checkpoints
_EVENT_FILES = "events.out.tfevents.*"


def make_early_stopping_hook(estimator, should_stop_fn, run_every_secs=60, run_every_steps=None):
    """A hook that ends training once `should_stop_fn()` returns True, called by the chief every run_every_secs
    seconds or run_every_steps steps (one of the two)."""
    from ps_trainer.estimator.estimator import Estimator  # noqa: PLC0415  (the package imports this module first)
    if not isinstance(estimator, Estimator):
        raise TypeError(f"`estimator` must have type `tf.estimator.Estimator`. Got: {type(estimator)}")
    if run_every_secs is not None and run_every_steps is not None:
        raise ValueError("Only one of `run_every_secs` and `run_every_steps` must be set.")
    if estimator.config.is_chief:
        return _StopOnPredicateHook(should_stop_fn, run_every_secs, run_every_steps)
    return _CheckForStoppingHook()


def stop_if_higher_hook(estimator, metric_name, threshold, eval_dir=None, min_steps=0, run_every_secs=60,
                        run_every_steps=None):
    """Ends training once an evaluation at a global step of min_steps or more has `metric_name` above
    `threshold`."""
    return _threshold_hook(estimator, metric_name, threshold, True, eval_dir, min_steps, run_every_secs,
                           run_every_steps)


def stop_if_lower_hook(estimator, metric_name, threshold, eval_dir=None, min_steps=0, run_every_secs=60,
                       run_every_steps=None):
    """Ends training once an evaluation at a global step of min_steps or more has `metric_name` below
    `threshold`."""
    return _threshold_hook(estimator, metric_name, threshold, False, eval_dir, min_steps, run_every_secs,
                           run_every_steps)


def stop_if_no_increase_hook(estimator, metric_name, max_steps_without_increase, eval_dir=None, min_steps=0,
                             run_every_secs=60, run_every_steps=None):
    """Ends training once `metric_name`'s best evaluation (from global step min_steps on) is
    max_steps_without_increase global steps or more behind a later one."""
    return _no_improvement_hook(estimator, metric_name, max_steps_without_increase, True, eval_dir, min_steps,
                                run_every_secs, run_every_steps)


def stop_if_no_decrease_hook(estimator, metric_name, max_steps_without_decrease, eval_dir=None, min_steps=0,
                             run_every_secs=60, run_every_steps=None):
    """Ends training once `metric_name`'s lowest evaluation (from global step min_steps on) is
    max_steps_without_decrease global steps or more behind a later one."""
    return _no_improvement_hook(estimator, metric_name, max_steps_without_decrease, False, eval_dir, min_steps,
                                run_every_secs, run_every_steps)


def read_eval_metrics(eval_dir) -> collections.OrderedDict:
    """{global step: {tag: value}} of the scalar summaries in eval_dir's event files, by step."""
    metrics = collections.defaultdict(dict)
    if tf.io.gfile.exists(eval_dir):
        for path in tf.io.gfile.glob(os.path.join(eval_dir, _EVENT_FILES)):
            try:
                for event in v1.train.summary_iterator(path):
                    values = {value.tag: value.simple_value for value in event.summary.value
                              if value.HasField("simple_value")}
                    if values:
                        metrics[event.step].update(values)
            except tf.errors.DataLossError as err:  # a file cut short: the events before the cut count
                logging.warning("Skipping rest of the file due to encountering data corruption error; file path: "
                                "%s; original error raised by `tf.train.summary_iterator`: %s", path, err)
    return collections.OrderedDict(sorted(metrics.items()))


def _threshold_hook(estimator, metric_name, threshold, higher, eval_dir, min_steps, run_every_secs,
                    run_every_steps):
    eval_dir = estimator.eval_dir() if eval_dir is None else eval_dir
    crossed = operator.gt if higher else operator.lt

    def threshold_crossed() -> bool:
        for step, metrics in read_eval_metrics(eval_dir).items():
            if step >= min_steps and crossed(metrics[metric_name], threshold):
                logging.info('At step %s, metric "%s" has value %s which is %s the configured threshold (%s) for '
                             "early stopping.", step, metric_name, metrics[metric_name],
                             "greater than" if higher else "less than", threshold)
                return True
        return False

    return make_early_stopping_hook(estimator, threshold_crossed, run_every_secs, run_every_steps)


def _no_improvement_hook(estimator, metric_name, max_steps, higher, eval_dir, min_steps, run_every_secs,
                         run_every_steps):
    eval_dir = estimator.eval_dir() if eval_dir is None else eval_dir
    better = operator.gt if higher else operator.lt

    def no_improvement() -> bool:
        best = best_step = None
        for step, metrics in read_eval_metrics(eval_dir).items():
            if step < min_steps:
                continue
            if best is None or better(metrics[metric_name], best):
                best, best_step = metrics[metric_name], step
            if step - best_step >= max_steps:
                logging.info('No %s in metric "%s" for %s steps, which is greater than or equal to max steps (%s) '
                             "configured for early stopping.", "increase" if higher else "decrease", metric_name,
                             step - best_step, max_steps)
                return True
        return False

    return make_early_stopping_hook(estimator, no_improvement, run_every_secs, run_every_steps)


def _stop_variable() -> tf.Variable:
    """The variable the chief sets to end every replica's training: made once in a graph, where the hook's
    begin() runs (the Estimator runs it under the graph's device setter, which puts it on a ps)."""
    with v1.variable_scope(STOP_SCOPE, values=[], reuse=v1.AUTO_REUSE):
        return v1.get_variable(STOP_NAME, shape=[], dtype=tf.bool, initializer=v1.initializers.constant(False),
                               collections=[v1.GraphKeys.GLOBAL_VARIABLES], trainable=False)


class _StopOnPredicateHook(v1.train.SessionRunHook):
    """The chief's: calls should_stop_fn on its timer; on True, sets the stop variable and ends training."""

    def __init__(self, should_stop_fn, run_every_secs=60, run_every_steps=None):
        if not callable(should_stop_fn):
            raise TypeError("`should_stop_fn` must be callable.")
        self._should_stop_fn = should_stop_fn
        self._timer = v1.train.SecondOrStepTimer(every_secs=run_every_secs, every_steps=run_every_steps)
        self._global_step = self._stop_op = None

    def begin(self):
        self._global_step = v1.train.get_global_step()
        self._stop_op = v1.assign(_stop_variable(), True)

    def before_run(self, run_context):
        return v1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        global_step = run_values.results
        if self._timer.should_trigger_for_step(global_step):
            self._timer.update_last_triggered_step(global_step)
            if self._should_stop_fn():
                logging.info("Requesting early stopping at global step %d", global_step)
                run_context.session.run(self._stop_op)
                run_context.request_stop()


class _CheckForStoppingHook(v1.train.SessionRunHook):
    """Another replica's: ends its training once the chief has set the stop variable."""

    def __init__(self):
        self._stop = None

    def begin(self):
        self._stop = _stop_variable()

    def before_run(self, run_context):
        return v1.train.SessionRunArgs(self._stop)

    def after_run(self, run_context, run_values):
        if run_values.results:
            logging.info("Early stopping requested, suspending run.")
            run_context.request_stop()
