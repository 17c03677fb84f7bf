"""Placement, tested on the real training graph with no server: variables on the ps, ops on the worker."""

import pytest
import tensorflow as tf

from ps_trainer import input as inputs
from ps_trainer import model
from ps_trainer.cluster import placement, spec
from ps_trainer.model import needs
from ps_trainer.training import graph as train_graph
from ps_trainer.training import plan
from ps_trainer.training.step import sync as sync_training
from ps_trainer.training.config import RunConfig, TrainConfig

pytestmark = pytest.mark.pure

v1 = tf.compat.v1


def cluster(num_ps, task=1, num_gpus=None):
    workers = tuple(f"w{i}:1" for i in range(max(2, task + 1)))
    return spec.ClusterConfig(tuple(f"ps{i}:1" for i in range(num_ps)), workers, "worker", task, num_gpus=num_gpus)


def training_graph(num_ps, model_cfg=model.ModelConfig(), sync=False,  # noqa: B008  (a frozen value)
                   wire_dtype="float32", task=1, num_gpus=None):
    cfg = RunConfig(cluster(num_ps, task, num_gpus),
                    TrainConfig(sync_replicas=sync, replicas_to_aggregate=2, wire_dtype=wire_dtype),
                    model_cfg, inputs.DataConfig(synthetic_examples=100))
    graph = tf.Graph()
    with graph.as_default():
        built = train_graph.build_graph(cfg)
    for hook in built.step.hooks:
        if isinstance(hook, sync_training.SyncReplicasHook):
            # Never run: placement tests have no session. Say so, or TF logs it at exit.
            hook._optimizer.ready_for_local_init_op.mark_used()
    return graph


def test_resource_variables_are_sized_from_shape_and_dtype():
    with tf.Graph().as_default():
        var = v1.get_variable("v", [300, 20], dtype=tf.float32, use_resource=True)
        assert var.op.type == "VarHandleOp"
        assert placement.variable_byte_size(var.op) == 300 * 20 * 4
        # What TensorFlow's byte_size_load_fn measures: the output, a scalar resource handle.
        assert var.op.outputs[0].shape.as_list() == [] and var.op.outputs[0].dtype == tf.resource


def test_every_variable_is_on_a_ps_and_every_other_op_on_this_worker():
    graph = training_graph(num_ps=1)
    for var in graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES):
        assert var.device == "/job:ps/task:0", var.name
    loss = graph.get_tensor_by_name("cross_entropy:0")
    assert loss.device == "/job:worker/task:1"
    iterator_ops = [op for op in graph.get_operations() if op.type == "OneShotIterator"]
    assert iterator_ops and all(op.device == "/job:worker/task:1" for op in iterator_ops)


@pytest.mark.parametrize("optimizer", ["adam", "lazy_adam", "momentum"])
def test_with_local_steps_every_global_variable_is_on_a_ps_whichever_optimizer(optimizer):
    # Adam keeps its beta powers beside the first variable it updates: with --local_steps, this worker's
    # local copy. As global variables there, the chief cannot initialize them: every other worker would wait
    # for it until the job ended without them.
    path = plan.step_path(plan.StepSettings(local_steps=10, distributed=True))
    cfg = RunConfig(cluster(1, task=1), TrainConfig(local_steps=10, optimizer=optimizer, step_path=path),
                    model.ModelConfig(), inputs.DataConfig(synthetic_examples=100))
    graph = tf.Graph()
    with graph.as_default():
        train_graph.build_graph(cfg)
    assert {var.device for var in graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES)} == {"/job:ps/task:0"}
    local = {var.op.name for var in graph.get_collection(v1.GraphKeys.LOCAL_VARIABLES)}
    assert optimizer == "momentum" or {"beta1_power", "beta2_power"} <= local


@pytest.mark.parametrize("num_gpus, task, device", [
    (2, 3, "/job:worker/task:3/device:GPU:1"), (4, 1, "/job:worker/task:1/device:GPU:1"),
    (0, 1, "/job:worker/task:1/device:CPU:0")])
def test_num_gpus_puts_a_workers_compute_on_gpu_task_index_mod_n_and_variables_stay_on_the_ps(num_gpus, task, device):
    graph = training_graph(num_ps=1, task=task, num_gpus=num_gpus)
    assert graph.get_tensor_by_name("cross_entropy:0").device == device
    assert all(var.device == "/job:ps/task:0" for var in graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES))
    ps = spec.ClusterConfig(("ps0:1",), ("w0:1",), "ps", 0, num_gpus=num_gpus)
    assert ps.hides_gpus and cluster(1, task, num_gpus).hides_gpus == (num_gpus == 0)


def test_the_startup_report_counts_the_variables_of_growing_tables_it_cannot_size():
    # 3 clicks tables cut in two over 2 ps: each shard's rows grow, and so do their optimizer slots.
    model_cfg = model.ModelConfig(name="wide_deep", hidden_units=(8,), embedding_dim=4, embedding="dynamic",
                                  embedding_growth=True, embedding_partitions=2)
    cfg = RunConfig(cluster(2), TrainConfig(optimizer="ftrl_adagrad"), model_cfg,
                    inputs.DataConfig(name="clicks", synthetic_examples=100))
    with tf.Graph().as_default() as graph:
        train_graph.build_graph(cfg)
    growing = placement.growing_per_ps(graph)
    # On each ps, 3 shards of (embedding, its Adagrad accumulator, wide weights, FTRL's two slots).
    assert growing == {"/job:ps/task:0": 15, "/job:ps/task:1": 15}
    assert not placement.growing_per_ps(training_graph(2))  # a dense model: every length known
    assert set(placement.bytes_per_ps(graph)) == set(growing)


