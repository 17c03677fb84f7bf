"""Each learning-rate schedule's value at a few global steps, and gradient clipping, exactly."""

import math

import numpy as np
import pytest
import tensorflow as tf

from tests.support import read_flags, tf_session
from ps_trainer.training import schedules
from ps_trainer.training.step import update
from ps_trainer.training.config import TrainConfig

v1 = tf.compat.v1


def rates(cfg, steps):
    with tf.Graph().as_default():
        step = v1.placeholder(tf.int64, [])
        rate = schedules.learning_rate(step, cfg)
        with tf_session() as sess:
            return [float(sess.run(rate, {step: s})) for s in steps]


@pytest.mark.parametrize("settings, steps, expected", [
    (dict(), [0, 500, 999], [0.1, 0.1, 0.1]),
    (dict(lr_schedule="exponential", decay_steps=100, decay_rate=0.5), [0, 100, 250], [0.1, 0.05, 0.1 * 0.5 ** 2.5]),
    (dict(lr_schedule="exponential", decay_steps=100, decay_rate=0.5, staircase=True), [99, 250], [0.1, 0.025]),
    (dict(lr_schedule="polynomial", end_learning_rate=0.01), [0, 500, 1000, 2000], [0.1, 0.055, 0.01, 0.01]),
    (dict(lr_schedule="cosine"), [0, 500, 1000], [0.1, 0.05, 0.0]),
    (dict(lr_schedule="piecewise", lr_boundaries=(100, 200), lr_factors=(1, 0.1, 0.01)), [100, 101, 201],
     [0.1, 0.01, 0.001]),
    (dict(warmup_steps=10), [0, 4, 9, 500], [0.01, 0.05, 0.1, 0.1]),
    (dict(lr_schedule="cosine", warmup_steps=100), [49, 500], [0.5 * 0.05 * (1 + math.cos(math.pi * 0.049)), 0.05]),
])
@pytest.mark.inprocess
def test_each_schedule_at_a_few_steps(settings, steps, expected):
    cfg = TrainConfig(learning_rate=0.1, train_steps=1000, **settings)
    np.testing.assert_allclose(rates(cfg, steps), expected, rtol=1e-5, atol=1e-7)


@pytest.mark.pure
def test_schedule_flags_read_and_checked():
    cfg = read_flags("--learning_rate_schedule=piecewise", "--lr_boundaries=10,20", "--lr_factors=1,0.5,0.25").train
    assert (cfg.lr_boundaries, cfg.lr_factors) == ((10, 20), (1.0, 0.5, 0.25))
    with pytest.raises(Exception, match="one more than the boundaries"):
        read_flags("--learning_rate_schedule=piecewise", "--lr_boundaries=10,20", "--lr_factors=1,0.5")
    scaled = read_flags("--ps_hosts=127.0.0.1:1", "--worker_hosts=127.0.0.1:2,127.0.0.1:3", "--job_name=worker",
                        "--task_index=0", "--sync_replicas", "--learning_rate=0.1", "--scale_learning_rate_by_replicas")
    assert math.isclose(scaled.train.learning_rate, 0.2)


@pytest.mark.inprocess
def test_gradients_are_clipped_by_their_global_norm():
    with tf.Graph().as_default():
        step = v1.train.get_or_create_global_step()
        weights = v1.get_variable("w", initializer=[0.0, 0.0])
        loss = tf.reduce_sum(weights * tf.constant([30.0, 40.0]))  # gradient (30, 40), global norm 50
        applied = update.apply_update(loss, v1.train.GradientDescentOptimizer(1.0), step, clip_norm=5.0)
        with tf_session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(applied)
            np.testing.assert_allclose(sess.run(weights), [-3.0, -4.0], rtol=1e-6)
            assert sess.run(v1.get_default_graph().get_tensor_by_name("global_norm_of_gradients:0")) == 50.0
            summaries = [op for op in v1.get_default_graph().get_operations() if op.type == "ScalarSummary"]
            assert [sess.run(op.inputs[0]) for op in summaries] == [b"gradient_global_norm"]  # the tag as written


@pytest.mark.inprocess
def test_wide_and_deep_optimizer_gives_the_wide_part_ftrl_and_the_deep_part_adagrad():
    from ps_trainer.model import needs
    from ps_trainer.training import optimizers
    with tf.Graph().as_default():
        step = v1.train.get_or_create_global_step()
        with v1.variable_scope("any_name"), needs.wide_part():  # the model's declaration, not the name, decides
            wide = v1.get_variable("user/table", initializer=[0.0, 0.0])
        with v1.variable_scope("wide"):
            deep = v1.get_variable("hidden0/kernel", initializer=[1.0, 1.0])
        loss = tf.reduce_sum(wide * 2.0) + tf.reduce_sum(deep * deep)
        assert read_flags("--model=wide_deep", "--dataset=clicks").train.optimizer == "ftrl_adagrad"
        optimizer = optimizers.make_optimizer(0.05, TrainConfig(optimizer="ftrl_adagrad"))
        update = optimizer.apply_gradients(optimizer.compute_gradients(loss), global_step=step)
        assert optimizer.get_slot(wide, "linear") is not None and optimizer.get_slot(deep, "accumulator") is not None
        with tf_session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(update)
            assert sess.run(step) == 1
            assert np.all(sess.run(wide) < 0) and np.all(sess.run(deep) < 1)
