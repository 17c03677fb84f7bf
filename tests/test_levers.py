"""The speed levers, each still training correctly, with exact numbers where they can be had, on
in-process clusters: --steps_per_run (several training steps in one session.run), --wire_dtype (16-bit
variables and gradients on the wire), --local_steps (rounds of steps on worker-side copies, pushed to
the ps as the workers' mean; the real model with it on against plain SGD, through a checkpoint
restart, stopping exactly at --train_steps) and --accumulate_batches (a synchronous round averages
every worker's micro-batches)."""

import threading

import numpy as np
import pytest
import tensorflow as tf

from ps_trainer import input as inputs
from ps_trainer import model
from ps_trainer.model import needs, touched_rows, wide_deep
from ps_trainer.cluster import placement, spec
from ps_trainer.launch import measure
from tests.support import (held_out, in_process_cluster, join_all, tf_session, train_one_worker, trained_runs,
                           wait_for, write_click_csvs)
from ps_trainer.training import graph as train_graph
from ps_trainer.training import plan
from ps_trainer.training.config import RunConfig, TrainConfig
from ps_trainer.training.step import StepContext, accumulate, local_steps, single, sync


v1 = tf.compat.v1


@pytest.mark.inprocess
@pytest.mark.parametrize("name,data", [("mlp", inputs.DataConfig(synthetic_examples=2000)),
                                       ("wide_deep", inputs.DataConfig(name="clicks"))])
def test_several_steps_per_run_stop_exactly_at_train_steps(tmp_path, name, data):
    runs, progress, saved, variables = train_one_worker(tmp_path, data, model.ModelConfig(name=name),
                                                        steps_per_run=10, train_steps=95)
    # Ten steps a run, the last run cut at --train_steps (then, as StopAtStepHook's read fell, a run that
    # takes none).
    assert trained_runs(runs) == [(10, 10 * i) for i in range(1, 10)] + [(5, 95)]
    assert progress.own_steps == 95 and progress.global_step == 95
    # It trained: better than chance on the held-out split (clicks has two classes, the images ten).
    figures = held_out(tmp_path, data, model.ModelConfig(name=name))
    assert (figures["auc"] > 0.6) if name == "wide_deep" else (figures["accuracy"] > 0.3), figures
    assert saved[-1] == 95 and all(step % 10 == 0 for step in saved[:-1])  # checkpoints between runs
    # The loop reused the variables and the optimizer's slots; it made none of its own: the graph of one
    # step per run has as many.
    with tf.Graph().as_default():
        train_graph.build_graph(RunConfig(spec.ClusterConfig(), TrainConfig(batch_size=32, learning_rate=0.1),
                                          model.ModelConfig(name=name), data))
        assert variables == len(v1.global_variables())


@pytest.mark.servers
@pytest.mark.parametrize("wire_dtype", ["bfloat16", "float16"])
def test_training_converges_with_16_bit_variables_and_gradients_on_the_wire(tmp_path, wire_dtype):
    servers, _, (cluster,) = in_process_cluster(num_workers=1, num_ps=1)
    data = inputs.DataConfig(synthetic_examples=2000)
    _, _, saved, _ = train_one_worker(tmp_path, data, model.ModelConfig(), 1, 150, wire_dtype,
                                             (cluster, servers[0].target))
    assert (figures := held_out(tmp_path, data, model.ModelConfig()))["accuracy"] > 0.3, figures  # chance: 0.1
    # Every dense variable is read through a cast to the wire type on the ps, and its gradient comes back
    # through the cast's gradient, computed there too: both cross in 16 bits.
    cfg = RunConfig(cluster, TrainConfig(wire_dtype=wire_dtype), model.ModelConfig(), data)
    with tf.Graph().as_default() as graph:
        train_graph.build_graph(cfg)
        casts = [op for op in graph.get_operations() if op.type == "Cast" and "/job:ps" in op.device]
        to_wire = [op for op in casts if op.get_attr("DstT") == tf.as_dtype(wire_dtype)]
        gradients_back = [op for op in casts if op.get_attr("SrcT") == tf.as_dtype(wire_dtype)
                          and op.name.startswith("gradients")]
        assert len(to_wire) == len(v1.trainable_variables()) == 4
        assert len(gradients_back) == 4
    # The ps kept float32 masters: the checkpoint holds float32 variables.
    reader = tf.train.load_checkpoint(str(tmp_path))
    dtypes = reader.get_variable_to_dtype_map()
    assert dtypes["mlp/hidden0/kernel"] == tf.float32 and saved[-1] == 150


