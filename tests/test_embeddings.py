"""Dynamic embedding tables (model/dynamic/): a row per raw ID, never shared, kept across
steps, checkpoints and a ps restart; admission; a full table; serving raw IDs; a real cluster."""

import dataclasses
import os
import re
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf

from ps_trainer import input as inputs
from ps_trainer.cluster import spec
from ps_trainer.launch import chaos, measure
from ps_trainer.model.dynamic import ids as table_ids, storage as table_storage
from ps_trainer.model.dynamic import table as dynamic_table, upkeep as table_upkeep
from ps_trainer.model.graph_tables import GraphTables
from tests.support import (ROOT, describe, finished, in_process_cluster, join_all, logged_step, read_flags,
                           run_trainer, saved_maps, serve_in_fresh_process, tf_session, wait_for,
                           write_criteo_shaped_tsvs)
from ps_trainer.training import export, incremental, log_lines, run_record
from ps_trainer.training import graph as train_graph
from ps_trainer.training.config import TrainConfig
from ps_trainer.training import optimizers

v1 = tf.compat.v1
WIDTH = 3


def table_graph(ids_dtype=tf.string, capacity=40, shards=2, min_count=1, training=True, devices=(),
                steps_to_live=0, initializer=None, grow=False):
    """(ids placeholder, their rows of a WIDTH-wide variable 'embedding', the table) in the default graph."""
    ids = v1.placeholder(ids_dtype, [None], name="ids")
    options = table_ids.TableOptions(capacity=capacity, shards=shards, devices=devices, min_count=min_count,
                                      steps_to_live=steps_to_live, grow=grow)
    with v1.variable_scope("user"):
        table = dynamic_table.DynamicTable(GraphTables(), "user", ids, options, training)
        rows = table.rows("embedding", WIDTH, initializer or v1.random_normal_initializer(seed=1))
    return ids, rows, table


@pytest.mark.inprocess
@pytest.mark.parametrize("dtype,batches", [
    (tf.string, [["a", "b", "a", "c"], ["c", "d", "b"], ["e", "a", "f", "g", "h"]]),
    (tf.int64, [[7, 1 << 40, 7, 3], [3, -5, 1 << 40], [11, 7, 12, 13, 14]]),
])
def test_each_id_gets_a_row_of_its_own_that_stays_across_steps_and_a_checkpoint(tmp_path, dtype, batches):
    with tf.Graph().as_default():
        ids, rows, _ = table_graph(dtype)
        with tf_session() as sess:
            sess.run(v1.global_variables_initializer())
            seen = {}
            for batch in batches:
                for key, row in zip(batch, sess.run(rows, {ids: batch})):
                    seen.setdefault(key, row)
                    np.testing.assert_array_equal(row, seen[key])  # the same ID, the same row, every step
            checkpoint = v1.train.Saver().save(sess, str(tmp_path / "model.ckpt"))
    maps = saved_maps(checkpoint)
    assert sorted(maps) == [0, 1]
    keys = [key for shard in maps.values() for key in shard]
    assert sorted(keys) == sorted(seen)  # every ID in exactly one shard
    for shard in maps.values():  # within a shard, no row shared, none the default row
        assert len(set(shard.values())) == len(shard) and min(shard.values()) > table_storage.DEFAULT_ROW
    reader = tf.train.load_checkpoint(checkpoint)
    for number, shard in maps.items():
        stored = reader.get_tensor(f"user/shard{number}/embedding")
        for key, row in shard.items():
            np.testing.assert_array_equal(stored[row], seen[key])  # what a lookup read is that row


@pytest.mark.inprocess
def test_a_rounds_push_skips_the_rows_an_eviction_took_from_the_ids_it_read_them_for():
    """A round (training/step/row_copies.py) reads rows at its start and adds its changes at its end; an
    eviction in between may reset a row, or hand it to another ID: the push leaves those rows alone."""
    from ps_trainer.training.step import row_copies
    with tf.Graph().as_default():
        ids, rows, table = table_graph(capacity=20, shards=1)
        keys, found, pushed = (v1.placeholder(dtype, [None]) for dtype in (tf.string, tf.int64, tf.int64))
        shard = table.shards[0]
        kept = row_copies.Guard(shard, keys, found).kept(pushed)
        evict_b_and_c = shard.map.remove(tf.constant(["b", "c"]))
        give_b_row_to_d = shard.map.insert(tf.constant(["d"]), tf.constant([2], tf.int64))
        with tf_session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(rows, {ids: ["a", "b", "c"]})  # rows 1, 2 and 3
            read = {keys: ["a", "b", "c", "never admitted"], found: [1, 2, 3, 0], pushed: [0, 1, 2, 3]}
            assert sess.run(kept, read).tolist() == [True, True, True, True]
            sess.run(evict_b_and_c)
            sess.run(give_b_row_to_d)
            # b's row is d's now, c's is free: only a's and the default row take the round's changes.
            assert sess.run(kept, read).tolist() == [True, True, False, False]


@pytest.mark.inprocess
def test_a_step_updates_the_rows_of_the_batch_and_no_other():
    with tf.Graph().as_default():
        ids, rows, _ = table_graph(capacity=20, shards=1)
        train = v1.train.GradientDescentOptimizer(0.5).minimize(tf.reduce_sum(rows))
        table = [v for v in v1.global_variables() if v.op.name == "user/shard0/embedding"][0]
        with tf_session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(rows, {ids: ["a", "b"]})  # rows 1 and 2
            before = sess.run(table)
            sess.run(train, {ids: ["b", "c", "b"]})  # c: row 3
            after = sess.run(table)
    changed = sorted(np.flatnonzero(np.any(after != before, axis=1)))
    assert changed == [2, 3]
    np.testing.assert_allclose(after[2] - before[2], -1.0)  # b twice in the batch: two gradients of 1 * 0.5
    np.testing.assert_allclose(after[3] - before[3], -0.5)


