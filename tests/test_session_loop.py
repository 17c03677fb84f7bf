"""The training session loop's graph: the global step its hooks fetch with every run."""

import pytest


def _ops_of_control_flow(graph) -> list[str]:
    return [op.type for op in graph.get_operations() if op.type in ("If", "StatelessIf", "Switch", "Merge")]


@pytest.mark.inprocess
def test_the_hooks_fetch_a_plain_read_of_the_global_step_and_stop_where_they_did():
    import tensorflow as tf
    from tensorflow.python.training import training_util

    from ps_trainer.training import session_loop
    v1 = tf.compat.v1
    # TensorFlow's own cached read is a cond on the variable being initialized: control flow run at every step.
    with tf.Graph().as_default() as graph:
        v1.train.get_or_create_global_step()
        training_util._get_or_create_global_step_read()  # noqa: SLF001  (what TF's hooks call)
        assert _ops_of_control_flow(graph)
    with tf.Graph().as_default() as graph:
        step = v1.train.get_or_create_global_step()
        weight = v1.get_variable("weight", [], initializer=v1.ones_initializer())
        train_op = v1.train.GradientDescentOptimizer(0.1).minimize(weight * weight, global_step=step)
        session_loop.plain_global_step_read()
        session_loop.plain_global_step_read()  # made once
        [read] = graph.get_collection(training_util.GLOBAL_STEP_READ_KEY)
        assert training_util._get_or_create_global_step_read() is read  # noqa: SLF001
        with v1.train.MonitoredTrainingSession(hooks=[v1.train.StopAtStepHook(last_step=7)],
                                               log_step_count_steps=1) as session:
            runs = 0
            while not session.should_stop():
                session.run(train_op)
                runs += 1
        assert runs == 7 and not _ops_of_control_flow(graph)
