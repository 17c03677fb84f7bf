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


def _graphs_in_events(model_dir) -> int:
    import tensorflow as tf
    return sum(event.HasField("graph_def") for path in tf.io.gfile.glob(f"{model_dir}/events.out.tfevents.*")
               for event in tf.compat.v1.train.summary_iterator(path))


@pytest.mark.inprocess
@pytest.mark.parametrize("save_graph_def", [True, False])
def test_the_chiefs_saves_write_the_graph_with_its_first_session_and_a_checkpoint_at_each_sessions_start(
        tmp_path, save_graph_def):
    """A chief's session is made again after a ps restarts, with the same graph: the hook writes graph.pbtxt and
    the graph in the events file once, saves the step each session starts at, and each .meta holds the same
    bytes, which import_meta_graph reads; with save_graph_def=False (checkpoint_save_graph_def) neither file."""
    import tensorflow as tf
    from google.protobuf import text_format

    from ps_trainer.training import checkpoints, session_loop
    from tests.support import tf_session
    v1 = tf.compat.v1
    with tf.Graph().as_default():
        step = v1.train.get_or_create_global_step()
        weight = v1.get_variable("weight", [], initializer=v1.ones_initializer())
        train_op = v1.train.GradientDescentOptimizer(0.1).minimize(weight * weight, global_step=step)
        session_loop.plain_global_step_read()
        scaffold = v1.train.Scaffold(saver=checkpoints.LiveStateSaver(checkpoints.report_uninitialized(),
                                                                      sharded=True, max_to_keep=10))
        hook = session_loop.ChiefSaverHook(str(tmp_path), None, 2, scaffold, save_graph_def=save_graph_def)
        graphs = []  # the graphs in the events file after each session
        for last in (3, 6):  # a session to step 3, then one made again with the same hook, to step 6
            with v1.train.MonitoredTrainingSession(
                    checkpoint_dir=str(tmp_path), scaffold=scaffold, save_checkpoint_secs=None,
                    save_checkpoint_steps=None, save_summaries_steps=None, save_summaries_secs=None,
                    log_step_count_steps=None, chief_only_hooks=[hook, v1.train.StopAtStepHook(last_step=last)]
            ) as session:
                while not session.should_stop():
                    session.run(train_op)
            assert (tmp_path / "graph.pbtxt").exists() == (save_graph_def and last == 3), last
            if (tmp_path / "graph.pbtxt").exists():  # the graph with its shapes, in protobuf's text format
                written = text_format.Parse((tmp_path / "graph.pbtxt").read_text(), v1.GraphDef())
                assert written == v1.get_default_graph().as_graph_def(add_shapes=True)
            (tmp_path / "graph.pbtxt").unlink(missing_ok=True)  # written again would show
            graphs.append(_graphs_in_events(tmp_path))
        trained = v1.train.load_variable(str(tmp_path), "weight")
    state = v1.train.get_checkpoint_state(str(tmp_path))
    assert [int(path.rsplit("-", 1)[1]) for path in state.all_model_checkpoint_paths] == [0, 2, 3, 5, 6]
    assert not (tmp_path / "graph.pbtxt").exists() and graphs[0] == graphs[1] > 0
    metas = sorted(tmp_path.glob("model.ckpt-*.meta"))
    if not save_graph_def:
        assert metas == []
        return
    assert len(metas) == 5 and len({meta.read_bytes() for meta in metas}) == 1
    with tf.Graph().as_default(), tf_session() as sess:
        v1.train.import_meta_graph(str(metas[-1])).restore(sess, state.model_checkpoint_path)
        [restored] = [variable for variable in v1.global_variables() if variable.op.name == "weight"]
        assert sess.run(restored) == trained != 1