# ---------------------------------------------------------------- --local_steps

LEARNING_RATE = 0.5
INITIAL = [1.0, 2.0]
GRADIENTS = [[0.1, 0.3], [0.5, 0.7]]  # each worker's loss is sum(var * g_i): its gradient is g_i


class LocalReplica:
    """One worker's round graph (the trainer's device setter, LocalCopies and local_steps.build) and a
    plain session to its in-process server."""

    def __init__(self, cluster_cfg, server, local_steps_per_round, train_steps=100):
        train_cfg = TrainConfig(train_steps=train_steps, local_steps=local_steps_per_round,
                                step_path=plan.StepPath(plan.LOCAL_STEPS, 3))
        self.graph = tf.Graph()
        with self.graph.as_default(), v1.device(placement.device_setter(cluster_cfg)):
            self.global_step = v1.train.get_or_create_global_step()
            copies = local_steps.LocalCopies(cluster_cfg.compute_device(), cluster_cfg.num_replicas)
            gradient = tf.constant(GRADIENTS[cluster_cfg.task_index])

            def forward():
                with v1.variable_scope("", custom_getter=copies.getter, reuse=v1.AUTO_REUSE):
                    var = v1.get_variable("var", initializer=tf.constant(INITIAL))
                loss = tf.reduce_sum(var * gradient)
                return model.ModelOutput(None, None, loss, tf.constant(0.0), None), tf.zeros([1], tf.int64)

            output, labels = forward()
            optimizer = v1.train.GradientDescentOptimizer(LEARNING_RATE)
            self.steps_done = local_steps.build(StepContext(forward, output, labels, optimizer, self.global_step,
                                                            cluster_cfg, train_cfg, copies)).steps_done
            self.var = v1.trainable_variables()[0]
            self.copy = copies.local_variables[0]
            init = v1.global_variables_initializer() if cluster_cfg.is_chief else tf.no_op()
            self.session = tf_session(server.target)
            self.session.run(init)
            self.session.run(v1.local_variables_initializer())

    def run_round(self):
        return int(self.session.run(self.steps_done))

    def read(self):
        return self.session.run([self.global_step, self.var, self.copy])


@pytest.mark.servers
def test_each_round_adds_its_workers_share_of_its_update_and_fetches_the_others():
    servers, _, configs = in_process_cluster(num_workers=2, num_ps=1)
    chief = LocalReplica(configs[0], servers[0], 3)
    other = LocalReplica(configs[1], servers[1], 3)
    initial, g0, g1 = np.array(INITIAL), np.array(GRADIENTS[0]), np.array(GRADIENTS[1])
    round0, round1 = -3 * LEARNING_RATE * g0, -3 * LEARNING_RATE * g1  # three local SGD steps each
    # Both copies start from the chief's initial values; a round moves the ps by its mean share (1/2).
    assert chief.run_round() == 3
    step, var, copy = chief.read()
    np.testing.assert_allclose(var, initial + round0 / 2, rtol=1e-6)
    np.testing.assert_allclose(copy, var, rtol=1e-6)  # fetched back
    assert step == 3
    # The other worker's round started from the initial values; its push lands on the chief's.
    assert other.run_round() == 3
    step, var, copy = other.read()
    np.testing.assert_allclose(var, initial + round0 / 2 + round1 / 2, rtol=1e-6)
    np.testing.assert_allclose(copy, var, rtol=1e-6)
    assert step == 6
    # The chief's copy still holds what it fetched; its next round pushes only its own change.
    assert chief.run_round() == 3
    _, var, _ = chief.read()
    np.testing.assert_allclose(var, initial + round0 + round1 / 2, rtol=1e-6)


