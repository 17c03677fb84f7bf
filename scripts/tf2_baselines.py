#!/usr/bin/env python3
"""The TF2 alternatives a user would weigh against the trainer, on the same model, data and batch:
ParameterServerStrategy (a coordinator, N workers, 1 ps) and MultiWorkerMirroredStrategy (N
workers, all-reduce), each as real processes on 127.0.0.1.

    python scripts/tf2_baselines.py --strategy=ps --num_workers=2 --hidden_units=256 --batch_size=128
    python scripts/tf2_baselines.py --strategy=mwms --num_workers=2 --steps_per_call=10
    python scripts/tf2_baselines.py --model=wide_deep --batch_size=256 --synthetic_examples=200000

--model=mlp is the trainer's default MLP on its synthetic images, trained by momentum SGD;
--model=wide_deep its wide_deep with hashed tables (--hash_buckets rows per column) on
--dataset=zipf_clicks, every table's gradient sparse and applied by Adagrad's sparse update on the ps
(the trainer trains the wide part with FTRL: the same rows touched, one more slot).

Prints one line: 'examples/sec N' (steady state, after a warm-up), and exits 0. scripts/benchmark.py
runs it beside the trainer. Every process it starts is in its own process group and stopped by it.
"""

import json
import os
import subprocess
import sys
import time

import tensorflow as tf
from absl import app, flags

from ps_trainer import input as inputs
from ps_trainer.input import criteo
from ps_trainer.model import wide_deep
from ps_trainer.launch import terminal
from ps_trainer.launch.processes import LOOPBACK, free_ports

flags.DEFINE_enum("strategy", "ps", ["ps", "mwms"], "ParameterServerStrategy or MultiWorkerMirroredStrategy.")
flags.DEFINE_enum("model", "mlp", ["mlp", "wide_deep"], "The trainer's model it stands for: mlp on synthetic "
                  "images, or wide_deep's hashed tables on zipf_clicks.")
flags.DEFINE_integer("num_workers", 2, "Workers.", lower_bound=1)
flags.DEFINE_list("hidden_units", ["256"], "Hidden layers, as the trainer's --hidden_units.")
flags.DEFINE_integer("hash_buckets", 10000, "wide_deep: rows of each column's tables, as the trainer's.", lower_bound=1)
flags.DEFINE_integer("embedding_dim", 16, "wide_deep: width of the embeddings, as the trainer's.", lower_bound=1)
flags.DEFINE_integer("synthetic_examples", 20000, "Training examples generated, cached after a worker's first "
                     "pass as the trainer caches generated data (mwms: each worker its shard; ps: each worker all of "
                     "them, as create_per_worker_dataset gives no worker index).", lower_bound=1)
flags.DEFINE_integer("batch_size", 128, "Examples per step on each worker.", lower_bound=1)
flags.DEFINE_integer("warmup_steps", 100, "Steps (per worker) before measuring.", lower_bound=1)
flags.DEFINE_integer("measure_steps", 400, "Steps (per worker) measured.", lower_bound=1)
flags.DEFINE_integer("steps_per_call", 1, "Training steps inside one tf.function call.", lower_bound=1)
flags.DEFINE_string("task", None, "Internal: job:index of a server process started by this script.")
FLAGS = flags.FLAGS
LEARNING_RATE, MOMENTUM = 0.05, 0.9
ADAGRAD_START = 0.1  # the accumulators' start value, as tf.compat.v1's Adagrad and the trainer's


def dataset(shard_index=0, shard_count=1):
    shard = inputs.Shard(shard_index, shard_count)
    if FLAGS.model == "wide_deep":
        cfg = inputs.DataConfig(name="zipf_clicks", synthetic_examples=FLAGS.synthetic_examples)
        records = inputs.DATASETS["zipf_clicks"].records(cfg, "train", shard)
        return records.batch(FLAGS.batch_size, drop_remainder=True).map(clicks_batch).cache().repeat().prefetch(2)
    cfg = inputs.DataConfig(synthetic_examples=FLAGS.synthetic_examples)
    records = inputs.synthetic.records(cfg, "train", shard).cache().repeat()
    return records.batch(FLAGS.batch_size, drop_remainder=True).map(
        lambda f, y: (tf.cast(tf.reshape(f["image"], [-1, 784]), tf.float32) / 255.0, y)).prefetch(2)