@pytest.mark.inprocess
def test_an_id_reads_the_default_row_until_its_nth_sighting_then_gets_its_own():
    with tf.Graph().as_default():
        ids, rows, table = table_graph(shards=1, min_count=3)
        live = v1.get_collection(table_storage.LIVE_ROWS)
        with tf_session() as sess:
            sess.run(v1.global_variables_initializer())
            default = sess.run(rows, {ids: ["never"]})[0]
            got = sess.run(rows, {ids: ["x", "y"]})  # one sighting each
            np.testing.assert_array_equal(got, [default, default])
            assert sess.run(live) == [0]
            got = sess.run(rows, {ids: ["x", "y", "x"]})  # x: 3 sightings (each occurrence counts), y: 2
            assert sess.run(live) == [1]
            assert not np.array_equal(got[0], default)
            np.testing.assert_array_equal(got[2], got[0])
            np.testing.assert_array_equal(got[1], default)
            np.testing.assert_array_equal(sess.run(rows, {ids: ["x", "z"]}), [got[0], default])


@pytest.mark.inprocess
def test_a_full_table_stops_with_a_message_naming_the_table_and_the_flag():
    with tf.Graph().as_default():
        ids, rows, _ = table_graph(capacity=4, shards=1)  # the default row and 3 IDs
        with tf_session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(rows, {ids: ["a", "b", "c"]})
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match=r"embedding table user is full: shard 0 holds 4 rows "
                                     r"\(--embedding_capacity=4 over 1 shards\); raise --embedding_capacity"):
                sess.run(rows, {ids: ["a", "d"]})


def train_and_keep_up(sess, train, upkeep, feed=None):
    """A training run, then the tables' upkeep, as the training loop runs it (every few runs)."""
    sess.run(train, feed)
    upkeep.grow_as_needed(sess, sess.run(list(upkeep.needs)))


def map_of(sess, table) -> dict:
    """{ID: (shard, row)} of a table, read from its maps."""
    found = {}
    for shard, (keys, rows) in enumerate(sess.run(table.contents())):
        found.update((int(key), (shard, int(row))) for key, row in zip(keys, rows))
    return found


