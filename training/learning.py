"""A run that knows when it is not learning.

A job whose loss sits at chance looks healthy: steps complete, checkpoints are written, every
process exits 0. Beside the NaN guard, each worker compares its training loss, averaged over a log
interval (never one batch), with chance: the cross-entropy of always predicting the label
frequencies it saw in that interval (their entropy; ln 10 for 10 balanced classes). After a warm-up,
PATIENCE intervals in a row at or above THRESHOLD times chance, and either above chance or with
no fall of more than 1 - TREND across them, mean the model is not learning: the worker logs why and what to change and,
with --not_learning=stop (the default), stops with an error instead of training on. No constant prediction
does better than chance (the entropy of the interval's own labels), so a loss held more than 1 - THRESHOLD
under it is the features at work: a sparse model on weak signal can sit a few percent below chance for a
long time, falling slowly or settled (a click model's loss a few percent under the labels' entropy can be
all its data allows), and is learning (docs/learning.md gives a measured case).
"""

import math

import numpy as np
import tensorflow as tf
from absl import logging


v1 = tf.compat.v1
PATIENCE = 3
THRESHOLD = 0.99
TREND = 0.97  # the last of the PATIENCE intervals at least this share of the first: not falling
WARMUP_FRACTION = 0.2  # of --train_steps, in global steps ...
WARMUP_MIN_STEPS = 300  # ... and at least this many


def warmup_steps(train_steps: int) -> int:
    return max(int(WARMUP_FRACTION * train_steps), WARMUP_MIN_STEPS)


def label_entropy(counts) -> float:
    """Cross-entropy of predicting the label frequencies `counts` themselves: chance for those labels."""
    counts = np.asarray(counts, np.float64)
    total = counts.sum()
    if total <= 0:
        return 0.0
    shares = counts[counts > 0] / total
    return float(-(shares * np.log(shares)).sum())


def likely_cause(train_cfg, own_update: bool = False) -> str:
    """What to change, in the user's words; `own_update`: a model_fn's own train_op makes the update, so the
    trainer's optimizer flags do not apply."""
    if own_update:
        return ("a learning rate too high in the model_fn's own optimizer (its train_op makes the update: "
                "try a tenth of it), or labels that do not follow from the features (check the data)")
    warning = train_cfg.momentum_choice.warning if train_cfg.momentum_choice else None
    if warning and train_cfg.optimizer in ("momentum", "rmsprop"):
        return warning
    return (f"a learning rate too high for this model (--learning_rate={train_cfg.learning_rate:g}: try a "
            "tenth of it), or labels that do not follow from the features (check the data)")


class NotLearningHook(v1.train.SessionRunHook):
    """Watches the interval-mean training loss against chance; see the module docstring.

    `failure` holds the one-line reason once it has stopped training (action 'stop').
    """

    def __init__(self, task_name, loss, labels, num_classes, every_n_runs, warmup_global_steps, action, cause):
        self._task_name = task_name
        self._loss, self._labels, self._num_classes = loss, labels, num_classes
        self._every_n_runs = max(1, every_n_runs)
        self._warmup = warmup_global_steps
        self._action = action
        self._cause = cause
        self._runs = 0
        self._loss_sum = 0.0
        self._counts = np.zeros(num_classes, np.int64)
        self._strikes = []  # (mean loss, chance) of the intervals in a row at chance
        self._label_counts = None
        self.failure = None

    def begin(self):
        if self._label_counts is not None:  # built by an earlier session (the graph may be finalized now)
            return
        labels = tf.cast(self._labels, tf.int32)
        self._label_counts = tf.math.bincount(labels, minlength=self._num_classes, maxlength=self._num_classes,
                                              dtype=tf.int64)
        self._global_step = v1.train.get_global_step()

    def before_run(self, run_context):
        return v1.train.SessionRunArgs([self._loss, self._label_counts, self._global_step])

    def after_run(self, run_context, run_values):
        loss, counts, global_step = run_values.results
        self._runs += 1
        # Weighed by the batch's examples: a sync worker's empty batch (--input_queue) has loss 0 and says nothing.
        examples = int(np.sum(counts))
        if examples:
            self._loss_sum += float(loss) * examples
        self._counts += counts
        if self._runs % self._every_n_runs:
            return
        examples, chance = int(self._counts.sum()), label_entropy(self._counts)
        mean = self._loss_sum / max(examples, 1)
        self._loss_sum, self._counts = 0.0, np.zeros_like(self._counts)
        if not examples:  # an interval of empty batches only
            return
        at_chance = global_step >= self._warmup and not (math.isfinite(mean) and mean < THRESHOLD * chance)
        self._strikes = self._strikes + [(mean, chance)] if at_chance else []
        if len(self._strikes) < PATIENCE:
            return
        # Below chance and still falling is learning, however slowly; at or above chance is not.
        if math.isfinite(mean) and mean < chance and mean < TREND * self._strikes[-PATIENCE][0]:
            return
        losses = ", ".join(f"{m:.3f}" for m, _ in self._strikes[-PATIENCE:])
        message = (f"{self._task_name}: not learning: the training loss averaged {losses} over the last "
                   f"{PATIENCE} log intervals, at or above chance ({chance:.3f}: always predicting the label "
                   f"frequencies), at global step {int(global_step)}. Likely cause: {self._cause}")
        if self._action == "stop":
            self.failure = message + ". Stopped (--not_learning=warn trains on)."
            logging.error("%s", self.failure)
            run_context.request_stop()
        else:
            logging.warning("%s.", message)
