"""Models by name: each turns a batch of raw features into logits; build() adds loss and metrics. A user's
own TF1 model_fn is one too (`model_fn`, --model_fn=FILE:FUNCTION: model/user_fn.py), whose loss is its own.

A model is a module that has what `Model` names. Adding one, dense or sparse, is one new file and one
line in MODELS. Models take raw
features (uint8 images, float numbers, strings) and do their own preprocessing in the graph, so an
exported model serves raw features too.
"""

import dataclasses
from typing import NamedTuple, Protocol

import tensorflow as tf

from ps_trainer.model import cnn, mlp, user_fn, wide_deep
from ps_trainer.model.needs import Needs


class Model(Protocol):
    """What a model module has (MODELS' values)."""

    # What it needs of the trainer (its own default optimizer, tables cut across the ps tasks): Needs() for
    # nothing particular.
    NEEDS: Needs

    def check(self, data_spec) -> str | None:
        """A problem with the data (a feature it needs and the data lacks), or None."""

    def logits(self, features, model_cfg: "ModelConfig", data_spec, training: bool) -> tf.Tensor:
        """The batch's raw features to logits, [batch, classes] (`training`: it may add rows to dynamic
        tables)."""


MODELS: dict[str, Model] = {
    "mlp": mlp,
    "cnn": cnn,
    "wide_deep": wide_deep,
    "model_fn": user_fn,
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    name: str = "mlp"
    hidden_units: tuple[int, ...] = (256,)
    # wide_deep: rows of each hashed embedding table, their width, and how many shards each
    # table is cut into (flags/config.py's default: model.needs' table_shards, whole tables spread over
    # the ps tasks when they spread evenly, else one shard per ps).
    hash_buckets: int = 10000
    embedding_dim: int = 16
    embedding_partitions: int = 1
    # wide_deep: "hashed" (the tables above) or "dynamic" (model/dynamic/: a row per raw ID, with
    # embedding_capacity rows per table, held from the start or, with embedding_growth, a limit that the
    # storage grows to with the IDs met; an ID admitted at its embedding_min_count-th sighting).
    embedding: str = "hashed"
    embedding_capacity: int = 100000
    embedding_growth: bool = False
    embedding_min_count: int = 1
    embedding_steps_to_live: int = 0
    # Training marks the table rows it changes, for incremental checkpoints (model/touched_rows.py).
    mark_touched_rows: bool = False
    # Where each shard of a table lives, the ps tasks in order: set for the training graph of a
    # cluster only (the evaluator and the export build the model on no particular device).
    table_devices: tuple[str, ...] = ()
    # model_fn: the user's function (FILE.py:FUNCTION) and its params, as --model_fn_params' key=value pairs.
    model_fn: str = ""
    model_fn_params: tuple = ()


class ModelOutput(NamedTuple):
    logits: tf.Tensor
    probabilities: tf.Tensor
    loss: tf.Tensor
    accuracy: tf.Tensor
    auc: tf.Tensor | None  # for two classes: the batch's ROC AUC of class 1


def needs_of(name: str) -> Needs:
    """What the model named `name` declares it needs of the trainer."""
    return MODELS[name].NEEDS


def check(model_cfg: ModelConfig, data_spec) -> str | None:
    return MODELS[model_cfg.name].check(data_spec)


def logits_of(features, model_cfg: ModelConfig, data_spec, training: bool = False) -> tf.Tensor:
    """The model alone, features to logits: what training builds (`training`: it may add rows to
    dynamic tables) and what is evaluated and exported (it only reads them)."""
    with tf.compat.v1.variable_scope(model_cfg.name):
        return MODELS[model_cfg.name].logits(features, model_cfg, data_spec, training)


def build(features, labels, model_cfg: ModelConfig, data_spec, summaries: bool = True,
          training: bool = False) -> ModelOutput:
    """Logits, mean cross-entropy loss and batch metrics (0 for an empty batch), with their summaries
    unless told not to."""
    # Means that are 0 for an empty batch, with no gradient: a sync worker with nothing to read in a
    # round sends one (input/work_queue.py), a share that adds nothing to the round.
    count = tf.cast(tf.size(labels), tf.float32)
    if model_cfg.name == "model_fn":  # the user's model_fn, with its own loss
        with tf.compat.v1.variable_scope(model_cfg.name):
            spec = user_fn.spec_of(model_cfg, features, labels, user_fn.TRAIN if training else user_fn.EVAL)
        logits = user_fn.logits_of(model_cfg, spec)
        loss = tf.cond(count > 0, lambda: tf.cast(spec.loss, tf.float32), lambda: tf.constant(0.0),
                       name="cross_entropy")
    else:
        logits = logits_of(features, model_cfg, data_spec, training)
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        loss = tf.math.divide_no_nan(tf.reduce_sum(losses), count, name="cross_entropy")
    probabilities = tf.nn.softmax(logits, name="probabilities")
    correct = tf.equal(tf.argmax(logits, axis=1, output_type=labels.dtype), labels)
    accuracy = tf.math.divide_no_nan(tf.reduce_sum(tf.cast(correct, tf.float32)), count, name="batch_accuracy")
    auc = batch_auc(labels, probabilities[:, 1]) if data_spec.num_classes == 2 else None
    output = ModelOutput(logits, probabilities, loss, accuracy, auc)
    if summaries:
        summarize(output)
    return output


def summarize(output: ModelOutput):
    """Scalar summaries of the loss and batch metrics."""
    tf.compat.v1.summary.scalar("loss", output.loss)
    tf.compat.v1.summary.scalar("accuracy", output.accuracy)
    if output.auc is not None:
        tf.compat.v1.summary.scalar("auc", output.auc)


def batch_auc(labels, scores):
    """ROC AUC within one batch: the share of (positive, negative) pairs ranked right, ties half."""
    positive = tf.cast(tf.equal(labels, 1), tf.float32)
    negative = 1.0 - positive
    difference = scores[:, None] - scores[None, :]
    right = tf.cast(difference > 0, tf.float32) + 0.5 * tf.cast(tf.equal(difference, 0), tf.float32)
    pairs = tf.reduce_sum(positive) * tf.reduce_sum(negative)
    return tf.math.divide_no_nan(tf.reduce_sum(positive[:, None] * negative[None, :] * right), pairs,
                                 name="batch_auc")
