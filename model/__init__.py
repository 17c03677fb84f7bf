"""Models by name, each a TF1 model_fn on one contract (model/spec.py): the trainer's own (mlp, cnn,
wide_deep) and a user's (`model_fn`, --model_fn=FILE:FUNCTION: model/user_fn.py). build() calls it and adds
the batch metrics.

A model is a module that has what `Model` names. Adding one, dense or sparse, is one new file and one
line in MODELS. Models take raw features (uint8 images, float numbers, strings) and do their own
preprocessing in the graph, so an exported model serves raw features too.
"""

import dataclasses
from typing import NamedTuple, Protocol

import tensorflow as tf

from ps_trainer.model import cnn, mlp, spec, user_fn, wide_deep
from ps_trainer.model.graph_tables import GraphTables
from ps_trainer.model.needs import Needs


class Model(Protocol):
    """What a model module has (MODELS' values)."""

    # What it needs of the trainer (its own default optimizer, tables cut across the ps tasks): Needs() for
    # nothing particular.
    NEEDS: Needs

    def check(self, data_spec) -> str | None:
        """A problem with the data (a feature it needs and the data lacks), or None."""

    def model_fn(self, features, labels, mode: str, params: spec.Params) -> spec.EstimatorSpec:
        """The batch's raw features to a spec whose predictions are the logits, [batch, classes], and, given
        labels (TRAIN and EVAL), whose loss is the one to train, 0 for an empty batch (TRAIN: it may add rows
        to dynamic tables; spec.classifier makes one from a forward pass)."""


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
    # How a multi-valued column's embeddings of an example combine: "sum", "mean" or "sqrtn" (model/multi_valued.py).
    combiner: str = "mean"
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
    own_update: spec.OwnUpdate | None = None  # a model_fn's own train_op (model/user_fn.py), run as written
    # Its embedding tables (model/graph_tables.py): for the optimizer's update, the checkpoints and the upkeep.
    graph_tables: GraphTables | None = None


def needs_of(name: str) -> Needs:
    """What the model named `name` declares it needs of the trainer."""
    return MODELS[name].NEEDS


def has_tables(name: str, embedding: str) -> bool:
    """Whether the model named `name` keeps embedding tables on the ps with --embedding=`embedding`: tables
    it declares (Needs.partitioned_tables), or its model_fn's dynamic columns with --embedding=dynamic."""
    needs = needs_of(name)
    return needs.partitioned_tables or (needs.dynamic_columns and embedding == "dynamic")


def check(model_cfg: ModelConfig, data_spec) -> str | None:
    return MODELS[model_cfg.name].check(data_spec)


def logits_of(features, model_cfg: ModelConfig, data_spec, graph_tables: GraphTables) -> tf.Tensor:
    """The model alone in PREDICT mode, features to logits: what is exported (it only reads dynamic
    tables), its tables recorded in `graph_tables`."""
    model_fn = MODELS[model_cfg.name].model_fn
    return spec.logits_of(model_fn(features, None, spec.ModeKeys.PREDICT,
                                   spec.Params(model_cfg, data_spec, graph_tables)))


def build(features, labels, model_cfg: ModelConfig, data_spec, summaries: bool = True,
          training: bool = False, graph_tables: GraphTables | None = None) -> ModelOutput:
    """The model's spec in TRAIN mode (`training`: it may add rows to dynamic tables) or EVAL mode, its
    loss, and batch metrics (0 for an empty batch), with their summaries unless told not to. Its tables go
    in `graph_tables` (a model built again into one graph shares its first build's), or in new ones."""
    graph_tables = graph_tables or GraphTables()
    count = tf.cast(tf.size(labels), tf.float32)
    mode = spec.ModeKeys.TRAIN if training else spec.ModeKeys.EVAL
    model_spec = MODELS[model_cfg.name].model_fn(features, labels, mode,
                                                 spec.Params(model_cfg, data_spec, graph_tables))
    logits = spec.logits_of(model_spec)
    probabilities = tf.nn.softmax(logits, name="probabilities")
    correct = tf.equal(tf.argmax(logits, axis=1, output_type=labels.dtype), labels)
    accuracy = tf.math.divide_no_nan(tf.reduce_sum(tf.cast(correct, tf.float32)), count, name="batch_accuracy")
    auc = batch_auc(labels, probabilities[:, 1]) if data_spec.num_classes == 2 else None
    output = ModelOutput(logits, probabilities, model_spec.loss, accuracy, auc,
                         spec.own_update(model_spec) if training else None, graph_tables)
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