@pytest.mark.inprocess
def test_storage_grows_with_the_ids_met_keeping_every_row_value_and_slot_and_never_sharing_a_row():
    batch = 3000
    with tf.Graph().as_default():
        ids, rows, table = table_graph(tf.int64, capacity=200_000, shards=2, grow=True)
        optimizer = optimizers.AdagradOptimizer(0.1, graph_tables=table.graph_tables)
        train = optimizer.minimize(tf.reduce_sum(rows))
        upkeep = table_upkeep.upkeep(table.graph_tables, lambda v: optimizers.slots_and_starts(optimizer, v))
        storages = sorted((v for v in v1.global_variables() if v.op.name.endswith("/embedding")),
                          key=lambda v: v.op.name)
        slots = [optimizer.get_slot(v, "accumulator") for v in storages]
        assert storages[0].shape.as_list() == [None, WIDTH]  # rows grow; the width is known
        with tf_session() as sess:
            sess.run(v1.global_variables_initializer())
            assert [len(v) for v in sess.run(storages)] == [table_storage.GROWTH_ROWS] * 2
            first = np.arange(batch, dtype=np.int64) * 7 + 1
            train_and_keep_up(sess, train, upkeep, {ids: first})
            trained = sess.run([storages, slots])
            rows_then = map_of(sess, table)
            for step in range(1, 12):  # 33,000 more IDs; the first batch's rows no step touches again
                for _ in range(3):  # an ID that met no room gets a row at a later sighting
                    train_and_keep_up(sess, train, upkeep, {ids: first + step * batch * 7})
            rows_now = map_of(sess, table)
            values, accumulators, next_rows = sess.run([storages, slots, table._shards[0].next_row])
            lengths = [len(v) for v in values]
            # The first batch's IDs keep their rows, and those rows their values and slots, through growths.
            assert {key: rows_now[key] for key in rows_then} == rows_then
            for shard, row in rows_then.values():
                np.testing.assert_array_equal(values[shard][row], trained[0][shard][row])
                np.testing.assert_array_equal(accumulators[shard][row], trained[1][shard][row])
            # Every ID has a row of its own, within its shard's storage; the slots grew with the rows.
            assert len(rows_now) == 12 * batch and len(set(rows_now.values())) == len(rows_now)
            assert all(row < lengths[shard] for shard, row in rows_now.values())
            assert [len(a) for a in accumulators] == lengths
            # The storage holds what the IDs need, with a growth step of room at most.
            for shard in (0, 1):
                live = sum(1 for s, _ in rows_now.values() if s == shard)
                assert live < lengths[shard] <= live + 1 + max(table_storage.GROWTH_ROWS, lengths[shard] // 8) * 2
            # Rows a step finds no room for read the default row and get one at a later sighting.
            burst = np.arange(20_000, dtype=np.int64) * 7 + 10_000_000
            train_and_keep_up(sess, train, upkeep, {ids: burst})
            admitted = len(map_of(sess, table)) - 12 * batch
            assert 0 < admitted < len(burst)
            for _ in range(3):
                train_and_keep_up(sess, train, upkeep, {ids: burst})
            rows_after = map_of(sess, table)
            assert len(rows_after) == 12 * batch + len(burst) and len(set(rows_after.values())) == len(rows_after)
            lengths = [len(v) for v in sess.run(storages)]
            assert all(row < lengths[shard] for shard, row in rows_after.values())
            assert next_rows > 1


@pytest.mark.inprocess
def test_a_full_table_resumes_from_its_checkpoint_with_a_higher_capacity(tmp_path):
    def graph(capacity):
        ids, rows, table = table_graph(capacity=capacity, shards=1, grow=True)
        return ids, rows, table, table_upkeep.upkeep(table.graph_tables, lambda variable: [])

    with tf.Graph().as_default():
        ids, rows, table, _ = graph(capacity=4)
        with tf_session() as sess:
            sess.run(v1.global_variables_initializer())
            trained = sess.run(rows, {ids: ["a", "b", "c"]})
            with pytest.raises(tf.errors.InvalidArgumentError, match="embedding table user is full"):
                sess.run(rows, {ids: ["d"]})
            checkpoint = v1.train.Saver().save(sess, str(tmp_path / "model.ckpt"))
    with tf.Graph().as_default():
        ids, rows, table, upkeep = graph(capacity=8)
        with tf_session() as sess:
            v1.train.Saver().restore(sess, checkpoint)
            upkeep.after_restore(sess)
            np.testing.assert_array_equal(sess.run(rows, {ids: ["a", "b", "c"]}), trained)
            train_and_keep_up(sess, [], upkeep)  # as training does every few steps
            sess.run(rows, {ids: ["d", "e"]})
            assert map_of_strings(sess, table) == {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5}


def map_of_strings(sess, table) -> dict:
    (keys, rows), = sess.run(table.contents())
    return {key.decode(): int(row) for key, row in zip(keys, rows)}


@pytest.mark.inprocess
def test_a_map_saved_by_the_last_release_restores_and_the_map_saves_the_same_pairs(tmp_path):
    """Until 91c5922 a map was a MutableHashTable; its checkpoint holds its (ID, row) pairs under
    "<name>-keys" and "-values", as the map of today saves them."""
    with tf.Graph().as_default():
        with v1.name_scope(None):
            old = tf.lookup.experimental.MutableHashTable(tf.string, tf.int64, -1, name="user/shard0/rows_of_ids")
        with tf_session() as sess:
            sess.run(old.insert(["a", "b", "c"], tf.constant([3, 1, 2], tf.int64)))
            checkpoint = v1.train.Saver().save(sess, str(tmp_path / "old.ckpt"))
    with tf.Graph().as_default():
        ids, _, table = table_graph(shards=1)
        maps = v1.get_collection(v1.GraphKeys.SAVEABLE_OBJECTS)
        with tf_session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(table._shards[0].map.insert(["z"], tf.constant([9], tf.int64)))  # replaced by the restore
            v1.train.Saver(maps).restore(sess, checkpoint)
            assert map_of_strings(sess, table) == {"a": 3, "b": 1, "c": 2}
            saved = v1.train.Saver(maps).save(sess, str(tmp_path / "new.ckpt"))
    assert saved_maps(saved) == {0: {"a": 3, "b": 1, "c": 2}}


@pytest.mark.inprocess
def test_the_ids_the_map_keeps_for_itself_read_the_default_row_and_are_never_admitted():
    with tf.Graph().as_default():
        ids, rows, table = table_graph(tf.int64, shards=1)
        lowest = np.iinfo(np.int64).min
        with tf_session() as sess:
            sess.run(v1.global_variables_initializer())
            storage = [v for v in v1.global_variables() if v.op.name == "user/shard0/embedding"][0]
            default = sess.run(storage)[table_storage.DEFAULT_ROW]
            got = sess.run(rows, {ids: [lowest, lowest + 1, lowest + 2, 5]})  # the 3 lowest int64s: no ID
            np.testing.assert_array_equal(got[:3], [default, default, default])
            assert sorted(map_of(sess, table)) == [5]


@pytest.mark.inprocess
def test_a_restore_of_a_save_caught_mid_growth_gives_every_row_variable_the_rows_the_map_names(tmp_path):
    """A save is not atomic: one taken during a growth or an admission can hold a slot shorter than its
    rows, or a map naming rows past next_row. The upkeep after the restore mends both."""
    with tf.Graph().as_default():
        ids, rows, table = table_graph(tf.int64, capacity=100_000, shards=1, grow=True)
        optimizer = optimizers.AdagradOptimizer(0.1, graph_tables=table.graph_tables)
        train = optimizer.minimize(tf.reduce_sum(rows))
        slots_of = lambda variable: optimizers.slots_and_starts(optimizer, variable)  # noqa: E731
        upkeep = table_upkeep.upkeep(table.graph_tables, slots_of)
        shard = table._shards[0]
        storage = [v for v in v1.global_variables() if v.op.name == "user/shard0/embedding"][0]
        accumulator = optimizer.get_slot(storage, "accumulator")
        with tf_session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(train, {ids: np.arange(100, dtype=np.int64)})
            # As a save might catch it: the rows grown, their slot not yet; next_row read before an admission.
            sess.run([storage.assign(tf.concat([storage, tf.ones([5000, WIDTH])], 0)), shard.next_row.assign(50)])
            checkpoint = v1.train.Saver().save(sess, str(tmp_path / "model.ckpt"))
            sess.run(v1.global_variables_initializer())
            v1.train.Saver().restore(sess, checkpoint)
            upkeep.after_restore(sess)
            lengths = [len(v) for v in sess.run([storage, accumulator])]
            assert lengths == [table_storage.GROWTH_ROWS + 5000] * 2
            np.testing.assert_allclose(sess.run(accumulator)[table_storage.GROWTH_ROWS:], 0.1)  # fresh slot rows
            assert sess.run([shard.next_row, shard.held]) == [101, lengths[0]]  # past the 100 rows named
            sess.run(train, {ids: [1000, 1001]})  # new IDs get rows of their own, past those
            new_rows = [row for key, (_, row) in map_of(sess, table).items() if key >= 1000]
            assert sorted(new_rows) == [101, 102]


@pytest.mark.inprocess
def test_a_restored_table_serves_raw_ids_and_stores_none_it_does_not_know(tmp_path):
    with tf.Graph().as_default():
        ids, rows, _ = table_graph()
        with tf_session() as sess:
            sess.run(v1.global_variables_initializer())
            trained = dict(zip(["a", "b", "c"], sess.run(rows, {ids: ["a", "b", "c"]})))
            checkpoint = v1.train.Saver().save(sess, str(tmp_path / "model.ckpt"))
    with tf.Graph().as_default():
        ids, rows, _ = table_graph(training=False)
        live = v1.get_collection(table_storage.LIVE_ROWS)
        with tf_session() as sess:
            v1.train.Saver().restore(sess, checkpoint)
            served = sess.run(rows, {ids: ["c", "new", "a", "", "b", "other"]})
            assert sum(sess.run(live)) == 3  # nothing stored for "new", "" or "other"
    for index, key in ((0, "c"), (2, "a"), (4, "b")):
        np.testing.assert_array_equal(served[index], trained[key])
    # Unknown IDs read their shard's default row (row 0 of the shard their hash picks).
    reader = tf.train.load_checkpoint(checkpoint)
    defaults = [reader.get_tensor(f"user/shard{s}/embedding")[table_storage.DEFAULT_ROW] for s in (0, 1)]
    for index in (1, 3, 5):
        assert any(np.array_equal(served[index], default) for default in defaults)


@pytest.mark.inprocess
def test_eviction_frees_the_rows_untouched_for_steps_to_live_resets_them_and_their_slots_and_reuses_them():
    with tf.Graph().as_default():
        global_step = v1.train.get_or_create_global_step()
        ids, rows, user = table_graph(capacity=6, shards=1, steps_to_live=3, initializer=v1.zeros_initializer())
        optimizer = v1.train.AdagradOptimizer(0.5, initial_accumulator_value=0.1)
        train = optimizer.minimize(tf.reduce_sum(rows), global_step=global_step)
        evict = table_upkeep.eviction(user.graph_tables,
                                      lambda variable: [(optimizer.get_slot(variable, "accumulator"), 0.1)])
        table = [v for v in v1.global_variables() if v.op.name == "user/shard0/embedding"][0]
        accumulator = optimizer.get_slot(table, "accumulator")
        live = v1.get_collection(table_storage.LIVE_ROWS)
        with tf_session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(train, {ids: ["a", "b"]})  # step 1: a row 1, b row 2
            for _ in range(4):  # steps 2-5: a only
                sess.run(train, {ids: ["a"]})
            assert sess.run(evict) == {"user": 1}  # b: last read at step 0 < 5 - 3
            assert sess.run(live) == [1]
            values, slots = sess.run([table, accumulator])
            np.testing.assert_array_equal(values[2], np.zeros(WIDTH))  # b's row as initialized
            np.testing.assert_allclose(slots[2], 0.1)
            assert values[1][0] < 0 and slots[1][0] > 0.1  # a's row trained on
            sess.run(train, {ids: ["c", "d"]})  # c takes b's row back; d a new one
            after = sess.run(table)
            assert sess.run(evict) == {"user": 0}
    np.testing.assert_array_less(after[2], 0)  # c trained row 2
    np.testing.assert_array_less(after[3], 0)  # d row 3
    np.testing.assert_array_equal(after[4:], 0)  # nothing else handed out


@pytest.mark.e2e
def test_the_chief_evicts_before_each_checkpoint_which_leaves_the_evicted_ids_out(tmp_path):
    result = run_trainer(f"--model_dir={tmp_path}", "--model=wide_deep", "--dataset=clicks",
                         "--synthetic_examples=8000", "--embedding=dynamic", "--embedding_steps_to_live=50",
                         "--train_steps=400",
                         "--save_checkpoint_steps=200", "--export_saved_model=false", "--log_every_n_steps=200")
    assert result.returncode == 0, result.stderr[-3000:]
    evicted = re.findall(r"evicted the rows no step read in the last 50 global steps: .*wide_deep/user (\d+)",
                         result.stderr)
    assert len(evicted) >= 2 and int(evicted[-1]) > 0, result.stderr[-3000:]
    at_end = int(re.search(r"at the end, live rows: .*wide_deep/user (\d+)", result.stderr).group(1))
    reader = tf.train.load_checkpoint(str(tmp_path))
    assert reader.get_tensor("global_step") == 400
    # The final checkpoint (step 400, saved after the last eviction, before the end's count) holds the IDs
    # still live, and the freed rows.
    assert len(reader.get_tensor("wide_deep/user/shard0/rows_of_ids-keys")) == at_end
    assert reader.get_tensor("wide_deep/user/shard0/free_count") >= int(evicted[-1])


@pytest.mark.servers
def test_workers_admitting_the_same_new_ids_at_once_give_each_one_row_and_lose_none():
    workers, _, configs = in_process_cluster(num_workers=2, num_ps=1)
    keys = [f"id{i}" for i in range(3000)]
    with tf.Graph().as_default():
        table_graph(capacity=4000, shards=1, devices=configs[0].ps_devices())
        with tf_session(workers[0].target) as sess:
            sess.run(v1.global_variables_initializer())

    def admit(worker, order):
        with tf.Graph().as_default():
            ids, rows, _ = table_graph(capacity=4000, shards=1, devices=configs[0].ps_devices())
            with tf_session(worker.target) as sess:
                start.wait(30)
                for first in range(0, len(order), 100):  # the same new IDs, batch after batch, at once
                    sess.run(rows, {ids: order[first:first + 100]})

    start = threading.Barrier(4)
    threads = [threading.Thread(target=admit, args=(worker, keys)) for worker in (*workers, *workers)]
    for thread in threads:
        thread.start()
    join_all(threads, timeout=120)
    with tf.Graph().as_default():
        _, _, table = table_graph(capacity=4000, shards=1, devices=configs[0].ps_devices())
        next_row = [v for v in v1.global_variables() if v.op.name == "user/shard0/next_row"][0]
        with tf_session(workers[0].target) as sess:
            (exported_keys, exported_rows), = sess.run(table.contents())
            next_row = sess.run(next_row)
    assert sorted(k.decode() for k in exported_keys) == sorted(keys)
    assert sorted(exported_rows) == list(range(1, len(keys) + 1))  # one row each, none handed out twice
    assert next_row == len(keys) + 1  # and none lost


@pytest.mark.servers
def test_workers_training_while_the_storage_grows_under_them_never_meet_a_slot_of_another_length():
    """A growth replaces a shard's row variable and its slots one by one; an optimizer's update (in the
    shard's lock, like the growth) never runs between: TensorFlow's sparse apply would refuse them."""
    workers, _, configs = in_process_cluster(num_workers=2, num_ps=1)
    devices = configs[0].ps_devices()
    all_ids = np.arange(16_000, dtype=np.int64) * 3 + 5

    def graph():
        ids, rows, table = table_graph(tf.int64, capacity=100_000, shards=1, devices=devices, grow=True)
        optimizer = optimizers.OPTIMIZERS["adagrad"](0.1, None, table.graph_tables)
        train = optimizer.minimize(tf.reduce_sum(tf.square(rows)))
        upkeep = table_upkeep.upkeep(table.graph_tables, lambda v: optimizers.slots_and_starts(optimizer, v))
        return ids, train, upkeep, table, optimizer

    with tf.Graph().as_default():
        graph()
        with tf_session(workers[0].target) as sess:
            sess.run(v1.global_variables_initializer())

    def train(worker, order):
        with tf.Graph().as_default():
            ids, step, upkeep, _, _ = graph()
            with tf_session(worker.target) as sess:
                start.wait(30)
                for _ in range(2):  # twice: an ID that met no room gets a row at its next sighting
                    for first in range(0, len(order), 400):
                        train_and_keep_up(sess, step, upkeep, {ids: order[first:first + 400]})

    start = threading.Barrier(4)
    orders = [all_ids, all_ids[::-1], np.random.RandomState(1).permutation(all_ids), all_ids[1::2]]
    threads = [threading.Thread(target=train, args=(worker, order))
               for worker, order in zip((*workers, *workers), orders)]
    for thread in threads:
        thread.start()
    join_all(threads, timeout=180)
    with tf.Graph().as_default():
        _, _, _, table, optimizer = graph()
        storage = [v for v in v1.global_variables() if v.op.name == "user/shard0/embedding"][0]
        with tf_session(workers[0].target) as sess:
            (keys, rows), = sess.run(table.contents())
            lengths = [len(value) for value in sess.run([storage, optimizer.get_slot(storage, "accumulator")])]
            held = sess.run(table._shards[0].held)
    assert sorted(keys) == sorted(all_ids) and len(set(rows)) == len(rows)
    assert lengths[0] == lengths[1] == held > max(rows) and held > table_storage.GROWTH_ROWS * 2


@pytest.mark.inprocess
@pytest.mark.parametrize("name", sorted([*optimizers.OPTIMIZERS, "ftrl"]))
def test_rows_a_table_adds_start_their_slots_where_the_optimizer_starts_them(name):
    with tf.Graph().as_default():
        ids, rows, table = table_graph(tf.int64, capacity=100_000, shards=1, grow=True)
        make = optimizers.OPTIMIZERS.get(name, lambda lr, cfg, graph_tables: optimizers.GrowableFtrlOptimizer(
            lr, graph_tables=graph_tables))  # wide_deep's
        optimizer = make(0.1, TrainConfig(momentum=0.9), table.graph_tables)
        train = optimizer.minimize(tf.reduce_sum(rows))
        storage = [v for v in v1.global_variables() if v.op.name == "user/shard0/embedding"][0]
        slots = optimizers.slots_and_starts(optimizer, storage)
        upkeep = table_upkeep.upkeep(table.graph_tables, lambda v: optimizers.slots_and_starts(optimizer, v))
        with tf_session() as sess:
            sess.run(v1.global_variables_initializer())
            for slot, start in slots:  # as the optimizer made them
                np.testing.assert_allclose(sess.run(slot), start)
            train_and_keep_up(sess, train, upkeep, {ids: np.arange(5000)})
            for slot, start in slots:  # the rows added by the growth, as the optimizer would have made them
                value = sess.run(slot)
                assert len(value) > table_storage.GROWTH_ROWS
                np.testing.assert_allclose(value[table_storage.GROWTH_ROWS:], start)


@pytest.mark.servers
def test_shards_live_on_their_own_ps_and_every_worker_reads_the_same_rows():
    workers, _, configs = in_process_cluster(num_workers=2, num_ps=2)
    devices = configs[0].ps_devices()
    served = []
    for worker, batch in zip(workers, (["a", "b", "c", "d"], ["d", "c", "e", "a"])):
        with tf.Graph().as_default():  # each worker builds its own graph, as between-graph replication does
            ids, rows, _ = table_graph(devices=devices)
            placed = {op.name: op.device for op in v1.get_default_graph().get_operations()
                      if op.type in ("MutableDenseHashTableV2", "VarHandleOp")}
            with tf_session(worker.target) as sess:
                if not served:
                    sess.run(v1.global_variables_initializer())
                served.append(dict(zip(batch, sess.run(rows, {ids: batch}))))
    for shard in (0, 1):
        for name in (f"user/shard{shard}/rows_of_ids", f"user/shard{shard}/embedding", f"user/shard{shard}/next_row"):
            assert placed[name] == f"/job:ps/task:{shard}", (name, placed)
    for key in ("a", "c", "d"):
        np.testing.assert_array_equal(served[0][key], served[1][key])
    assert not np.array_equal(served[1]["e"], served[0]["a"])


@pytest.mark.servers
@pytest.mark.parametrize("shards", [2, 1], ids=["cut by ID", "whole tables spread"])
def test_the_tables_of_several_columns_cross_to_each_ps_in_one_tensor_and_read_their_own_rows(shards):
    """Cut by ID, the shards of each column start on the next ps; whole (one shard each), the tables
    of consecutive columns live on consecutive ps tasks. Either way a row crosses once, from its ps."""
    workers, _, (hosts,) = in_process_cluster(num_workers=1, num_ps=2)
    options = table_ids.TableOptions(capacity=40, shards=shards, devices=hosts.ps_devices())
    batch = np.array([["a", "x", "a"], ["b", "x", "q"], ["a", "y", "r"], ["c", "z", "a"]], object)
    with tf.Graph().as_default():
        ids = v1.placeholder(tf.string, [None, 3])
        tables, graph_tables = [], GraphTables()
        for column, name in enumerate(("user", "item", "query")):
            with v1.variable_scope(name):
                tables.append(dynamic_table.DynamicTable(graph_tables, name, ids, options, True, column))
        rows = dynamic_table.rows_of_columns(tables, "embedding", WIDTH, v1.random_normal_initializer(seed=1))
        contents = [table.contents() for table in tables]
        values = {v.op.name: v for v in v1.global_variables() if v.op.name.endswith("/embedding")}
        placed = {v.op.name: v.device for v in values.values()}
        with v1.Session(workers[0].target, config=spec.session_config(hosts)) as sess:
            sess.run(v1.global_variables_initializer())
            metadata = v1.RunMetadata()
            # What came from the ps tasks, before the worker spread it over the batch: a row per distinct ID.
            crossed = rows.op.inputs[0]
            parts = list(crossed.op.inputs[0].op.inputs[2:])  # what each ps sent: the shards' parts stitched
            got, distinct_rows, part_rows = sess.run((rows, crossed, parts), {ids: batch}, options=v1.RunOptions(
                output_partition_graphs=True), run_metadata=metadata)
            maps, stored = sess.run(contents), sess.run(values)
    for column, name in enumerate(("user", "item", "query")):
        row_of = {}  # ID -> (shard, row), from the maps on the ps
        for shard, (keys, shard_rows) in enumerate(maps[column]):
            row_of.update({key.decode(): (shard, int(row)) for key, row in zip(keys, shard_rows)})
        assert sorted(row_of) == sorted(set(batch[:, column]))  # every ID admitted, in one shard only
        for example in range(len(batch)):
            shard, row = row_of[batch[example, column]]
            np.testing.assert_array_equal(got[example, column], stored[f"{name}/shard{shard}/embedding"][row])
    # Each ID once per column, however often the batch names it: 9 rows for the batch's 12 IDs.
    assert distinct_rows.shape == (sum(len(set(batch[:, column])) for column in range(3)), WIDTH)
    # and each from its own ps only: what a ps sent holds the rows of the IDs its shards hold, no other.
    on_ps = [0, 0]
    for column, name in enumerate(("user", "item", "query")):
        for shard in range(shards):
            ps = (column + shard) % 2
            assert placed[f"{name}/shard{shard}/embedding"] == hosts.ps_devices()[ps]
            on_ps[ps] += len(maps[column][shard][0])
    assert [part.op.device for part in parts] == list(hosts.ps_devices())
    assert [len(part) for part in part_rows] == on_ps and min(on_ps) > 0
    # To each ps one tensor of the batch's distinct IDs for every column, and from each one tensor of
    # rows for every column (table by table: 3 each way).
    assert measure.cross_task_recvs(metadata) == 4


@pytest.mark.pure
def test_only_the_chief_builds_the_reconciliation_and_the_eviction_of_its_tables(tmp_path):
    """Only the chief restores and saves: a non-chief worker's graph, built at each of its starts, leaves
    both out (a third of a dynamic model's graph) and grows its tables as the chief does."""
    flags = read_flags(f"--model_dir={tmp_path}", "--model=wide_deep", "--dataset=clicks", "--embedding=dynamic",
                       "--embedding_growth", "--embedding_steps_to_live=100", "--embedding_partitions=1",
                       "--hidden_units=8", "--embedding_dim=2")
    built = {}
    for task in (0, 1):
        cluster = spec.ClusterConfig(("ps0:1",), ("worker0:1", "worker1:1"), "worker", task)
        with tf.Graph().as_default() as graph:
            train = train_graph.build_graph(dataclasses.replace(flags, cluster=cluster))
            built[task] = train, len(graph.get_operations())
    (chief, chief_ops), (other, other_ops) = built[0], built[1]
    tables = 3  # user, item, category: a shard each
    assert len(chief.tables.reconciles) == len(chief.tables.grows) == len(other.tables.grows) == tables
    assert other.tables.reconciles == ()
    assert chief.saver._before_save is not None and other.saver._before_save is None
    print(f"\ngraph ops: chief {chief_ops}, another worker {other_ops}")
    assert other_ops < 0.9 * chief_ops


@pytest.mark.e2e
@pytest.mark.drill
def test_criteo_shaped_logs_train_each_epoch_once_in_dynamic_rounds_through_a_ps_restart(make_cluster, tmp_path):
    """Criteo's columns and a user's history (a multi-valued column) in TSV files handed out by the input
    queue, 4 dynamic tables (the history and 3 of the 26 ID columns, the ad's among them) trained in rounds
    (--local_steps=10) with --embedding_growth on 2 ps, deltas on.
    ps 0, which holds the queue and the global step, is killed and restarted mid-run: the chief restores
    its tables and the queue from a full checkpoint and its deltas, they reconcile, and every epoch ends
    with each of its examples trained; every task exits 0."""
    rows, epochs, batch = 4000, 3, 64
    write_criteo_shaped_tsvs(tmp_path / "tsv", rows=rows)
    # 3 of the ID columns (every file keeps all 26), the ad's first: the round's graph builds the model four
    # times, and its start-up grows with the tables (about 3 s a table on this machine).
    categorical = ["C1", "C3", "C5"]
    cluster = make_cluster(num_ps=2, num_workers=2, trainer_args=[
        "--model=wide_deep", "--dataset=csv", f"--data_dir={tmp_path / 'tsv'}", "--label_column=label",
        "--numeric_columns=" + ",".join(f"I{i}" for i in range(1, 14)),
        "--categorical_columns=" + ",".join(categorical), "--multi_valued_columns=history",
        "--embedding=dynamic", "--embedding_growth", "--embedding_capacity=2000", "--incremental_save_secs=1",
        "--local_steps=10", "--hidden_units=32", f"--batch_size={batch}", f"--num_epochs={epochs}",
        "--input_queue_audit", "--train_steps=100000", "--save_checkpoint_steps=60", "--keep_checkpoint_max=20",
        "--log_every_n_steps=20"])
    cluster.start_all()
    # The chief writes the checkpoints and their deltas at its own steps, which its saves slow down: on
    # a loaded machine worker 1 once ran the job to its end while the chief made 3 steps. Worker 1 holds
    # still from global step 60 (of about 190) until the chief has saved a checkpoint past step 0 and a
    # delta of it.
    paused = []

    def saved_a_delta_past_step_0() -> bool:
        if not paused and max(logged_step(cluster.log("worker", index)) for index in (0, 1)) >= 60:
            cluster.kill("worker", 1, signal.SIGSTOP)
            paused.append(True)
        checkpoint = tf.train.latest_checkpoint(str(cluster.model_dir))
        return bool(checkpoint and not checkpoint.endswith("-0") and incremental.deltas_of(checkpoint))

    try:
        wait_for(saved_a_delta_past_step_0, 240, "a delta of a checkpoint past step 0", cluster)
        at_kill = tf.train.latest_checkpoint(str(cluster.model_dir))
        # What the chief logged before the kill: a session it made again then (a call broken on a loaded machine)
        # is not the restore asserted below.
        logged_before_kill = len(cluster.log("worker", 0))
        cluster.kill("ps", 0)
        cluster.start("ps", 0)
    finally:
        if paused:
            cluster.kill("worker", 1, signal.SIGCONT)
    codes = cluster.wait(timeout=300)
    assert set(codes.values()) == {0}, describe(cluster)

    chief, other = cluster.log("worker", 0), cluster.log("worker", 1)
    since_kill = chief[logged_before_kill:]
    assert log_lines.sessions_again(since_kill), chief[-3000:]  # the kill broke its steps; the chief restored ps 0:
    again = since_kill.split("training session made again")[0]  # the restore is logged as the session is made
    assert re.search(r"Restoring parameters from .*model\.ckpt-\d+", again.split("An error was raised", 1)[-1])
    assert re.search(rf"restored {os.path.basename(at_kill)} and its [1-9]\d* delta checkpoint", chief), chief[-3000:]
    # Each table whole on one ps (4 tables spread over 2): what each ps holds is the sum of its tables.
    line = re.findall(r"live rows: .*", chief)[-1]
    tables = [int(count) for count in re.findall(r"wide_deep/\w+ (\d+)", line)]
    per_ps = [int(n) for n in re.search(r"; per ps: ps 0 (\d+), ps 1 (\d+)$", line).groups()]
    assert len(tables) == len(categorical) + 1 and sum(per_ps) == sum(tables) and min(per_ps) > 0, line
    # Every ID with a row at the kill still has that row at the end (the tables on ps 0 were restored).
    final = tf.train.latest_checkpoint(str(cluster.model_dir))
    for column in categorical + ["history"]:
        before, after = saved_maps(at_kill, column), saved_maps(final, column)
        assert before and any(before.values()), column
        for shard, rows_of_ids in before.items():
            changed = {key: (row, after[shard].get(key)) for key, row in rows_of_ids.items()
                       if after[shard].get(key) != row}
            assert not changed, (column, shard, len(changed), list(changed.items())[:5])

    # Each epoch: every file finished once, every example of it trained, none three times (an example is
    # trained twice only where its worker's step broke at the kill, or its shuffle buffer ran ahead of
    # its file's reported prefix when the file was handed out again).
    done = sorted({(epoch, examples) for log in (chief, other) for epoch, _, examples in log_lines.epochs_done(log)})
    assert done == [(epoch, rows) for epoch in range(epochs)], describe(cluster)
    audit = chaos.count_audit(cluster.model_dir)
    assert sorted(audit) == list(range(epochs)), audit
    for epoch, (distinct, twice, trained) in audit.items():
        assert distinct == rows and trained - distinct == twice, (epoch, audit)
    final_step = int(finished(chief)["global_step"])
    assert int(tf.train.load_checkpoint(final).get_tensor("global_step")) == final_step
    # A batch is a step: what the restore took back (a round pushed after the delta restored) is trained
    # again, and counted again.
    assert epochs * rows / batch <= final_step <= epochs * rows / batch * 1.5, final_step
    # It learned: held-out, not one batch (chance is 0.5; the ad alone gives about 0.85).
    assert float(finished(chief)["heldout_auc"]) > 0.8, finished(chief)

    # The export, loaded in a fresh process, serves raw rows as the final checkpoint does: known IDs their
    # rows, unknown ones the default row; a history empty, short or long.
    one_process = [arg for arg in cluster.trainer_args if not arg.startswith(("--num_epochs", "--input_queue_audit"))]
    cfg, _ = run_record.follow(read_flags(*one_process), run_record.read(str(cluster.model_dir)))
    features, _ = next(iter(inputs.batches(cfg.data, inputs.Shard(0, 1), 8, split="eval", repeat=False)))
    features = {name: value.numpy() for name, value in features.items()}
    features["C1"][:2] = [b"an ad training never met", b""]
    features["history"][2:5] = [b"", b"i4", b"|".join(b"i%d" % item for item in range(50))]
    expected = export.predict(cfg, final, features)
    served = serve_in_fresh_process(cluster.model_dir / "export" / str(final_step), features)
    np.testing.assert_allclose(served["probabilities"], expected["probabilities"], rtol=1e-5, atol=1e-6)


def adam_rows(value, grad, m, v, step, lr=0.1, beta1=0.9, beta2=0.999, epsilon=1e-8):
    """Adam's update of some rows, in numpy: (value, m, v) after a step with these rows' gradients."""
    m = beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1 - beta2) * grad ** 2
    rate = lr * np.sqrt(1 - beta2 ** step) / (1 - beta1 ** step)
    return value - rate * m / (np.sqrt(v) + epsilon), m, v


