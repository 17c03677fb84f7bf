"""Multi-layer perceptron over flattened images: the default model."""

import tensorflow as tf

from ps_trainer.model import layers, spec
from ps_trainer.model.needs import Needs

NEEDS = Needs()  # nothing particular of the trainer


def check(data_spec):
    return layers.needs_image(data_spec)


def logits(features, model_cfg, data_spec, training):
    images, num_classes = layers.image_input(features), data_spec.num_classes
    net = layers.flatten(images)
    for i, units in enumerate(model_cfg.hidden_units):
        net = layers.dense(net, units, f"hidden{i}", activation=tf.nn.relu)
    return layers.dense(net, num_classes, "logits")


# The model on the contract (model/spec.py): its logits, and their cross-entropy given labels.
model_fn = spec.classifier(logits)
