#!/usr/bin/env python3
"""The TF2 alternatives a user would weigh against the trainer, on the same MLP, data and batch:
ParameterServerStrategy (a coordinator, N workers, 1 ps) and MultiWorkerMirroredStrategy (N
workers, all-reduce), each as real processes on 127.0.0.1.

    python scripts/tf2_baselines.py --strategy=ps --num_workers=2 --hidden_units=256 --batch_size=128
    python scripts/tf2_baselines.py --strategy=mwms --num_workers=2 --steps_per_call=10

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

import input as inputs
from launch import terminal
from launch.processes import LOOPBACK, free_ports

flags.DEFINE_enum("strategy", "ps", ["ps", "mwms"], "ParameterServerStrategy or MultiWorkerMirroredStrategy.")
flags.DEFINE_integer("num_workers", 2, "Workers.", lower_bound=1)
flags.DEFINE_list("hidden_units", ["256"], "MLP hidden layers, as the trainer's --hidden_units.")
flags.DEFINE_integer("batch_size", 128, "Examples per step on each worker.", lower_bound=1)
flags.DEFINE_integer("warmup_steps", 100, "Steps (per worker) before measuring.", lower_bound=1)
flags.DEFINE_integer("measure_steps", 400, "Steps (per worker) measured.", lower_bound=1)
flags.DEFINE_integer("steps_per_call", 1, "Training steps inside one tf.function call.", lower_bound=1)
flags.DEFINE_string("task", None, "Internal: job:index of a server process started by this script.")
FLAGS = flags.FLAGS
LEARNING_RATE, MOMENTUM = 0.05, 0.9


def dataset(shard_index=0, shard_count=1):
    cfg = inputs.DataConfig(synthetic_examples=20000)
    records = inputs.synthetic.records(cfg, "train", inputs.Shard(shard_index, shard_count)).cache().repeat()
    return records.batch(FLAGS.batch_size, drop_remainder=True).map(
        lambda f, y: (tf.cast(tf.reshape(f["image"], [-1, 784]), tf.float32) / 255.0, y)).prefetch(2)


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
        mlp = Mlp()
    per_worker = coordinator.create_per_worker_dataset(lambda: dataset())
    iterator = iter(per_worker)

    @tf.function
    def train(it):
        def replica_step(x, y):
            return mlp.step(x, y)
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
        mlp = Mlp()
    context = tf.distribute.InputContext(num_input_pipelines=FLAGS.num_workers,
                                         input_pipeline_id=json.loads(os.environ["TF_CONFIG"])["task"]["index"])
    iterator = iter(strategy.distribute_datasets_from_function(
        lambda ctx: dataset(context.input_pipeline_id, context.num_input_pipelines)))

    @tf.function
    def train(it):
        def replica_step(x, y):
            return mlp.step(x, y, tf.distribute.get_replica_context())
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
