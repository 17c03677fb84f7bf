#!/usr/bin/env python3
"""What incremental checkpoints save and cost, read from a run's model_dir: the bytes of each full
checkpoint and of its deltas, and the time to restore a full checkpoint alone and with its deltas.

    python scripts/run_local.py --num_ps=2 -- --model_dir=/tmp/big --model=wide_deep \\
        --dataset=zipf_clicks --synthetic_examples=200000 --hash_buckets=300000 --batch_size=256 \\
        --embedding_partitions=2 \\
        --incremental_save_secs=5 --save_checkpoint_secs=60 --keep_checkpoint_max=20 --train_steps=3000
    python scripts/delta_checkpoints.py --model_dir=/tmp/big --model=wide_deep --dataset=zipf_clicks

The rows changed per delta and the pause of each save are in the chief's log ("saved delta
checkpoint ..."; a full save between "Saving checkpoints for" and "after saving"). The restores run
in this process, as the chief's saver does them (training/checkpoints.py) into the run's graph as its
run.json describes it (give the run's --model, so that the graph has its optimizer's slots), on no
ps: reading the files and scattering the rows is the cost measured.
"""

import os
import pathlib
import sys
import time

from absl import app, flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import tensorflow as tf  # noqa: E402

from ps_trainer.flags import config, definitions  # noqa: E402
from ps_trainer.training import checkpoints, incremental, run_record  # noqa: E402
from ps_trainer.training import graph as train_graph  # noqa: E402

FLAGS = flags.FLAGS
definitions.define(FLAGS)  # trainer.py's flags: the run's settings, as run.json and the command line give them
v1 = tf.compat.v1


def restore_seconds(cfg, prefix: str, with_deltas: bool) -> float:
    with tf.Graph().as_default():
        graph = train_graph.build_graph(cfg)
        deltas = graph.saver.deltas if with_deltas else None
        with v1.Session() as sess:
            start = time.monotonic()
            plain = lambda session, path: v1.train.Saver.restore(graph.saver, session, path)  # noqa: E731
            checkpoints.restore_with_deltas(sess, plain, deltas, prefix)
            return time.monotonic() - start


def main(argv):
    model_dir = FLAGS.model_dir
    cfg, _ = run_record.follow(config.read(FLAGS, argv), run_record.read(model_dir))
    state = tf.train.get_checkpoint_state(model_dir)
    fulls = [os.path.join(model_dir, os.path.basename(path)) for path in state.all_model_checkpoint_paths]
    for full in fulls:
        deltas = incremental.deltas_of(full)
        sizes = [checkpoints.bytes_on_disk(delta) for delta in deltas]
        rows = [incremental.rows_held(delta) for delta in deltas]
        print(f"{os.path.basename(full)}: {checkpoints.bytes_on_disk(full):,} bytes; {len(deltas)} deltas"
              + (f" of {min(sizes):,} to {max(sizes):,} bytes, {min(rows):,} to {max(rows):,} rows" if deltas else ""))
    chained = [full for full in fulls if incremental.deltas_of(full)]
    if not chained:
        print("no full checkpoint with deltas")
        return
    full = chained[-1]
    count = len(incremental.deltas_of(full))
    # Twice each, interleaved: the first read of the files fills the page cache.
    times = [(restore_seconds(cfg, full, False), restore_seconds(cfg, full, True)) for _ in range(2)]
    print(f"restore of {os.path.basename(full)}: " + "; then ".join(
        f"{alone:.2f} s alone, {with_deltas:.2f} s with its {count} deltas" for alone, with_deltas in times))


if __name__ == "__main__":
    app.run(main)