@pytest.mark.inprocess
def test_lazy_adam_updates_exactly_the_rows_a_batch_touched_and_adam_every_row():
    from ps_trainer.training import optimizers
    start = np.arange(12, dtype=np.float32).reshape(6, 2) / 10
    weights = np.array([[1.0, -2.0], [0.5, 3.0], [2.0, 1.0]], np.float32)
    batches = ([1, 3, 1], [4, 3, 0])  # row 1 twice in the first batch: its gradients add up
    results = {}
    for name in ("lazy_adam", "adam"):
        with tf.Graph().as_default():
            table = v1.get_variable("table", initializer=start)
            ids = v1.placeholder(tf.int64, [3])
            loss = tf.reduce_sum(tf.gather(table, ids) * weights)
            optimizer = optimizers.OPTIMIZERS[name](0.1, None)
            train = optimizer.minimize(loss)
            with tf_session() as sess:
                sess.run(v1.global_variables_initializer())
                results[name] = []
                for batch in batches:
                    sess.run(train, {ids: batch})
                    results[name].append(sess.run(table))
    value, m, v = start.copy(), np.zeros_like(start), np.zeros_like(start)
    for step, batch in enumerate(batches, start=1):
        grad = np.zeros_like(start)
        np.add.at(grad, batch, weights)
        touched = sorted(set(batch))
        value[touched], m[touched], v[touched] = adam_rows(value[touched], grad[touched], m[touched], v[touched], step)
        np.testing.assert_allclose(results["lazy_adam"][step - 1], value, rtol=1e-5, atol=1e-6)
    untouched = [2, 5]
    np.testing.assert_array_equal(results["lazy_adam"][-1][untouched], start[untouched])
    # Adam moves row 1 at the second step too (its moments decay at every step); the lazy one does not.
    assert not np.allclose(results["adam"][1][1], results["adam"][0][1])
    np.testing.assert_array_equal(results["lazy_adam"][1][1], results["lazy_adam"][0][1])
    np.testing.assert_allclose(results["adam"][0], results["lazy_adam"][0], rtol=1e-5, atol=1e-6)  # same first step


