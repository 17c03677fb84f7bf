#!/usr/bin/env python3
"""How large a dynamic table the ps tasks hold: memory per live row, and the time to checkpoint and
restore it.

    python scripts/table_scale.py                          # 10,000,000 IDs over 2 ps, width 16, Adagrad
    python scripts/table_scale.py --ids=1000000 --num_ps=1

Starts --num_ps ps tasks of trainer.py on 127.0.0.1 (real processes) and is their one worker: one
table of model/dynamic/, sharded over them, trained by Adagrad; its storage starts small and
grows with the IDs (--embedding_growth: its upkeep, which training runs every few steps, runs after
each step here). It admits --ids distinct IDs, --batch_ids per batch (each step gathers the batch's
rows and applies Adagrad's sparse update on the ps that holds them; a batch larger than the rows left
is trained twice, the second step admitting the IDs the first found no room for), saves a
checkpoint, kills and restarts every ps (they come back
empty), restores the checkpoint onto them and checks that every sampled ID has the same row and the
same values as before.

Prints each ps's resident memory at start (TensorFlow alone), once the table is initialized, and
after the admissions (and its peak, before and with the save, which copies the map out); the bytes
per live row over the start against the row's and its Adagrad slot's own bytes, and the rows the
storage holds; and the step, save and restore times with the checkpoint's size.
"""

import pathlib
import sys
import time

import numpy as np
from absl import app, flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import tensorflow as tf  # noqa: E402

from ps_trainer.cluster import spec  # noqa: E402
from ps_trainer.training import optimizers  # noqa: E402
from ps_trainer.launch import faults  # noqa: E402
from ps_trainer.launch.processes import LocalCluster  # noqa: E402
from ps_trainer.model.dynamic import ids as table_ids, storage as table_storage  # noqa: E402
from ps_trainer.model.dynamic import table as dynamic_table, upkeep as table_upkeep  # noqa: E402
from ps_trainer.model.graph_tables import GraphTables  # noqa: E402

flags.DEFINE_integer("ids", 10_000_000, "Distinct IDs admitted (live rows at the end).", lower_bound=1000)
flags.DEFINE_integer("num_ps", 2, "ps tasks the table is sharded over.", lower_bound=1)
flags.DEFINE_integer("width", 16, "Width of each row.", lower_bound=1)
flags.DEFINE_integer("batch_ids", 500_000, "New IDs per training step.", lower_bound=1)
flags.DEFINE_integer("sample", 20_000, "IDs whose rows and values are compared after the restore.", lower_bound=1)
flags.DEFINE_string("output_dir", "runs/table_scale", "Where the ps logs and the checkpoint go.")
FLAGS = flags.FLAGS

v1 = tf.compat.v1
STARTUP_SECS = 120


def rss_mib(pid: int) -> tuple[float, float]:
    """(resident, peak resident) MiB of a process, from /proc."""
    fields = dict(line.split(":", 1) for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines()
                  if ":" in line)
    return tuple(int(fields[name].split()[0]) / 1024 for name in ("VmRSS", "VmHWM"))


def ps_memory(cluster) -> list[tuple[float, float]]:
    return [rss_mib(proc.pid) for _, proc in cluster.tasks("ps")]


def start_ps_tasks(cluster, serving_count: int) -> None:
    deadline = time.monotonic() + STARTUP_SECS
    for index in range(FLAGS.num_ps):
        cluster.start("ps", index)
    for index in range(FLAGS.num_ps):
        faults.wait_until(cluster, lambda i=index: cluster.log("ps", i).count(": serving on ") == serving_count,
                          deadline, f"ps {index} to serve")


def build(cfg, capacity: int):
    """(ids, train op, the table's upkeep, the rows of ids, rows held): reading the rows of IDs
    already admitted changes nothing."""
    ids = v1.placeholder(tf.int64, [None], name="ids")
    options = table_ids.TableOptions(capacity=capacity, shards=FLAGS.num_ps, devices=cfg.ps_devices(), grow=True)
    with v1.device(cfg.worker_device()):
        global_step = v1.train.get_or_create_global_step()
    graph_tables = GraphTables()
    table = dynamic_table.DynamicTable(graph_tables, "scale", ids, options, training=True)
    rows = table.rows("embedding", FLAGS.width, v1.random_normal_initializer(stddev=0.01))
    with v1.device(cfg.worker_device()):
        loss = tf.reduce_mean(tf.square(rows - 1.0))
    optimizer = optimizers.AdagradOptimizer(0.1, graph_tables=graph_tables)
    train = optimizer.minimize(loss, global_step=global_step)
    slots_of = lambda variable: optimizers.slots_and_starts(optimizer, variable)  # noqa: E731
    held = tf.add_n([shard.held for shard in table._shards])  # noqa: SLF001  (the table's shards, measured)
    return ids, train, table_upkeep.upkeep(graph_tables, slots_of), rows, held