@pytest.mark.servers
def test_the_round_that_reaches_train_steps_is_cut_there():
    servers, _, (cfg,) = in_process_cluster(num_workers=1, num_ps=1)
    replica = LocalReplica(cfg, servers[0], 4, train_steps=10)
    assert [replica.run_round() for _ in range(4)] == [4, 4, 2, 0]
    step, var, _ = replica.read()
    assert step == 10
    np.testing.assert_allclose(var, np.array(INITIAL) - 10 * LEARNING_RATE * np.array(GRADIENTS[0]), rtol=1e-6)


@pytest.mark.servers
def test_one_worker_with_local_steps_trains_the_model_as_plain_sgd_and_resumes_from_its_checkpoint(tmp_path):
    data, mlp = inputs.DataConfig(synthetic_examples=2000), model.ModelConfig(hidden_units=(32,))
    # Two ps tasks: the variables are split between them, and each gets its own packed push and fetch.
    servers, _, (cluster,) = in_process_cluster(num_workers=1, num_ps=2)
    runs, progress, saved, variables = train_one_worker(tmp_path / "local", data, mlp, 5, 23,
                                                        cluster=(cluster, servers[0].target), local_steps=5,
                                                        optimizer="sgd")
    _, plain_progress, _, plain_variables = train_one_worker(tmp_path / "plain", data, mlp, 1, 23, optimizer="sgd")
    assert trained_runs(runs) == [(5, 5), (5, 10), (5, 15), (5, 20), (3, 23)]  # exactly --train_steps
    assert variables == plain_variables  # the checkpointed model: no copies, no slots of theirs
    assert len(list((tmp_path / "local").glob("model.ckpt-23.data-*-of-00002"))) == 2  # each ps saved its part
    local, plain = tf.train.load_checkpoint(str(tmp_path / "local")), tf.train.load_checkpoint(str(tmp_path / "plain"))
    assert saved[-1] == 23 and local.get_tensor("global_step") == 23
    for name in ("mlp/hidden0/kernel", "mlp/hidden0/bias", "mlp/logits/kernel", "mlp/logits/bias"):
        np.testing.assert_allclose(local.get_tensor(name), plain.get_tensor(name), rtol=1e-4, atol=1e-6)
    assert progress.own_steps == plain_progress.own_steps == 23
    # A new cluster (every server restarted) resumes from the checkpoint, the copies from the restored values.
    servers, _, (cluster,) = in_process_cluster(num_workers=1, num_ps=2)
    runs, progress, saved, _ = train_one_worker(tmp_path / "local", data, mlp, 5, 40,
                                                cluster=(cluster, servers[0].target), local_steps=5, optimizer="sgd")
    runs = trained_runs(runs)
    assert runs[0] == (5, 28) and runs[-1] == (2, 40)
    assert saved[-1] == 40