# In a process of its own: malloc's settings are the whole process's. It frees 64 blocks of 2 MiB that
# sit between live small ones (as a grown shard's old copies sit among a ps's other tensors).
MALLOC_PROBE = """
import os, pathlib, sys
import numpy as np
from ps_trainer.cluster import allocator
environ = {"MALLOC_ARENA_MAX": "8"}  # the user's own setting: left alone
if sys.argv[1] == "user-set-both":
    environ["MALLOC_MMAP_THRESHOLD_"] = "131072"
made = allocator.give_back_freed_memory(environ)

def rss():
    return int(pathlib.Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")

warm = np.ones((4 << 20) // 8)  # mmapped, then freed: glibc's own threshold rises past 4 MiB
del warm
start = rss()
big, small = [], []
for _ in range(64):
    big.append(np.ones((2 << 20) // 8))
    small.append(np.ones(4096 // 8))
held = rss()
del big
print(" ".join(made) or "-", (held - start) >> 20, (rss() - start) >> 20)
"""


@pytest.mark.e2e
def test_a_ps_gives_back_the_memory_of_large_tensors_it_frees_unless_the_user_set_malloc():
    def probe(case):
        result = subprocess.run([sys.executable, "-c", MALLOC_PROBE, case], capture_output=True, text=True,
                                timeout=60, cwd=ROOT)
        assert result.returncode == 0, result.stderr[-2000:]
        made, held_mib, kept_mib = result.stdout.split()
        return made, int(held_mib), int(kept_mib)

    made, held, kept = probe("ps")
    assert made == "MALLOC_MMAP_THRESHOLD_=1048576" and held >= 128 and kept < 16  # given back
    made, held, kept = probe("user-set-both")
    assert made == "-" and held >= 128 and kept >= 120  # glibc's defaults: the freed blocks stay resident
