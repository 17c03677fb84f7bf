"""The speed levers: --steps_per_run (several training steps in one session.run) and --wire_dtype
(16-bit variables and gradients on the wire), each still training correctly."""

import math

import pytest
import tensorflow as tf

import input as inputs
import model
from cluster import spec
from tests.support import in_process_cluster
from training import graph as train_graph
from training import hooks as training_hooks
from training.config import RunConfig, TrainConfig

pytestmark = pytest.mark.inprocess

v1 = tf.compat.v1


def train(tmp_path, data_cfg, model_cfg, steps_per_run, train_steps, wire_dtype="float32", cluster=None,
          local_steps=1, optimizer="momentum"):
    """Trains to train_steps in a MonitoredTrainingSession, in this process or as the one worker of
    `cluster` (a ClusterConfig, server target); returns the steps each run took, the global step
    after each, the progress hook, the checkpoint steps kept and the number of variables."""
    cluster_cfg, target = cluster or (spec.ClusterConfig(), "")
    cfg = RunConfig(cluster_cfg, TrainConfig(train_steps=train_steps, steps_per_run=steps_per_run, batch_size=32,
                                             learning_rate=0.1, wire_dtype=wire_dtype,
                                             local_steps=local_steps, optimizer=optimizer),
                    model_cfg, data_cfg)
    runs = []
    with tf.Graph().as_default():
        graph = train_graph.build_graph(cfg)
        progress = training_hooks.ProgressHook("local:0", graph.loss, graph.accuracy, train_steps, 32, every_n=20,
                                               steps_done=graph.steps_done, steps_per_run=steps_per_run)
        global_step = v1.train.get_global_step()
        with v1.train.MonitoredTrainingSession(master=target, checkpoint_dir=str(tmp_path),
                                               hooks=graph.hooks + [progress],
                                               save_checkpoint_steps=20, save_summaries_steps=None,
                                               save_summaries_secs=None, log_step_count_steps=0) as sess:
            while not sess.should_stop():
                if graph.steps_done is None:
                    sess.run(graph.train_op)
                    done = 1
                else:  # train_op is the loop; steps_done, its count
                    done = sess.run(graph.steps_done)
                reached = sess.run_step_fn(lambda step_context: step_context.session.run(global_step))
                runs.append((int(done), int(reached)))
        variables = len(v1.global_variables())
    state = v1.train.get_checkpoint_state(str(tmp_path))
    saved = sorted(int(path.split("-")[-1]) for path in state.all_model_checkpoint_paths)
    return runs, progress, saved, variables


@pytest.mark.parametrize("name,data", [("mlp", inputs.DataConfig(synthetic_examples=2000)),
                                       ("wide_deep", inputs.DataConfig(name="clicks"))])
def test_several_steps_per_run_stop_exactly_at_train_steps(tmp_path, name, data):
    runs, progress, saved, variables = train(tmp_path, data, model.ModelConfig(name=name), steps_per_run=10,
                                             train_steps=95)
    # Ten steps a run, the last run cut at --train_steps; then a run that takes none, after which
    # StopAtStepHook (which reads the step before a run) stops the session.
    assert runs == [(10, 10 * i) for i in range(1, 10)] + [(5, 95), (0, 95)]
    assert progress.local_steps == 95 and progress.global_step == 95
    chance = math.log(inputs.spec(data).num_classes)
    assert progress.loss < 0.9 * chance, progress.loss  # it trained
    assert saved[-1] == 95 and all(step % 10 == 0 for step in saved[:-1])  # checkpoints between runs
    # The loop reused the variables and the optimizer's slots; it made none of its own.
    with tf.Graph().as_default():
        _, _, _, single_run_variables = train(tmp_path / "one", data, model.ModelConfig(name=name), 1, 2)
    assert variables == single_run_variables


@pytest.mark.parametrize("wire_dtype", ["bfloat16", "float16"])
def test_training_converges_with_16_bit_variables_and_gradients_on_the_wire(tmp_path, wire_dtype):
    servers, _, (cluster,) = in_process_cluster(num_workers=1, num_ps=1)
    data = inputs.DataConfig(synthetic_examples=2000)
    _, progress, saved, _ = train(tmp_path, data, model.ModelConfig(), 1, 300, wire_dtype, (cluster, servers[0].target))
    assert progress.loss < 0.5 * math.log(10), progress.loss
    # The ps kept float32 masters: the checkpoint holds float32 variables.
    reader = tf.train.load_checkpoint(str(tmp_path))
    dtypes = reader.get_variable_to_dtype_map()
    assert dtypes["mlp/hidden0/kernel"] == tf.float32 and saved[-1] == 300