def test_two_ps_are_balanced_by_bytes_greedily():
    with tf.Graph().as_default() as graph:
        with v1.device(placement.device_setter(cluster(num_ps=2))):
            for i, floats in enumerate([400, 300, 200, 100, 100, 100]):
                v1.get_variable(f"v{i}", [floats])
    # 400 -> ps0; 300 -> ps1; 200 -> ps1 (500); 100 -> ps0 (500); 100 -> ps0 (600); 100 -> ps1 (600).
    # Round-robin would give 700 and 500 floats.
    assert placement.bytes_per_ps(graph) == {"/job:ps/task:0": 600 * 4, "/job:ps/task:1": 600 * 4}


def test_slots_count_toward_the_ps_of_their_variable():
    graph = training_graph(num_ps=2, model_cfg=model.ModelConfig(hidden_units=(128, 128, 128, 128)))
    placed = placement.bytes_per_ps(graph)
    slots = [v for v in graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES) if "Momentum" in v.name]
    assert slots
    for slot in slots:
        primary = graph.get_operation_by_name(slot.op.name.rsplit("/Momentum", 1)[0])
        assert slot.device == primary.device, slot.name
    assert min(placed.values()) > 0.3 * max(placed.values())


def test_sync_accumulators_stay_with_their_variables():
    graph = training_graph(num_ps=2, sync=True)
    devices = {v.op.name: v.device for v in graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES)}
    accumulators = [op for op in graph.get_operations() if op.type == "ResourceConditionalAccumulator"
                    or op.type == "ConditionalAccumulator"]
    assert accumulators
    for op in accumulators:
        assert op.device.startswith("/job:ps/task:"), op.name
    assert set(devices.values()) == {"/job:ps/task:0", "/job:ps/task:1"}


@pytest.mark.parametrize("embedding", ["hashed", "dynamic"])
def test_the_wire_casts_a_table_models_dense_variables_and_leaves_its_tables_whole_or_not_alone(embedding):
    # One ps holds every hashed table whole (not partitioned): the model's declaration tells a table, not a
    # partitioner. Casting a table's value would read all of it every step (and broke the graph's build).
    model_cfg = model.ModelConfig(name="wide_deep", hidden_units=(8,), hash_buckets=1000, embedding_dim=4,
                                  embedding=embedding, embedding_capacity=4000)
    cfg = RunConfig(cluster(1), TrainConfig(wire_dtype="bfloat16"), model_cfg,
                    inputs.DataConfig(name="clicks", synthetic_examples=100))
    graph = tf.Graph()
    with graph.as_default():
        train_graph.build_graph(cfg)
        tables = {v.op.name for v in v1.get_collection(needs.TABLE_VARIABLES)}
        dense = {v.op.name for v in v1.trainable_variables()} - tables
    to_wire = [op for op in graph.get_operations() if op.type == "Cast" and op.name.startswith("to_wire")
               and not op.name.startswith("gradients")]
    assert tables and dense
    assert {op.inputs[0].op.inputs[0].op.name for op in to_wire} == dense
    assert all(op.device == "/job:ps/task:0" and op.get_attr("DstT") == tf.bfloat16 for op in to_wire)


def test_bfloat16_wire_casts_on_the_ps_both_ways():
    graph = training_graph(num_ps=1, wire_dtype="bfloat16")
    kernel = graph.get_operation_by_name("mlp/hidden0/kernel")
    to_wire = [op for op in graph.get_operations() if op.type == "Cast" and "to_wire" in op.name
               and not op.name.startswith("gradients")]
    assert len(to_wire) == 4  # every dense variable of the mlp
    assert all(op.device == "/job:ps/task:0" and op.get_attr("DstT") == tf.bfloat16 for op in to_wire)
    from_wire = [op for op in graph.get_operations() if op.type == "Cast" and "from_wire" in op.name
                 and not op.name.startswith("gradients")]
    assert len(from_wire) == 4 and all(op.device == "/job:worker/task:1" for op in from_wire)
    # The update's gradient input is computed on the ps from a bfloat16 tensor sent by the worker.
    update = [op for op in graph.get_operations() if op.type == "ResourceApplyMomentum"
              and op.inputs[0].op is kernel][0]
    gradient = update.inputs[3].op
    while gradient.type in ("Identity",):
        gradient = gradient.inputs[0].op
    assert gradient.type == "Cast" and gradient.device == "/job:ps/task:0"
    assert gradient.inputs[0].dtype == tf.bfloat16 and gradient.inputs[0].op.device == "/job:worker/task:1"
    assert kernel.get_attr("dtype") == tf.float32  # the master copy


def test_every_task_pings_quiet_grpc_connections_and_reconnects_within_a_second_unless_told_otherwise():
    assert spec.grpc_options(None) == ("grpc.keepalive_time_ms=10000,grpc.keepalive_timeout_ms=10000,"
                                       "grpc.max_reconnect_backoff_ms=1000")
    assert spec.grpc_options("grpc.keepalive_time_ms=60000,grpc.http2.max_pings_without_data=0") == (
        "grpc.keepalive_time_ms=60000,grpc.http2.max_pings_without_data=0,grpc.keepalive_timeout_ms=10000,"
        "grpc.max_reconnect_backoff_ms=1000")