@pytest.mark.servers
def test_with_tables_one_worker_with_local_steps_trains_as_plain_sgd_pushing_its_dense_copies_every_k_steps(tmp_path):
    data = inputs.DataConfig(name="clicks", synthetic_examples=2000)
    wide_deep = model.ModelConfig(name="wide_deep", hidden_units=(8,), hash_buckets=1000, embedding_dim=4)
    servers, _, (cluster,) = in_process_cluster(num_workers=1, num_ps=2)
    runs, progress, saved, variables = train_one_worker(tmp_path / "local", data, wide_deep, 1, 23,
                                                        cluster=(cluster, servers[0].target), local_steps=5,
                                                        optimizer="sgd")
    _, _, plain_saved, plain_variables = train_one_worker(tmp_path / "plain", data, wide_deep, 1, 23, optimizer="sgd")
    # A run is one step: the tables' rows are read and updated on the ps every step.
    assert runs == [(1, step) for step in range(1, 24)] and progress.own_steps == 23
    assert variables == plain_variables  # no copies or slots of theirs in the checkpoint
    assert 20 in saved and 20 in plain_saved and saved[-1] == plain_saved[-1] == 23
    tables = ("wide_deep/user/embedding", "wide_deep/item/wide")
    dense = ("wide_deep/hidden0/kernel", "wide_deep/deep_logits/bias", "wide_deep/wide_numeric/kernel")
    for step in (20, 23):  # step 20 holds the push that rode on it; 23, the one at the end, before the last save
        local, plain = (tf.train.load_checkpoint(str(tmp_path / run / f"model.ckpt-{step}"))
                        for run in ("local", "plain"))
        for name in tables + dense:
            np.testing.assert_allclose(local.get_tensor(name), plain.get_tensor(name), rtol=1e-4, atol=1e-6,
                                       err_msg=f"{name} at step {step}")


@pytest.mark.servers
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "ftrl_adagrad"])
def test_with_hashed_tables_one_worker_trains_rounds_of_rows_as_plain_training(tmp_path, optimizer):
    # Rounds (training/step/row_copies.py): a run reads 5 batches, trains their rows' copies and pushes
    # what changed, rows and optimizer slots. One worker's rounds are plain training's steps.
    data = inputs.DataConfig(name="clicks", synthetic_examples=2000)
    wide_deep = model.ModelConfig(name="wide_deep", hidden_units=(8,), hash_buckets=1000, embedding_dim=4,
                                  embedding_partitions=2)
    servers, _, (cluster,) = in_process_cluster(num_workers=1, num_ps=2)
    runs, progress, saved, variables = train_one_worker(tmp_path / "local", data, wide_deep, 5, 23,
                                                        cluster=(cluster, servers[0].target), local_steps=5,
                                                        optimizer=optimizer, rounds=True)
    _, _, plain_saved, plain_variables = train_one_worker(tmp_path / "plain", data, wide_deep, 1, 23,
                                                          optimizer=optimizer)
    assert trained_runs(runs) == [(5, 5), (5, 10), (5, 15), (5, 20), (3, 23)]  # exactly --train_steps
    assert progress.own_steps == 23
    assert 20 in saved and 20 in plain_saved and saved[-1] == plain_saved[-1] == 23
    local, plain = (tf.train.load_checkpoint(str(tmp_path / run / "model.ckpt-23")) for run in ("local", "plain"))
    saved_names = plain.get_variable_to_shape_map()
    # No copies or slots of theirs in the checkpoint; the dense variables' slots are the worker's own.
    assert set(local.get_variable_to_shape_map()) <= set(saved_names) and variables <= plain_variables
    tables = [name for name in saved_names if name.startswith("wide_deep/") and name.count("/") == 2
              and name.endswith(("/embedding", "/wide"))]  # each saved whole, from its 2 shards
    slots = [name for name in saved_names if name.startswith(tuple(table + "/" for table in tables))]
    assert set(slots) <= set(local.get_variable_to_shape_map())
    assert len(tables) >= 4 and len(slots) == {"sgd": 0, "adagrad": 1, "ftrl_adagrad": 1.5}[optimizer] * len(tables)
    names = tables + slots
    for name in names + ["wide_deep/hidden0/kernel", "wide_deep/wide_numeric/kernel"]:
        np.testing.assert_allclose(local.get_tensor(name), plain.get_tensor(name), rtol=1e-4, atol=1e-6,
                                   err_msg=name)
    trained = plain.get_tensor("wide_deep/user/embedding") != tf.train.load_checkpoint(
        str(tmp_path / "plain" / "model.ckpt-20")).get_tensor("wide_deep/user/embedding")
    assert trained.any()  # the last 3 steps changed rows: the comparison above sees them


