#!/usr/bin/env python3
"""One task of a TF_CONFIG cluster that trains a program's model_fn in a bare loop: the graph an Estimator
program builds (its input_fn, its model_fn in TRAIN mode, placed by replica_device_setter), run by
`session.run((train_op, loss))` in a plain tf.compat.v1.Session, with nothing else: no hooks, no saver, no
summaries. The floor the runtime's session loop is measured against (scripts/estimator_parity.py).

    TF_CONFIG=... python scripts/bare_loop.py --program=tests/programs/clicks_csv_estimator.py \
        --data_dir=DIR --train_steps=3000 --batch_size=64

The ps serves until it is stopped; the chief initializes the variables; a worker waits for them. Every 100
of its runs each replica logs TensorFlow's own words, `global_step/sec: N`.
"""

import importlib.util
import json
import os
import time

from absl import app, flags

flags.DEFINE_string("program", None, "The program whose model_fn and input_fn are run.")
flags.DEFINE_string("data_dir", None, "The program's train-*.csv files.")
flags.DEFINE_integer("train_steps", 3000, "The global step to train to.")
flags.DEFINE_integer("batch_size", 64, "Examples a step.")
flags.DEFINE_string("model_dir", None, "Unused: the harness passes every program one.")
flags.DEFINE_integer("startup_timeout_secs", 300, "How long a worker waits for the chief's variables.")
FLAGS = flags.FLAGS
LOG_EVERY = 100


def main(argv):
    del argv
    import tensorflow as tf  # noqa: PLC0415  (after absl has read the flags)
    v1 = tf.compat.v1
    v1.disable_eager_execution()
    config = json.loads(os.environ["TF_CONFIG"])
    job, index = config["task"]["type"], config["task"].get("index", 0)
    hosts = config["cluster"]
    cluster = tf.train.ClusterSpec({"ps": hosts["ps"], "worker": hosts["chief"] + hosts.get("worker", [])})
    task = index + (1 if job == "worker" else 0)  # the chief is worker 0
    server = v1.train.Server(cluster, job_name="ps" if job == "ps" else "worker",
                             task_index=index if job == "ps" else task)
    if job == "ps":
        server.join()
        return
    found = importlib.util.spec_from_file_location("program", FLAGS.program)
    program = importlib.util.module_from_spec(found)
    found.loader.exec_module(program)
    with v1.device(v1.train.replica_device_setter(cluster=cluster, worker_device=f"/job:worker/task:{task}")):
        global_step = v1.train.get_or_create_global_step()
        features, labels = v1.data.make_one_shot_iterator(program.input_fn(
            os.path.join(FLAGS.data_dir, "train-*.csv"), True, FLAGS.batch_size)).get_next()
        model = program.model_fn(features, labels, tf.estimator.ModeKeys.TRAIN, {"learning_rate": 0.1})
    uninitialized = v1.report_uninitialized_variables()
    session_config = v1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{task}"])
    with v1.Session(server.target, config=session_config) as session:
        if job == "chief":
            session.run(v1.global_variables_initializer())
        deadline = time.monotonic() + FLAGS.startup_timeout_secs
        while len(session.run(uninitialized)):
            if time.monotonic() > deadline:
                raise SystemExit(f"{job}:{index}: the chief did not initialize the variables within "
                                 f"{FLAGS.startup_timeout_secs} s (--startup_timeout_secs)")
            time.sleep(0.1)
        step, started, runs = session.run(global_step), time.monotonic(), 0
        while step < FLAGS.train_steps:
            session.run((model.train_op, model.loss))
            runs += 1
            if runs % LOG_EVERY == 0:
                now, before = time.monotonic(), step
                step = session.run(global_step)
                print(f"global_step/sec: {(step - before) / (now - started):.3f}", flush=True)
                started = time.monotonic()
    print(f"{job}:{index} finished: global_step={step}", flush=True)


if __name__ == "__main__":
    app.run(main)