def main(argv):
    del argv
    out = pathlib.Path(FLAGS.output_dir).resolve()
    cluster = LocalCluster(out, num_ps=FLAGS.num_ps, num_workers=1,
                           trainer_args=[f"--model_dir={out / 'ps_model_dir'}"])
    cfg = spec.ClusterConfig(tuple(cluster.ps_hosts), tuple(cluster.worker_hosts), "worker", 0)
    server = v1.train.Server(cfg.cluster_spec(), job_name="worker", task_index=0, config=spec.session_config(cfg))
    (out / "checkpoint").mkdir(parents=True, exist_ok=True)
    checkpoint = str(out / "checkpoint" / "table.ckpt")
    all_ids = np.random.RandomState(0).permutation(FLAGS.ids).astype(np.int64) * 7919 + 13
    sample = all_ids[:: max(1, FLAGS.ids // FLAGS.sample)]
    capacity = 2 * FLAGS.ids  # a limit: the storage grows with the IDs
    try:
        start_ps_tasks(cluster, 1)
        at_start = ps_memory(cluster)
        with tf.Graph().as_default():
            ids, train, upkeep, served, held = build(cfg, capacity)
            saver = v1.train.Saver(sharded=True)
            live = tf.add_n(v1.get_collection(table_storage.LIVE_ROWS))  # each shard's map size, read on its ps
            with v1.Session(server.target, config=spec.session_config(cfg)) as sess:
                began = time.monotonic()
                sess.run(v1.global_variables_initializer())
                init_secs, initialized = time.monotonic() - began, ps_memory(cluster)
                began = time.monotonic()
                steps = 0
                for first in range(0, FLAGS.ids, FLAGS.batch_ids):
                    before_batch = int(sess.run(live))
                    for _ in range(2):
                        sess.run(train, {ids: all_ids[first:first + FLAGS.batch_ids]})
                        upkeep.grow_as_needed(sess, sess.run(list(upkeep.needs)))
                        steps += 1
                        if int(sess.run(live)) - before_batch == len(all_ids[first:first + FLAGS.batch_ids]):
                            break
                steps_secs = time.monotonic() - began
                filled, (live_rows, rows_held) = ps_memory(cluster), map(int, sess.run([live, held]))
                before = sess.run(served, {ids: sample})
                began = time.monotonic()
                path = saver.save(sess, checkpoint, write_meta_graph=False)
                save_secs, saved = time.monotonic() - began, ps_memory(cluster)
            for index in range(FLAGS.num_ps):
                cluster.kill("ps", index)
            cluster.wait("ps", timeout=30)
            start_ps_tasks(cluster, 2)
            with v1.Session(server.target, config=spec.session_config(cfg)) as sess:
                began = time.monotonic()
                saver.restore(sess, path)
                upkeep.after_restore(sess)
                restore_secs = time.monotonic() - began
                after, restored_rows = sess.run(served, {ids: sample}), int(sess.run(live))
    finally:
        cluster.stop_all()
    size = sum(f.stat().st_size for f in (out / "checkpoint").glob("table.ckpt*"))
    row_bytes = 2 * FLAGS.width * 4  # the row and its Adagrad accumulator, float32
    print(f"table: {FLAGS.ids:,} IDs over {FLAGS.num_ps} ps (a limit of {capacity:,} rows), width {FLAGS.width}, "
          f"Adagrad ({row_bytes} bytes of row and slot per ID)")
    for index in range(FLAGS.num_ps):
        print(f"ps {index} resident MiB: start {at_start[index][0]:.0f}, initialized {initialized[index][0]:.0f}, "
              f"after admission {filled[index][0]:.0f} (peak {filled[index][1]:.0f}; "
              f"with the save's {saved[index][1]:.0f})")
    grown = sum(f[0] - s[0] for f, s in zip(filled, at_start)) * 2**20
    print(f"live rows {live_rows:,}, rows held {rows_held:,} ({rows_held / live_rows:.3f}x); resident bytes per live "
          f"row over the start: {grown / live_rows:.0f} ({grown / live_rows / row_bytes:.2f}x the row and slot)")
    print(f"initialize {init_secs:.1f} s; admit and train {steps} steps of up to {FLAGS.batch_ids:,} new IDs: "
          f"{steps_secs:.1f} s ({FLAGS.ids / steps_secs:,.0f} IDs/s)")
    print(f"checkpoint {size / 2**20:.0f} MiB: save {save_secs:.1f} s, restore onto restarted ps tasks "
          f"{restore_secs:.1f} s")
    same = restored_rows == live_rows and np.array_equal(before, after)
    print(f"after the restore: live rows {restored_rows:,}, {len(sample):,} sampled IDs "
          f"{'read the same values' if same else 'DIFFER'}")
    return 0 if same else 1


if __name__ == "__main__":
    app.run(main)
