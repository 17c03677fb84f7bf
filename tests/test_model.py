"""Model output shapes and metrics, in one process."""

import numpy as np
import pytest
import tensorflow as tf

import model

v1 = tf.compat.v1


@pytest.mark.parametrize("name", sorted(model.MODELS))
def test_model_gives_logits_a_scalar_loss_and_accuracy(name):
    with tf.Graph().as_default():
        images = tf.constant(np.random.RandomState(0).rand(5, 28, 28, 1), tf.float32)
        labels = tf.constant([0, 1, 2, 3, 9], tf.int64)
        out = model.build(images, labels, model.ModelConfig(name=name, hidden_units=(32, 16)), 10)
        assert out.logits.shape.as_list() == [5, 10]
        assert out.loss.shape.as_list() == [] and out.accuracy.shape.as_list() == []
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            loss, accuracy, summary = sess.run([out.loss, out.accuracy, v1.summary.merge_all()])
        tags = {value.tag for value in tf.compat.v1.Summary.FromString(summary).value}
        assert tags == {"loss", "accuracy"}
        assert 0.5 < loss < 10 and 0.0 <= accuracy <= 1.0


def test_mlp_layers_follow_hidden_units():
    with tf.Graph().as_default():
        model.build(tf.zeros([2, 28, 28, 1]), tf.zeros([2], tf.int64),
                    model.ModelConfig(hidden_units=(64, 32)), 10)
        shapes = {v.name: v.shape.as_list() for v in v1.global_variables()}
    assert shapes == {
        "mlp/hidden0/kernel:0": [784, 64], "mlp/hidden0/bias:0": [64],
        "mlp/hidden1/kernel:0": [64, 32], "mlp/hidden1/bias:0": [32],
        "mlp/logits/kernel:0": [32, 10], "mlp/logits/bias:0": [10],
    }
