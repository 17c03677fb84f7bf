"""A small convolutional net for 28x28x1 images: two conv/pool blocks and a dense layer."""

import tensorflow as tf

from ps_trainer.model import layers, spec
from ps_trainer.model.needs import Needs

NEEDS = Needs()  # nothing particular of the trainer


def check(data_spec):
    return layers.needs_image(data_spec)


def logits(features, model_cfg, data_spec, training):
    images, num_classes = layers.image_input(features), data_spec.num_classes
    # oneDNN's convolution fails on a batch of no images once gradients are built ("input depth must be
    # evenly divisible by filter depth"), and a sync worker with nothing to read sends one
    # (input/work_queue.py): an empty batch gets a blank image, whose logits are dropped.
    size = tf.shape(images)[0]
    images = tf.pad(images, [[0, tf.maximum(1 - size, 0)], [0, 0], [0, 0], [0, 0]])
    net = layers.max_pool(layers.conv2d(images, 32, 5, "conv1"))
    net = layers.max_pool(layers.conv2d(net, 64, 5, "conv2"))
    net = layers.dense(layers.flatten(net), 256, "fc1", activation=tf.nn.relu)
    return layers.dense(net, num_classes, "logits")[:size]


# The model on the contract (model/spec.py): its logits, and their cross-entropy given labels.
model_fn = spec.classifier(logits)
