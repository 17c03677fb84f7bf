"""Models by name: each turns a batch of images into logits; build() adds loss and metrics.

Adding a model is one new file with a logits(images, cfg, num_classes) function and one line in
MODELS.
"""

import dataclasses
from typing import NamedTuple

import tensorflow as tf

from model import cnn, mlp

MODELS = {
    "mlp": mlp.logits,
    "cnn": cnn.logits,
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    name: str = "mlp"
    hidden_units: tuple[int, ...] = (256,)


class ModelOutput(NamedTuple):
    logits: tf.Tensor
    loss: tf.Tensor
    accuracy: tf.Tensor


def build(images, labels, cfg: ModelConfig, num_classes: int) -> ModelOutput:
    """Logits, mean cross-entropy loss and batch accuracy, with their summaries."""
    with tf.compat.v1.variable_scope(cfg.name):
        logits = MODELS[cfg.name](images, cfg, num_classes)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits),
                          name="cross_entropy")
    correct = tf.equal(tf.argmax(logits, axis=1, output_type=labels.dtype), labels)
    accuracy = tf.reduce_mean(tf.cast(correct, tf.float32), name="batch_accuracy")
    tf.compat.v1.summary.scalar("loss", loss)
    tf.compat.v1.summary.scalar("accuracy", accuracy)
    return ModelOutput(logits, loss, accuracy)
