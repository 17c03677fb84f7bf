#!/usr/bin/env python3
"""CPU per step of wide_deep's grouped table lookup and its sparse update, in one process on one thread.

    python scripts/lookup_cost.py                       # this tree
    python scripts/lookup_cost.py --tree=/tmp/release   # another checkout (a git worktree), to compare

The ops' own cost, without gRPC or a cluster: 26 embedding tables of 10,000 x 16 and 26 wide tables
of 10,000 x 2, read through --tree's model/grouped_lookup.py with zipf_clicks' ID distribution at batch
256, and updated by its Adagrad (training/optimizers.py). On a cluster the same ops run on the
worker and the ps; this adds them up. Prints CPU ms per step for each repetition.
"""

import importlib
import inspect
import pathlib
import sys
import time

from absl import app, flags

flags.DEFINE_string("tree", str(pathlib.Path(__file__).resolve().parent.parent), "The checkout whose code is timed.")
flags.DEFINE_integer("repetitions", 3, "Timed runs.", lower_bound=1)
flags.DEFINE_integer("steps", 400, "Steps timed per run (after 10 untimed).", lower_bound=1)
FLAGS = flags.FLAGS

COLUMNS, ROWS, BATCH = 26, 10000, 256


def batches(np, count):
    """[BATCH, COLUMNS] rows, each column's IDs Zipf-distributed over its cardinality (input/zipf_clicks.py),
    hashed into ROWS."""
    rng = np.random.default_rng(0)
    cardinalities = [int(round(3 * (1e6 / 3) ** (i / 25))) for i in range(COLUMNS)]
    made = []
    for _ in range(count):
        columns = []
        for cardinality in cardinalities:
            top = (cardinality + 1.0) ** -0.1
            ranks = np.minimum(np.floor((1 + rng.random(BATCH) * (top - 1)) ** -10.0) - 1, cardinality - 1)
            columns.append((ranks.astype(np.int64) * 2654435761) % ROWS)
        made.append(np.stack(columns, axis=1))
    return made


def main(argv):
    del argv
    sys.path.insert(0, FLAGS.tree)
    import numpy as np  # noqa: PLC0415  (after --tree is on sys.path: the tree's own TensorFlow code)
    import tensorflow as tf  # noqa: PLC0415  (after --tree is on sys.path: the tree's own TensorFlow code)
    # The tree's modules: in the ps_trainer namespace, or top-level in a tree from before it.
    namespace = "ps_trainer." if (pathlib.Path(FLAGS.tree) / "ps_trainer" / "trainer.py").exists() else ""
    grouped_lookup = importlib.import_module(f"{namespace}model.grouped_lookup")
    optimizers = importlib.import_module(f"{namespace}training.optimizers")
    print(f"timing {pathlib.Path(inspect.getfile(grouped_lookup)).resolve()}")
    v1 = tf.compat.v1
    data = batches(np, 50)
    for repetition in range(FLAGS.repetitions):
        with tf.Graph().as_default():
            deep = [v1.get_variable(f"deep{i}", [ROWS, 16]) for i in range(COLUMNS)]
            wide = [v1.get_variable(f"wide{i}", [ROWS, 2]) for i in range(COLUMNS)]
            ids = v1.placeholder(tf.int64, [None, COLUMNS])
            if "families" in inspect.signature(grouped_lookup.lookup).parameters:
                deep_rows, wide_rows = grouped_lookup.lookup([deep, wide], ids)
            else:  # a release before the families: one lookup per family
                deep_rows, wide_rows = grouped_lookup.lookup(deep, ids), grouped_lookup.lookup(wide, ids)
            loss = tf.reduce_sum(tf.square(deep_rows)) + tf.reduce_sum(wide_rows)
            train = optimizers.AdagradOptimizer(0.1).minimize(loss)
            config = v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
            with v1.Session(config=config) as session:
                session.run(v1.global_variables_initializer())
                for step in range(10):
                    session.run(train, {ids: data[step]})
                start = time.process_time()
                for step in range(FLAGS.steps):
                    session.run(train, {ids: data[step % len(data)]})
                cpu_ms = (time.process_time() - start) / FLAGS.steps * 1000
        print(f"repetition {repetition}: {cpu_ms:.2f} ms of CPU per step", flush=True)


if __name__ == "__main__":
    app.run(main)
