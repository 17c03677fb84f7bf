"""Multi-layer perceptron over flattened images: the default model."""

import tensorflow as tf

from model import layers


def logits(images, cfg, num_classes):
    net = layers.flatten(images)
    for i, units in enumerate(cfg.hidden_units):
        net = layers.dense(net, units, f"hidden{i}", activation=tf.nn.relu)
    return layers.dense(net, num_classes, "logits")