def clicks_batch(features, labels):
    """((hashed IDs [batch, 26], numeric features [batch, 13]), labels), as the trainer's wide_deep
    hashes and squashes them."""
    ids = tf.stack([tf.strings.to_hash_bucket_fast(features[name], FLAGS.hash_buckets) for name in criteo.CATEGORICAL],
                   axis=1)
    numeric = wide_deep.numeric_input(tf.stack([features[name] for name in criteo.INTEGER], axis=1))
    return (ids, numeric), labels


class Mlp(tf.Module):
    """784 -> hidden -> 10, glorot-uniform, plain momentum SGD (Keras 3 optimizers don't take these strategies)."""

    def __init__(self):
        sizes = [784, *map(int, FLAGS.hidden_units), 10]
        init = tf.initializers.GlorotUniform(seed=42)
        self.weights = [(tf.Variable(init([a, b])), tf.Variable(tf.zeros([b]))) for a, b in zip(sizes, sizes[1:])]
        self.velocity = [tf.Variable(tf.zeros_like(v)) for pair in self.weights for v in pair]

    def loss(self, x, y):
        for i, (kernel, bias) in enumerate(self.weights):
            x = tf.matmul(x, kernel) + bias
            if i < len(self.weights) - 1:
                x = tf.nn.relu(x)
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=x))

    def step(self, x, y, replica_context=None):
        variables = [v for pair in self.weights for v in pair]
        with tf.GradientTape() as tape:
            loss = self.loss(x, y)
        grads = tape.gradient(loss, variables)
        if replica_context is not None:
            grads = replica_context.all_reduce(tf.distribute.ReduceOp.MEAN, grads)
        for var, vel, grad in zip(variables, self.velocity, grads):
            vel.assign(MOMENTUM * vel + grad)
            var.assign_sub(LEARNING_RATE * vel)
        return loss


class WideDeep(tf.Module):
    """The trainer's wide_deep with hashed tables: per categorical column an embedding table and a wide
    weight table of --hash_buckets rows, gathered by the batch's IDs; the embeddings and numeric features
    through --hidden_units; the wide terms added to the logits. Adagrad, sparse for the tables."""

    def __init__(self):
        columns, numeric, classes = len(criteo.CATEGORICAL), len(criteo.INTEGER), 2
        embed = tf.initializers.TruncatedNormal(stddev=FLAGS.embedding_dim ** -0.5, seed=42)
        self.tables = [tf.Variable(embed([FLAGS.hash_buckets, FLAGS.embedding_dim])) for _ in range(columns)]
        self.wide = [tf.Variable(tf.zeros([FLAGS.hash_buckets, classes])) for _ in range(columns)]
        glorot = tf.initializers.GlorotUniform(seed=42)
        sizes = [columns * FLAGS.embedding_dim + numeric, *map(int, FLAGS.hidden_units), classes]
        self.dense = [(tf.Variable(glorot([a, b])), tf.Variable(tf.zeros([b]))) for a, b in zip(sizes, sizes[1:])]
        self.wide_numeric = (tf.Variable(glorot([numeric, classes])), tf.Variable(tf.zeros([classes])))
        self.trained = [*self.tables, *self.wide, *[v for pair in (*self.dense, self.wide_numeric) for v in pair]]
        self.accumulators = [tf.Variable(tf.fill(v.shape, ADAGRAD_START)) for v in self.trained]

    def loss(self, x, y):
        ids, numeric = x
        embedded = tf.concat([tf.gather(table, ids[:, c]) for c, table in enumerate(self.tables)], axis=1)
        wide = tf.add_n([tf.gather(table, ids[:, c]) for c, table in enumerate(self.wide)])
        net = tf.concat([embedded, numeric], axis=1)
        for i, (kernel, bias) in enumerate(self.dense):
            net = tf.matmul(net, kernel) + bias
            if i < len(self.dense) - 1:
                net = tf.nn.relu(net)
        logits = net + wide + tf.matmul(numeric, self.wide_numeric[0]) + self.wide_numeric[1]
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))

    def step(self, x, y, replica_context=None):
        with tf.GradientTape() as tape:
            loss = self.loss(x, y)
        grads = tape.gradient(loss, self.trained)
        if replica_context is not None:
            grads = replica_context.all_reduce(tf.distribute.ReduceOp.MEAN, grads)
        for var, accumulator, grad in zip(self.trained, self.accumulators, grads):
            if isinstance(grad, tf.IndexedSlices):  # a table: only the rows the batch touched
                tf.raw_ops.ResourceSparseApplyAdagradV2(
                    var=var.handle, accum=accumulator.handle, lr=LEARNING_RATE, epsilon=1e-7, grad=grad.values,
                    indices=grad.indices)
            else:
                tf.raw_ops.ResourceApplyAdagradV2(var=var.handle, accum=accumulator.handle, lr=LEARNING_RATE,
                                                  epsilon=1e-7, grad=grad)
        return loss


