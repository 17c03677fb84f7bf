"""Multi-layer perceptron over flattened images: the default model."""

import tensorflow as tf

from ps_trainer.model import layers
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
