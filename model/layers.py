"""The few layer helpers tf.contrib.layers used to give, from get_variable and tf.nn.

Variables are created with tf.compat.v1.get_variable so that replica_device_setter places them on
the ps and checkpoints name them by scope.
"""

import tensorflow as tf

v1 = tf.compat.v1


def masked(values, mask):
    """The entries of `values` (along its first axis) where the 1-D bool `mask` holds: what
    tf.boolean_mask gives, in 5 graph ops instead of its 27. A dynamic table's graph masks some 60
    times (model/dynamic/, training/incremental.py), and each op costs the graph's build."""
    return tf.gather(values, tf.reshape(tf.where(mask), [-1]))


def dense(inputs, units, name, activation=None):
    with v1.variable_scope(name):
        kernel = v1.get_variable("kernel", [inputs.shape[-1], units],
                                 initializer=v1.glorot_uniform_initializer())
        bias = v1.get_variable("bias", [units], initializer=v1.zeros_initializer())
        outputs = tf.nn.bias_add(tf.matmul(inputs, kernel), bias)
        return activation(outputs) if activation else outputs


def conv2d(inputs, filters, kernel_size, name, activation=tf.nn.relu):
    """SAME-padded, stride-1 convolution over NHWC inputs."""
    with v1.variable_scope(name):
        kernel = v1.get_variable("kernel", [kernel_size, kernel_size, inputs.shape[-1], filters],
                                 initializer=v1.glorot_uniform_initializer())
        bias = v1.get_variable("bias", [filters], initializer=v1.zeros_initializer())
        outputs = tf.nn.bias_add(tf.nn.conv2d(inputs, kernel, strides=1, padding="SAME"), bias)
        return activation(outputs) if activation else outputs


def max_pool(inputs, size=2):
    return tf.nn.max_pool2d(inputs, ksize=size, strides=size, padding="SAME")


def flatten(inputs):
    return tf.reshape(inputs, [-1, inputs.shape[1:].num_elements()])


def needs_image(data_spec):
    if "image" not in data_spec.features:
        return "this model reads images: use --dataset=synthetic, idx or tfrecord (image), or --model=wide_deep"
    return None


def image_input(features):
    """Raw uint8 images as floats in [0, 1]."""
    return tf.cast(features["image"], tf.float32) / 255.0