MODELS = {"mlp": Mlp, "wide_deep": WideDeep}


def serve(task, cluster):
    job, index = task.split(":")
    server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=job, task_index=int(index),
                                  protocol="grpc", start=True)
    server.join()


def run_ps_strategy(cluster):
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = MODELS[FLAGS.model]()
    per_worker = coordinator.create_per_worker_dataset(lambda: dataset())
    iterator = iter(per_worker)

    @tf.function
    def train(it):
        def replica_step(x, y):
            return model.step(x, y)
        loss = 0.0
        for _ in tf.range(FLAGS.steps_per_call):
            x, y = next(it)
            loss = strategy.run(replica_step, args=(x, y))
        return loss

    def run(steps):
        for _ in range(max(1, steps // FLAGS.steps_per_call)):
            coordinator.schedule(train, args=(iterator,))
        coordinator.join()
        return max(1, steps // FLAGS.steps_per_call) * FLAGS.steps_per_call

    # Steps are scheduled on whichever worker is free: count them all.
    run(FLAGS.warmup_steps * FLAGS.num_workers)
    start = time.monotonic()
    steps = run(FLAGS.measure_steps * FLAGS.num_workers)
    return steps * FLAGS.batch_size / (time.monotonic() - start)


def run_mwms():
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = MODELS[FLAGS.model]()
    context = tf.distribute.InputContext(num_input_pipelines=FLAGS.num_workers,
                                         input_pipeline_id=json.loads(os.environ["TF_CONFIG"])["task"]["index"])
    iterator = iter(strategy.distribute_datasets_from_function(
        lambda ctx: dataset(context.input_pipeline_id, context.num_input_pipelines)))

    @tf.function
    def train(it):
        def replica_step(x, y):
            return model.step(x, y, tf.distribute.get_replica_context())
        for _ in tf.range(FLAGS.steps_per_call):
            x, y = next(it)
            strategy.run(replica_step, args=(x, y))

    def run(steps):
        calls = max(1, steps // FLAGS.steps_per_call)
        for _ in range(calls):
            train(iterator)
        return calls * FLAGS.steps_per_call

    run(FLAGS.warmup_steps)
    start = time.monotonic()
    steps = run(FLAGS.measure_steps)
    return steps * FLAGS.batch_size * FLAGS.num_workers / (time.monotonic() - start)


def start(argv_extra, env=None):
    return subprocess.Popen([sys.executable, __file__, *sys.argv[1:], *argv_extra], start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})},
                            text=True)


def stop(procs):
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        proc.wait(timeout=30)


def main(argv):
    if FLAGS.task:  # a server process of the ps strategy's cluster
        serve(FLAGS.task, json.loads(os.environ["BASELINE_CLUSTER"]))
        return 0
    if FLAGS.strategy == "mwms" and os.environ.get("TF_CONFIG"):  # one of the mwms workers
        rate = run_mwms()
        print(f"examples/sec {rate:.0f}", flush=True)
        return 0
    terminal.interrupt_on_signals()
    ports = free_ports(FLAGS.num_workers + 2)
    addresses = [f"{LOOPBACK}:{p}" for p in ports]
    procs = []
    try:
        if FLAGS.strategy == "ps":
            cluster = {"chief": [addresses[0]], "ps": [addresses[1]], "worker": addresses[2:]}
            env = {"BASELINE_CLUSTER": json.dumps(cluster)}
            procs = [start(["--task=ps:0"], env)] + [start([f"--task=worker:{i}"], env)
                                                      for i in range(FLAGS.num_workers)]
            rate = run_ps_strategy(cluster)
        else:
            cluster = {"worker": addresses[:FLAGS.num_workers]}
            procs = [start([], {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})})
                     for i in range(FLAGS.num_workers)]
            outputs = [proc.communicate(timeout=1800)[0] for proc in procs]
            rates = [line for out in outputs for line in out.splitlines() if line.startswith("examples/sec")]
            if len(rates) != FLAGS.num_workers:
                raise SystemExit(f"a worker failed: {outputs}")
            rate = float(rates[0].split()[1])
    finally:
        stop(procs)
    print(f"examples/sec {rate:.0f}", flush=True)
    return 0


if __name__ == "__main__":
    app.run(main)