def rows_by_id(reader, table: str, storage: str) -> dict:
    """{ID: its row of `storage` (a row variable or one of its slots)} of a dynamic table, from a checkpoint."""
    found, shard = {}, 0
    while f"wide_deep/{table}/shard{shard}/rows_of_ids-keys" in reader.get_variable_to_shape_map():
        prefix = f"wide_deep/{table}/shard{shard}/"
        keys, rows = reader.get_tensor(prefix + "rows_of_ids-keys"), reader.get_tensor(prefix + "rows_of_ids-values")
        values = reader.get_tensor(prefix + storage)
        found.update((key, values[row]) for key, row in zip(keys, rows))
        shard += 1
    return found


@pytest.mark.servers
@pytest.mark.parametrize("source", ["clicks", "csv with a multi-valued column"])
def test_with_dynamic_tables_one_worker_trains_rounds_of_rows_as_plain_training_evictions_included(
        tmp_path, monkeypatch, source):
    # Rounds of dynamic tables: the ps admits the round's IDs at its start, and each row's last-read step
    # is set as a step at a time sets it, so that evictions (--embedding_steps_to_live=4 before each
    # checkpoint, every 5 steps) take the same IDs, and a readmitted ID starts afresh in both. Rows start
    # at zeros: an ID's row then does not depend on which row admission hands it (the order differs).
    monkeypatch.setattr(wide_deep, "_embedding_initializer", lambda model_cfg: v1.zeros_initializer())
    data = inputs.DataConfig(name="clicks", synthetic_examples=1000)
    if source != "clicks":  # the user's recent items: 0 to 12 of 50, split per batch from the round's
        write_click_csvs(tmp_path / "csv", rows=1000)
        data = inputs.DataConfig(name="csv", data_dir=str(tmp_path / "csv"), label_column="clicked",
                                 numeric_columns=("price", "hour"), categorical_columns=("user", "city"),
                                 multi_valued_columns=("recent:|",))
    dynamic = model.ModelConfig(name="wide_deep", hidden_units=(8,), embedding_dim=4, embedding="dynamic",
                                embedding_capacity=20000, embedding_partitions=2, embedding_steps_to_live=4)
    servers, _, (cluster,) = in_process_cluster(num_workers=1, num_ps=2)
    runs, _, _, _ = train_one_worker(tmp_path / "local", data, dynamic, 5, 25, cluster=(cluster, servers[0].target),
                                     local_steps=5, optimizer="adagrad", rounds=True, save_steps=5,
                                     graph_saver=True)
    train_one_worker(tmp_path / "plain", data, dynamic, 1, 25, optimizer="adagrad", save_steps=5, graph_saver=True)
    assert trained_runs(runs) == [(5, 5), (5, 10), (5, 15), (5, 20), (5, 25)]
    local, plain = ({step: tf.train.load_checkpoint(str(tmp_path / run / f"model.ckpt-{step}"))
                     for step in (10, 15, 25)} for run in ("local", "plain"))
    tables = ["user", "item"] if data.name == "clicks" else ["user", "recent"]
    readmitted = 0
    for table in tables:
        for step in (10, 15, 25):
            for storage in ("embedding", "embedding/Adagrad", "wide", "wide/Adagrad"):
                rounds, steps = rows_by_id(local[step], table, storage), rows_by_id(plain[step], table, storage)
                assert sorted(rounds) == sorted(steps), (table, step, storage)  # the same IDs admitted and evicted
                for key, row in steps.items():
                    np.testing.assert_allclose(rounds[key], row, rtol=1e-4, atol=1e-6, err_msg=f"{table} {key} {step}")
        before, evicted, after = (set(rows_by_id(plain[step], table, "embedding")) for step in (10, 15, 25))
        readmitted += len((before - evicted) & after)
    assert readmitted > 0  # IDs evicted at step 15 and admitted again by step 25
    for name in ("wide_deep/hidden0/kernel", "wide_deep/wide_numeric/kernel"):
        np.testing.assert_allclose(local[25].get_tensor(name), plain[25].get_tensor(name), rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------- --accumulate_batches
MICRO_BATCH_GRADIENTS = [[[0.1, 0.3], [0.2, 0.0], [1.0, 2.0]], [[0.5, 0.7], [0.0, 0.4], [3.0, 1.0]]]


def accumulating_replica(cluster_cfg, server, train_cfg):
    """One sync worker whose loss on micro-batch i is sum(var * g_i) (MICRO_BATCH_GRADIENTS of its task),
    built with the trainer's Snapshot, mean_gradients and make_train_op, in a MonitoredTrainingSession."""
    graph = tf.Graph()
    with graph.as_default(), v1.device(placement.device_setter(cluster_cfg)):
        global_step = v1.train.get_or_create_global_step()
        snapshot = accumulate.Snapshot(cluster_cfg.compute_device())
        gradients = v1.data.make_one_shot_iterator(
            tf.data.Dataset.from_tensor_slices(MICRO_BATCH_GRADIENTS[cluster_cfg.task_index]).repeat())

        def forward():
            with v1.variable_scope("", custom_getter=snapshot.getter, reuse=v1.AUTO_REUSE):
                var = v1.get_variable("var", initializer=tf.constant(INITIAL))
            loss = tf.reduce_sum(var * gradients.get_next())
            return model.ModelOutput(None, None, loss, tf.constant(0.0), None), tf.zeros([1], tf.int64)

        forward()
        grads_and_vars, _ = accumulate.mean_gradients(forward, snapshot, train_cfg.accumulate_batches,
                                                        ("loss", "accuracy"))
        train_op, hooks, chief_hooks, *_ = single.make_train_op(
            None, v1.train.GradientDescentOptimizer(LEARNING_RATE), global_step, cluster_cfg, train_cfg,
            grads_and_vars=grads_and_vars)
        var = v1.trainable_variables()[0]
        session = v1.train.MonitoredTrainingSession(master=server.target, is_chief=cluster_cfg.is_chief, hooks=hooks,
                                                    chief_only_hooks=chief_hooks,
                                                    stop_grace_period_secs=sync.STOP_GRACE_SECS)
    return session, train_op, global_step, var


@pytest.mark.servers
def test_a_synchronous_round_applies_the_mean_of_every_workers_micro_batches():
    servers, _, configs = in_process_cluster(num_workers=2, num_ps=1)
    train_cfg = TrainConfig(train_steps=10, sync_replicas=True, replicas_to_aggregate=2, accumulate_batches=3)
    chief = accumulating_replica(configs[0], servers[0], train_cfg)
    other = accumulating_replica(configs[1], servers[1], train_cfg)
    try:
        threads = [threading.Thread(target=session.run, args=(train_op,), daemon=True)
                   for session, train_op, _, _ in (chief, other)]
        for thread in threads:
            thread.start()
        join_all(threads)
        # The chief's queue runner applies the round: read until it has.
        session, _, global_step, var = chief
        read = []
        wait_for(lambda: read.append(session.run_step_fn(
            lambda step_context: step_context.session.run([global_step, var]))) or read[-1][0] >= 1, 10,
            "the chief's queue runner to apply the round")
        step, value = read[-1]
        every_micro_batch = np.array(MICRO_BATCH_GRADIENTS).reshape(-1, 2)
        assert step == 1  # one round, one global step
        np.testing.assert_allclose(value, np.array(INITIAL) - LEARNING_RATE * every_micro_batch.mean(axis=0),
                                   rtol=1e-6)
    finally:
        other[0].close()
        chief[0].close()


@pytest.mark.servers
def test_a_round_of_local_steps_makes_one_packed_exchange_per_ps():
    # Counted on the partition graphs TensorFlow builds for one run of the train op (launch/measure.py).
    def trips(local, num_ps):
        cfg = RunConfig(spec.ClusterConfig(("ps",) * num_ps, ("worker",), "worker", 0),
                        TrainConfig(batch_size=32, local_steps=local, step_path=plan.StepPath(
                            plan.LOCAL_STEPS if local > 1 else plan.SINGLE, local)),
                        model.ModelConfig(hidden_units=(8,)), inputs.DataConfig(synthetic_examples=200))
        return measure.round_trips(cfg)
    plain, local = trips(1, 1), trips(10, 1)
    # A plain step: a RunGraph to the ps, each of the 4 variables read and each gradient sent.
    assert plain.run_graph == 1 and plain.recv_tensor >= 8 and plain.per_step >= 9
    # A round of 10 steps: one RunGraph, and per direction one packed tensor (plus the global step's reads).
    assert local.run_graph == 1 and local.recv_tensor <= 8 and local.per_step <= plain.per_step / 5
    two_ps = trips(10, 2)
    assert two_ps.run_graph == 2 and two_ps.recv_tensor <= local.recv_tensor + 3  # one more packed pair


@pytest.mark.servers
def test_a_round_of_rows_makes_one_exchange_each_way_per_ps_for_every_table():
    # wide_deep's hashed tables, cut over 2 ps: a plain step reads the batch's rows and sends their
    # gradients, and the dense variables' values and gradients; a round of 10 steps sends each ps the
    # round's rows once and gets them back once, with their slots, plus the dense push and fetch.
    def trips(local):
        cfg = RunConfig(spec.ClusterConfig(("ps",) * 2, ("worker",), "worker", 0),
                        TrainConfig(batch_size=32, local_steps=local, optimizer="ftrl_adagrad", step_path=plan.StepPath(
                            plan.ROUNDS if local > 1 else plan.SINGLE, local, local)),
                        model.ModelConfig(name="wide_deep", hidden_units=(8,), hash_buckets=1000, embedding_dim=4,
                                          embedding_partitions=2), inputs.DataConfig(name="clicks",
                                                                                     synthetic_examples=1000))
        return measure.round_trips(cfg)
    plain, rounds = trips(1), trips(10)
    assert plain.run_graph == 2 and rounds.run_graph == 2  # one RunGraph per ps a session.run
    # Per ps: the round's (shard, row) pairs, their rows with their slots' and the rows' change cross once
    # each; the dense push and fetch; control edges and the global step. 18 today, against 27 a plain step.
    assert rounds.recv_tensor <= 9 * 2 and rounds.per_step <= plain.per_step / 10, (plain, rounds)


@pytest.mark.servers
def test_a_round_marks_the_rows_it_changed_for_the_next_incremental_checkpoint():
    servers, _, (cluster,) = in_process_cluster(num_workers=1, num_ps=2)
    cfg = RunConfig(cluster, TrainConfig(batch_size=32, local_steps=5, step_path=plan.StepPath(plan.ROUNDS, 5, 5),
                                         optimizer="adagrad", learning_rate=0.1),
                    model.ModelConfig(name="wide_deep", hidden_units=(8,), hash_buckets=1000, embedding_dim=4,
                                      embedding_partitions=2, mark_touched_rows=True),
                    inputs.DataConfig(name="clicks", synthetic_examples=1000))
    with tf.Graph().as_default():
        graph = train_graph.build_graph(cfg)
        shards = v1.get_collection(needs.TABLE_VARIABLES)  # each shard of each table
        markers = [touched_rows.marker_of(graph.graph_tables, shard) for shard in shards]
        assert len(shards) >= 8 and all(marker is not None for marker in markers)
        changed = [touched_rows.changed_rows(graph.graph_tables, marker) for marker in markers]
        with tf_session(servers[0].target) as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(v1.local_variables_initializer())
            before = sess.run(shards)
            assert sess.run(graph.step.steps_done) == 5
            after, marked = sess.run([shards, changed])
    for shard, start, end, rows in zip(shards, before, after, marked):
        moved = np.flatnonzero(np.any(start != end, axis=1))
        assert set(moved) <= set(rows) and len(rows) <= 5 * 32, shard.op.name  # marked: at most the batches' rows
    assert sum(len(rows) for rows in marked) > 0 and any(np.any(s != e) for s, e in zip(before, after))
