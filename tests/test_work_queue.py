"""--input_queue's work queue (input/work_queue.py) on a real ps, in one process: every file handed out
once, a dead worker's files handed out again, the queue's state saved and restored with the model, an
epoch ended exactly by its last file; an empty file and a file cut short through a worker's pipeline."""

import dataclasses
import pathlib
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from ps_trainer import input as inputs
from ps_trainer.cluster import model_dir as layout
from ps_trainer.input import work_queue
from ps_trainer.input.work_queue import DONE, TODO
from tests.support import read_flags, tf_session, write_click_csvs, write_embedded_as_tfrecord
from ps_trainer.training import checkpoints, queue_hook, worker
from ps_trainer.training import graph as train_graph

v1 = tf.compat.v1
NUM_FILES = 5


class Worker:
    """One worker's graph of the queue and a session to the cluster."""

    def __init__(self, server, index, num_epochs=0, lease_secs=60.0, num_workers=2):
        self.graph = tf.Graph()
        with self.graph.as_default():
            with v1.device("/job:ps/task:0"):
                self.global_step = v1.train.get_or_create_global_step()
            self.queue = work_queue.WorkQueue(NUM_FILES, index, num_workers, num_epochs, lease_secs,
                                              "/job:ps/task:0", self.global_step)
            self.init = v1.global_variables_initializer()
            self.saver = v1.train.Saver()
        self.session = tf_session(server.target, graph=self.graph)

    def take(self):
        key, over, *_ = self.session.run(self.queue.take)
        return int(key), bool(over)

    def take_with_prefix(self):
        key, _, _, start, _ = self.session.run(self.queue.take)
        return int(key), int(start)

    def report(self, keys, counts, step=0):
        return bool(self.session.run(self.queue.report, {self.queue.report_keys: keys,
                                                         self.queue.report_counts: counts,
                                                         self.queue.report_step: step}))

    def set_global_step(self, step):
        with self.graph.as_default():
            self.session.run(self.global_step.assign(step))

    def finish(self, key, examples=10):
        mine, completed, counts, _ = self.session.run(self.queue.finish, {self.queue.key: key,
                                                                          self.queue.examples: examples})
        return bool(mine), [(int(e), int(n)) for e, n in zip(completed, counts) if e >= 0]

    def state(self):
        return self.session.run(self.queue.state)


@pytest.fixture(name="cluster")
def cluster_fixture():
    workers, _ = tf.test.create_local_cluster(num_workers=2, num_ps=1)
    return workers


def _one_feed(cluster, cfg, num_files, files_per_pass=work_queue.FILES_PER_PASS):
    """(graph, queue, feed, batches of 8, their keys and ordinals, the variables' initializer) of worker 0's queue
    of one epoch over `num_files` files of cfg on ps 0, the feed's sessions connected."""
    graph = tf.Graph()
    with graph.as_default():
        with v1.device("/job:ps/task:0"):
            global_step = v1.train.get_or_create_global_step()
        queue = work_queue.WorkQueue(num_files, 0, 1, 1, 60.0, "/job:ps/task:0", global_step)
        feed = work_queue.ItemFeed(queue, "worker:0", files_per_pass=files_per_pass)
        batches = v1.data.make_initializable_iterator(inputs.queued_batches(cfg, inputs.Shard(0, 1, feed), 8))
        _, _, keys, ordinals = batches.get_next()
        init = v1.global_variables_initializer()
    feed.connect(lambda: tf_session(cluster[0].target, graph=graph))
    return graph, queue, feed, batches, (keys, ordinals), init


@pytest.mark.servers
def test_every_file_of_the_open_epochs_is_handed_out_once(cluster):
    first, second = Worker(cluster[0], 0), Worker(cluster[1], 1)
    first.session.run(first.init)
    taken = {0: [], 1: []}
    while True:  # the two workers take in turn until nothing is left to take
        keys = [worker.take()[0] for worker in (first, second)]
        for index, key in enumerate(keys):
            if key >= 0:
                taken[index].append(key)
        if max(keys) < 0:
            break
    everything = sorted(taken[0] + taken[1])
    assert everything == list(range(2 * NUM_FILES))  # epochs 0 and 1, each file once
    assert len(taken[0]) == len(taken[1]) == NUM_FILES
    _, _, owners = work_queue.unpack(first.state(), NUM_FILES)
    assert sorted(owners.ravel().tolist()) == [0] * NUM_FILES + [1] * NUM_FILES


@pytest.mark.servers
def test_a_worker_that_restarts_or_goes_silent_loses_its_files_to_the_others(cluster):
    first, second = Worker(cluster[0], 0, lease_secs=60.0), Worker(cluster[1], 1, lease_secs=60.0)
    first.session.run(first.init)
    held = [second.take()[0] for _ in range(2)]
    assert held == [0, 1]
    assert second.session.run(second.queue.release) == 2  # its restart gives them back
    assert [first.take()[0] for _ in range(2)] == [0, 1]
    assert not second.finish(0)[0]  # a file given back is no longer the restarted worker's to finish

    # A worker silent past its lease: the next take reclaims its files, and they are handed out again.
    later = second.take()[0]
    key, _, reclaimed, *_ = first.session.run(first.queue.take)
    assert reclaimed == 0 and key != later  # within the lease: the second worker's file stays its own
    first.finish(key)
    lease_over = {first.queue.now: time.time() + 61}  # the clock 61 s on, with no call from the second worker
    first.session.run(first.queue.heartbeat, lease_over)
    key, _, reclaimed, *_ = first.session.run(first.queue.take, lease_over)
    assert reclaimed == 1 and key == later
    assert not second.finish(later)[0]
    assert first.finish(later)[0]


@pytest.mark.servers
def test_a_file_handed_out_again_comes_with_the_prefix_its_last_reader_trained(cluster):
    first, second = Worker(cluster[0], 0), Worker(cluster[1], 1)
    first.session.run(first.init)
    assert [first.take_with_prefix() for _ in range(2)] == [(0, 0), (1, 0)]
    first.report([0, 1], [7, 3])
    first.report([0], [5])  # a late report of a shorter prefix lowers nothing
    assert first.session.run(first.queue.release) == 2
    assert [second.take_with_prefix() for _ in range(3)] == [(0, 7), (1, 3), (2, 0)]


@pytest.mark.servers
def test_a_report_of_training_that_a_restore_rolled_back_is_dropped(cluster):
    first, second = Worker(cluster[0], 0), Worker(cluster[1], 1)
    first.session.run(first.init)
    first.take()
    first.set_global_step(50)
    assert first.report([0], [30], step=50)
    first.set_global_step(20)  # a restore of the checkpoint of step 20 (which held no prefix yet)
    first.session.run(first.queue.prefixes.initializer)
    # The first worker has not met the restore: its next step's report is of training the model lost.
    assert not first.report([0], [45], step=50)
    assert second.report([0], [12], step=20)  # trained since the restore
    first.session.run(first.queue.release)
    assert second.take_with_prefix() == (0, 12)


@pytest.mark.servers
def test_a_prefix_of_an_ended_epoch_is_not_handed_out_with_the_next_epochs_file(cluster):
    # Epoch 2's file 0 (key 10) takes the slot of epoch 0's file 0 (key 0) once epoch 0 is done.
    worker = Worker(cluster[0], 0, num_epochs=3, num_workers=1)
    worker.session.run(worker.init)
    assert [worker.take()[0] for _ in range(2 * NUM_FILES)] == list(range(2 * NUM_FILES))
    worker.report([0], [7])
    for key in range(NUM_FILES):
        worker.finish(key)
    assert worker.take_with_prefix() == (2 * NUM_FILES, 0)
    worker.report([2 * NUM_FILES], [2])
    worker.report([0], [9])  # a late report for the file of the ended epoch
    worker.session.run(worker.queue.release)
    assert worker.take_with_prefix() == (NUM_FILES, 0)
    assert [worker.take_with_prefix() for _ in range(NUM_FILES)][-1] == (2 * NUM_FILES, 2)


@pytest.mark.servers
def test_an_epoch_ends_with_its_last_file_and_the_run_with_its_last_epoch(cluster):
    worker = Worker(cluster[0], 0, num_epochs=2, num_workers=1)
    worker.session.run(worker.init)
    keys = [worker.take()[0] for _ in range(2 * NUM_FILES)]
    assert keys == list(range(2 * NUM_FILES)) and worker.take() == (-1, False)  # no third epoch opens
    for key in range(NUM_FILES - 1):
        assert worker.finish(key, examples=key + 1) == (True, [])
    # Epoch 1's files finished first: epoch 1 completes only with epoch 0, in one finish.
    for key in range(NUM_FILES, 2 * NUM_FILES):
        assert worker.finish(key, examples=100) == (True, [])
    assert worker.finish(NUM_FILES - 1, examples=NUM_FILES) == (True, [(0, 15), (1, 500)])
    assert worker.take() == (-1, True)
    epoch, _, owners = work_queue.unpack(worker.state(), NUM_FILES)
    assert epoch == 2 and (owners == TODO).all()


@pytest.mark.servers
def test_the_queue_state_is_saved_and_restored_with_the_model(cluster, tmp_path):
    worker = Worker(cluster[0], 0, num_workers=1)
    worker.session.run(worker.init)
    for _ in range(3):
        worker.take()
    worker.finish(0, examples=7)
    worker.report([1], [4])
    saved = worker.state()
    with worker.graph.as_default():
        path = worker.saver.save(worker.session, str(tmp_path / "model.ckpt"))
        worker.session.run(worker.init)  # a ps restarted: everything back to its start
        assert (worker.state() == work_queue.initial_state(NUM_FILES)).all()
        worker.saver.restore(worker.session, path)
    np.testing.assert_array_equal(worker.state(), saved)
    _, examples, owners = work_queue.unpack(worker.state(), NUM_FILES)
    assert owners[0].tolist() == [DONE, 0, 0, TODO, TODO] and examples.tolist() == [7, 0]
    assert work_queue.resume_refusal(path, NUM_FILES, "/data") is None
    assert "/data holds 6 training file(s), the input queue in" in work_queue.resume_refusal(path, NUM_FILES + 1,
                                                                                            "/data")
    # The restarted worker gives back the files it held at the save; the epoch resumes where it was.
    assert worker.session.run(worker.queue.release) == 2
    assert [worker.take_with_prefix() for _ in range(4)] == [(1, 4), (2, 0), (3, 0), (4, 0)]


def _local_queue():
    """A graph with the work queue of one worker, in a session of this process: (graph, queue, session)."""
    graph = tf.Graph()
    with graph.as_default():
        queue = work_queue.WorkQueue(NUM_FILES, 0, 1, 0, 60.0, "/cpu:0", v1.train.get_or_create_global_step())
    return graph, queue, tf_session(graph=graph)


@pytest.mark.inprocess
def test_every_example_reported_trained_past_its_prefix_is_handed_to_the_files_next_reader():
    # 400 reports of 1-60 examples each, as the steps of a shuffled pass make them: the file's take
    # hands out every one of them (none placed over an earlier report's), for its reader to skip.
    graph = tf.Graph()
    with graph.as_default():
        queue = work_queue.WorkQueue(NUM_FILES, 0, 1, 0, 60.0, "/cpu:0", v1.train.get_or_create_global_step(),
                                     ahead_shape=(1, 1 << 16))
    with graph.as_default(), tf_session(graph=graph) as session:
        session.run(v1.global_variables_initializer())
        sizes = np.random.default_rng(0).integers(1, 60, size=400)
        ordinals = np.arange(1, sizes.sum() + 1)  # file 0 of epoch 0 (key 0): ordinal 0 untrained, prefix 0
        for report in np.split(ordinals, np.cumsum(sizes)[:-1]):
            assert session.run(queue.report, {queue.report_ahead: report, queue.report_step: 0})
        key, _, _, prefix, ahead = session.run(queue.take)
    assert (key, prefix) == (0, 0)
    np.testing.assert_array_equal(ahead, ordinals)


@pytest.mark.inprocess
def test_a_checkpoint_of_the_queue_without_trained_prefixes_restores_them_from_zero(tmp_path):
    # The last release's queue saved no prefixes: its checkpoints restore, and the prefixes start at 0.
    graph, queue, session = _local_queue()
    with graph.as_default(), session:
        session.run(v1.global_variables_initializer())
        key = session.run(queue.take)[0]
        session.run(queue.finish, {queue.key: key, queue.examples: 7})
        session.run(queue.report, {queue.report_keys: [1], queue.report_counts: [4], queue.report_step: 0})
        saved = session.run(queue.state)
        without = [v for v in v1.global_variables() if v.op.name != work_queue.PREFIXES]
        path = v1.train.Saver(without, sharded=True).save(session, str(tmp_path / "model.ckpt"), global_step=3,
                                                           write_state=False)
        assert checkpoints.older_layout(str(tmp_path), [queue.prefixes], sharded=True) is None  # not registered
        v1.train.update_checkpoint_state(str(tmp_path), path)

    graph, queue, session = _local_queue()  # a new run over the model_dir
    with graph.as_default(), session:
        older = checkpoints.older_layout(str(tmp_path), [queue.prefixes], sharded=True)
        assert older.added == {work_queue.PREFIXES}
        saver = checkpoints.LiveStateSaver(checkpoints.report_uninitialized(), sharded=True, older=older)
        saver.restore(session, path)
        np.testing.assert_array_equal(session.run(queue.state), saved)
        assert (session.run(queue.prefixes) == 0).all()
        # Once saved with them, the model_dir needs the older layout no more.
        v1.train.update_checkpoint_state(str(tmp_path), saver.save(session, str(tmp_path / "model.ckpt"),
                                                                   global_step=4, write_state=False))
        assert checkpoints.older_layout(str(tmp_path), [queue.prefixes], sharded=True) is None


@pytest.mark.inprocess
def test_the_heartbeats_are_no_checkpoints_and_a_checkpoint_that_held_them_for_fewer_workers_restores(tmp_path):
    # The last release saved the heartbeats, one per worker the job started with; now they have a slot
    # for every worker that may join, are saved by no checkpoint, and start at 0 after a restore.
    graph = tf.Graph()
    with graph.as_default(), tf_session(graph=graph) as session:
        queue = work_queue.WorkQueue(NUM_FILES, 1, 2, 0, 60.0, "/cpu:0", v1.train.get_or_create_global_step())
        tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, -1, name="ids")
        session.run(v1.global_variables_initializer())
        session.run(queue.take)
        saved = session.run(queue.state)
        path = v1.train.Saver(sharded=True).save(session, str(tmp_path / "model.ckpt"), global_step=3)
    assert tf.train.load_checkpoint(path).get_variable_to_shape_map()["input_queue/last_seen"] == [2]

    graph = tf.Graph()
    with graph.as_default(), tf_session(graph=graph) as session:
        queue = work_queue.WorkQueue(NUM_FILES, 5, 8, 0, 60.0, "/cpu:0", v1.train.get_or_create_global_step(),
                                     not_saved=checkpoints.NOT_SAVED)
        table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, -1, name="ids")  # saved, as ever
        saver = checkpoints.LiveStateSaver(checkpoints.report_uninitialized(), sharded=True)
        saver.restore(session, path)
        np.testing.assert_array_equal(session.run(queue.state), saved)
        np.testing.assert_array_equal(session.run(queue.last_seen), np.zeros(8))
        session.run(queue.heartbeat)  # worker 5: past the two the checkpoint knew
        assert session.run(queue.last_seen)[5] > 0
        session.run(table.insert([7], [1]))
        path = saver.save(session, str(tmp_path / "model.ckpt"), global_step=4)
    saved = tf.train.load_checkpoint(path).get_variable_to_shape_map()
    assert "input_queue/last_seen" not in saved and {work_queue.STATE, "ids-keys", "ids-values"} <= set(saved)


@pytest.mark.inprocess
def test_a_checkpoint_saved_without_the_queue_is_named_not_resumed(tmp_path):
    graph = tf.Graph()
    with graph.as_default(), tf_session(graph=graph) as sess:
        v1.train.get_or_create_global_step()
        sess.run(v1.global_variables_initializer())
        path = v1.train.Saver().save(sess, str(tmp_path / "model.ckpt"))
    assert "was saved without the input queue" in work_queue.resume_refusal(path, NUM_FILES, "/data")


@pytest.mark.inprocess
def test_the_queue_chosen_by_default_gives_way_to_a_checkpoint_of_fixed_shards(tmp_path):
    write_click_csvs(tmp_path / "csv")
    cfg = read_flags("--ps_hosts=127.0.0.1:2222", "--worker_hosts=127.0.0.1:2223", "--job_name=worker",
                     "--task_index=0", f"--model_dir={tmp_path / 'model'}", "--model=wide_deep", "--dataset=csv",
                     f"--data_dir={tmp_path / 'csv'}", "--label_column=clicked", "--numeric_columns=price")
    assert cfg.data.input_queue and cfg.data.input_queue_by_default
    assert worker._settle_input(cfg) is cfg  # (nothing to resume)
    graph = tf.Graph()
    with graph.as_default(), tf_session(graph=graph) as sess:
        v1.train.get_or_create_global_step()
        sess.run(v1.global_variables_initializer())
        v1.train.Saver().save(sess, str(tmp_path / "model" / "model.ckpt"))
    assert not worker._settle_input(cfg).data.input_queue
    explicit = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, input_queue_by_default=False))
    assert worker._settle_input(explicit) is explicit  # (refused later)


@pytest.mark.servers
@pytest.mark.parametrize("skip", [False, True])
def test_an_empty_file_is_finished_and_a_file_cut_short_is_named_or_skipped_as_chosen(cluster, tmp_path, skip):
    # Three files through one worker's queued pipeline: 40 good examples, none, and one cut inside its 4th.
    written, = write_embedded_as_tfrecord(tmp_path, examples=40)
    data = pathlib.Path(written).read_bytes()
    pathlib.Path(written).unlink()
    record = len(data) // 40
    paths = [tmp_path / f"train-0000{index}-of-00003.tfrecord" for index in range(3)]
    for path, content in zip(paths, (data, b"", data[:3 * record + 20])):
        path.write_bytes(content)
    cfg = inputs.DataConfig(name="tfrecord", data_dir=str(tmp_path), skip_bad_records=skip, input_queue=True)
    graph, _, feed, batches, (keys, ordinals), init = _one_feed(cluster, cfg, 3)
    with tf_session(cluster[0].target, graph=graph) as session:
        session.run(init)
        feed.restart()
        session.run(batches.initializer)
        trained = []
        try:
            while True:
                step_keys, step_ordinals = session.run([keys, ordinals])
                feed.trained(step_keys)  # as the hook does once the step returned
                trained += zip(step_keys.tolist(), step_ordinals.tolist())
        except tf.errors.InvalidArgumentError as error:
            assert not skip
            assert inputs.bad_record_message(error.message) == (
                f"bad input record: {paths[2]} record 3: cannot be read past byte {3 * record} of "
                f"{3 * record + 20} (truncated or corrupt): this record and any after it are lost")
            return
        except tf.errors.OutOfRangeError:  # the epoch is done: the pipeline ended
            pass
        finally:
            feed.stop()  # as the hook's end() does before the session closes
    assert skip and feed.finished
    # Every example the two files hold, each once, by (file, ordinal); the empty file finished too.
    assert sorted(trained) == [(0, i) for i in range(40)] + [(2, i) for i in range(3)]
    assert feed.tally.files[0] == 3 and feed.tally.examples[0] == 43


@pytest.mark.servers
def test_an_empty_csv_file_is_finished_with_the_epoch(cluster, tmp_path):
    # A CSV file with no bytes gives no block at all (a TFRecord one gives its end marker): its finish
    # met a file never counted as read, and the worker stopped on a KeyError.
    (tmp_path / "train-0.csv").write_text("x,label\n" + "".join(f"{i}.5,{i % 2}\n" for i in range(10)))
    (tmp_path / "train-1.csv").write_text("")
    cfg = inputs.DataConfig(name="csv", data_dir=str(tmp_path), label_column="label", numeric_columns=("x",),
                            input_queue=True)
    feed, session, init, initializer, (keys, ordinals) = _queued_pipeline(cluster, tmp_path, 0, 2, cfg, 4)
    trained = []
    with session:
        session.run(init)
        feed.restart()
        session.run(initializer)
        try:
            for _ in range(100):  # bounded: 10 examples in batches of 4, then the epoch's end
                step_keys, step_ordinals = session.run([keys, ordinals])
                feed.trained(step_keys)
                trained += zip(step_keys.tolist(), step_ordinals.tolist())
        except tf.errors.OutOfRangeError:  # the epoch is done: the pipeline ended
            pass
        finally:
            feed.stop()
    assert sorted(trained) == [(0, i) for i in range(10)]
    assert feed.finished and feed.tally.files[0] == 2 and feed.tally.examples[0] == 10


@pytest.mark.servers
def test_a_pass_takes_no_more_than_its_share_of_few_files_so_a_peer_that_starts_later_gets_some(cluster):
    # Found with 4 gzipped TSV files and 2 workers: the worker that started first took all 4 in its first
    # pass (up to FILES_PER_PASS), and the chief, a few seconds later, trained nothing all epoch.
    assert [work_queue.files_per_pass(n, 2) for n in (1, 3, 4, 7, 8, 100)] == [1, 2, 2, 4, 4, 4]
    assert work_queue.files_per_pass(4, 8) == 1 and work_queue.files_per_pass(100, 1) == 4
    first, second = Worker(cluster[0], 0, num_epochs=1), Worker(cluster[1], 1, num_epochs=1)  # 5 files to take
    first.session.run(first.init)
    feeds = []
    for index, worker_of in enumerate((first, second)):
        feed = work_queue.ItemFeed(worker_of.queue, f"worker:{index}",
                                   files_per_pass=work_queue.files_per_pass(NUM_FILES, 2))
        feed.connect(lambda graph=worker_of.graph, index=index: tf_session(cluster[index].target, graph=graph))
        feeds.append(feed)
    try:
        for feed in feeds:
            feed.restart()  # as the hook does once the session is made: it opens the feed's session
        passes = [[key for key, *_ in feeds[0].items()], [key for key, *_ in feeds[1].items()]]
        assert [len(keys) for keys in passes] == [3, 2] and sorted(passes[0] + passes[1]) == list(range(NUM_FILES))
        assert list(feeds[0].items()) == []  # the next pass: nothing left to take now
    finally:
        for feed in feeds:
            feed.stop()


def _queued_pipeline(cluster, data_dir, index, num_files, cfg=None, batch_size=8):
    """Worker `index` of 2's queued input of the files in data_dir (tfrecord unless `cfg` says; one
    epoch): (feed, session, init, iterator initializer, (keys, ordinals))."""
    cfg = cfg or inputs.DataConfig(name="tfrecord", data_dir=str(data_dir), input_queue=True)
    graph = tf.Graph()
    with graph.as_default():
        with v1.device("/job:ps/task:0"):
            global_step = v1.train.get_or_create_global_step()
        queue = work_queue.WorkQueue(num_files, index, 2, 1, 60.0, "/job:ps/task:0", global_step)
        feed = work_queue.ItemFeed(queue, f"worker:{index}")
        batches = v1.data.make_initializable_iterator(inputs.queued_batches(cfg, inputs.Shard(0, 1, feed),
                                                                            batch_size))
        _, _, keys, ordinals = batches.get_next()
        init = v1.global_variables_initializer()
    feed.connect(lambda: tf_session(cluster[index].target, graph=graph))
    return feed, tf_session(cluster[index].target, graph=graph), init, batches.initializer, (keys, ordinals)


@pytest.mark.servers
@pytest.mark.parametrize("ending", ["stop", "restart"])  # its session ended, or made again after an error
def test_a_reader_killed_mid_file_leaves_what_it_trained_and_the_next_reads_only_the_rest(cluster, tmp_path, ending):
    write_embedded_as_tfrecord(tmp_path, examples=40)
    first, first_session, init, first_iterator, first_tags = _queued_pipeline(cluster, tmp_path, 0, 1)
    second, second_session, _, second_iterator, second_tags = _queued_pipeline(cluster, tmp_path, 1, 1)
    first_session.run(init)
    first.restart()
    first_session.run(first_iterator)
    trained_first = []
    for _ in range(3):  # three steps, as the hook counts them once each returned
        keys, ordinals = first_session.run(first_tags)
        first.trained(keys, ordinals)
        trained_first += ordinals.tolist()
    # Its session ends, or is made again after an error (no end): what it trained is reported, its file given back.
    first.stop() if ending == "stop" else first.restart()
    first_session.close()
    # The shuffle buffer spreads the file over the steps: the prefix is the first ordinal not trained, and
    # some were trained past it.
    prefix = next(i for i in range(41) if i not in trained_first)
    assert prefix > 0  # this seed's order trains ordinal 0 in the first three batches
    assert max(trained_first) > prefix

    second.restart()
    second_session.run(second_iterator)
    trained_second = []
    try:
        while True:
            keys, ordinals = second_session.run(second_tags)
            second.trained(keys, ordinals)
            trained_second += ordinals.tolist()
    except tf.errors.OutOfRangeError:  # the one epoch is done
        pass
    finally:
        second.stop()
        second_session.close()
    # The rest of the file, each once: neither the prefix nor what was trained past it is read again.
    assert sorted(trained_second) == sorted(set(range(40)) - set(trained_first))
    assert sorted(trained_first + trained_second) == list(range(40))
    assert second.finished and second.tally.files[0] == 1 and second.tally.examples[0] == 40
    assert second.tally.skipped[0] == len(trained_first)
    *_, epochs, counts, _ = second.finished_files[-1]
    assert epochs == [0] and counts == [40]  # the epoch counts every example of the file


@pytest.mark.servers
def test_a_queue_lost_while_the_session_was_made_makes_monitored_session_try_again(cluster):
    # ps 0 restarted between the session's creation and the hook's first call (the chaos drill found
    # it): the queue's variables are not there; MonitoredSession makes the session again on AbortedError.
    worker = Worker(cluster[0], 0)
    with worker.graph.as_default(), worker.session:
        feed = work_queue.ItemFeed(worker.queue, "worker:0")
        feed.connect(lambda: tf_session(cluster[0].target, graph=worker.graph))
        hook = queue_hook.InputQueueHook(feed, tf.zeros([0], tf.int64), tf.zeros([0], tf.int64), tf.no_op(), 60.0)
        with pytest.raises(tf.errors.AbortedError, match="worker:0: input queue on ps 0 lost while the session was "
                                                          "made"):
            hook.after_create_session(worker.session, None)
        worker.session.run(worker.init)  # restored: the next session goes on
        hook.after_create_session(worker.session, None)
        assert feed.generation == 2
        feed.stop()


class _FaultyFeedSessions:
    """The feed's sessions, whose calls meet the faults before() and after() raise around each real call."""

    def __init__(self, target, graph, queue, sessions_made):
        self.target, self.graph, self.queue, self.sessions_made = target, graph, queue, sessions_made

    def __call__(self):
        session = tf_session(self.target, graph=self.graph)
        real_run = session.run

        def run(fetches, **kwargs):
            self.before(fetches)
            result = real_run(fetches, **kwargs)
            self.after(fetches)
            return result

        session.run = run
        return session

    def before(self, fetches):
        pass

    def after(self, fetches):
        pass


class _FinishAnsweredLate(_FaultyFeedSessions):
    """The first `finish` call is applied on ps 0 but answered too late: the "Operation timed out."
    (DeadlineExceeded) that a worker stopped mid-call by SIGSTOP meets as it resumes."""
    timed_out = False

    def after(self, fetches):
        if fetches is self.queue.finish and not self.timed_out:
            self.timed_out = True
            raise tf.errors.DeadlineExceededError(None, None, "Operation timed out.")


class _TakeLostUntilMadeAgain(_FaultyFeedSessions):
    """`take` fails as a restarted ps 0 answers it (its queue not restored yet) from the second take on, until
    the training session is made again: a queue that only the next session brings back, as the chief's
    restore does."""
    takes = failed = 0

    def before(self, fetches):
        if fetches is self.queue.take:
            self.takes += 1
            if self.takes > 1 and len(self.sessions_made) < 2:
                self.failed += 1
                raise tf.errors.FailedPreconditionError(None, None, "input_queue/state is not initialized")


class _TakeUnavailableOnce(_FaultyFeedSessions):
    """The second `take` fails as if ps 0 were gone (Unavailable); each session's close records whether the thread
    that closed it is one Python started (the training session's) or one of TensorFlow's (the input pipeline's,
    inside a step)."""
    takes = 0

    def __init__(self, *args):
        super().__init__(*args)
        self.closed_by = []

    def __call__(self):
        session = super().__call__()
        real_close = session.close

        def close():
            self.closed_by.append("pipeline" if isinstance(threading.current_thread(), threading._DummyThread)
                                  else "training")
            real_close()

        session.close = close
        return session

    def before(self, fetches):
        if fetches is self.queue.take:
            self.takes += 1
            if self.takes == 2:
                raise tf.errors.UnavailableError(None, None, "failed to connect to all addresses")


class _OneWorkerQueue:
    """One worker's graph of the queue over `files` TFRecord files of `per_file` examples (one epoch, a file a
    pass, each read in order) and a step that reads a batch of 16; the feed's sessions are `sessions`
    (a _FaultyFeedSessions class). train() records what each step trained and each session made."""

    def __init__(self, target, data_dir, files, per_file, sessions, clock=time.monotonic, num_workers=1, count=1,
                 reached=None):
        self.target, self.files, self.per_file = target, files, per_file
        write_embedded_as_tfrecord(data_dir, examples=files * per_file, num_files=files)
        self.graph = tf.Graph()
        with self.graph.as_default():
            with v1.device("/job:ps/task:0"):
                global_step = v1.train.get_or_create_global_step()
            queue = work_queue.WorkQueue(files, 0, num_workers, 1, 60.0, "/job:ps/task:0", global_step)
            self.feed = work_queue.ItemFeed(queue, "worker:0", files_per_pass=1, clock=clock)
            cfg = inputs.DataConfig(name="tfrecord", data_dir=str(data_dir), input_queue=True, shuffle_buffer=1)
            batches = v1.data.make_initializable_iterator(inputs.queued_batches(cfg, inputs.Shard(0, 1, self.feed), 16))
            _, _, self.keys, self.ordinals = batches.get_next()
            with tf.control_dependencies([self.keys, self.ordinals]):
                self.step = v1.assign_add(global_step, count)  # count: the steps a run counts (a round's)
            self.hook = queue_hook.InputQueueHook(
                self.feed, self.keys, self.ordinals, batches.initializer, 60.0,
                reached=reached or train_graph.step_reached(self.step.op, global_step))
            self.global_step, self.queue = global_step, queue
            with tf_session(target) as session:
                session.run(v1.global_variables_initializer())
        self.made, self.trained = [], []
        self.sessions = sessions(target, self.graph, queue, self.made)
        self.feed.connect(self.sessions)

    def train(self, timeout_secs: float, after_step=lambda step: None) -> bool:
        """Trains the epoch in a worker's MonitoredSession (made again, it finds the queue's state as ps 0 holds
        it); False if it did not end in timeout_secs. after_step(steps trained) runs after each step. In a
        daemon thread, so that a pipeline waiting for good fails the test instead of hanging it."""
        return self.run([self.recorder(after_step), self.hook], timeout_secs)

    def recorder(self, after_step=lambda step: None) -> v1.train.SessionRunHook:
        """A hook that records each session made (self.made) and what each step trained (self.trained), then
        calls after_step(steps run)."""
        made, trained, keys, ordinals = self.made, self.trained, self.keys, self.ordinals
        steps = []

        class Recorder(v1.train.SessionRunHook):
            def after_create_session(self, session, coord):
                made.append(session)

            def before_run(self, run_context):
                return v1.train.SessionRunArgs([keys, ordinals])

            def after_run(self, run_context, run_values):
                trained.extend(zip(*(values.tolist() for values in run_values.results)))
                steps.append(len(trained))
                after_step(len(steps))

        return Recorder()

    def run(self, hooks, timeout_secs: float) -> bool:
        """Steps a worker's MonitoredSession with `hooks` until it stops; False if it did not in timeout_secs."""
        def train():
            with self.graph.as_default(), v1.train.MonitoredSession(
                    v1.train.WorkerSessionCreator(master=self.target), hooks=hooks) as session:
                while not session.should_stop():
                    session.run(self.step)

        training = threading.Thread(target=train, daemon=True)
        training.start()
        training.join(timeout=timeout_secs)
        return not training.is_alive()

    def trained_each_example(self) -> bool:
        return set(self.trained) == {(key, ordinal) for key in range(self.files) for ordinal in range(self.per_file)}


@pytest.mark.servers
def test_a_round_that_a_ps_0_restore_undid_is_trained_again_for_its_report_carries_the_step_it_counted_to(
        cluster, tmp_path):
    # A run counts its steps on ps 0 after its update (a round of 10: after its push), and its examples are
    # reported to ps 0 with the global step that count reached: ps 0 drops a report its global step is
    # behind. A step read anywhere in the run is often the round's start, which a ps 0 restored from a
    # delta saved just before the round's count is not behind: it would take the report of a round whose
    # update it no longer holds, and those examples would never be trained again.
    worker = _OneWorkerQueue(cluster[0].target, tmp_path, 1, 48, _FaultyFeedSessions, count=10)
    restore = tf_session(worker.target, graph=worker.graph)

    def restored_after_the_first_round(steps):
        if steps == 1:  # ps 0 restarts, restored to a delta saved before the round's count
            worker.global_step.load(0, restore)
            raise tf.errors.UnavailableError(None, None, "ps 0 restarted")

    # The recorder runs after the queue hook: the run's examples are counted.
    ended = worker.run([worker.hook, worker.recorder(restored_after_the_first_round)], timeout_secs=60)
    restore.close()
    assert ended, "the epoch did not end in 60 s"
    assert len(worker.made) == 2 and worker.feed.finished  # the session made again, the epoch ended
    # The first round's 16 examples trained again: its report carried global step 10, which ps 0 was behind.
    assert sorted(worker.trained) == sorted([(0, o) for o in range(16)] + [(0, o) for o in range(48)]), worker.trained


@pytest.mark.servers
def test_a_sync_workers_report_carries_the_step_its_round_went_in_at_and_a_restore_before_it_trains_it_again(
        cluster, tmp_path):
    # A synchronous worker's run counts nothing itself: the chief's round does, after the run has read the
    # global step. Its report carries instead the step its round went in at, known once the sync hook has seen
    # the run (SyncReplicasHook.round_applied), which the queue hook asks after the run. Here the chief's round
    # goes in after each run; ps 0 restored to before the first round drops that run's report, and its 16
    # examples are trained again. With the step the run read (0), ps 0 would take the report.
    applied = [0]
    worker = _OneWorkerQueue(cluster[0].target, tmp_path, 1, 48, _FaultyFeedSessions, count=0,
                             reached=lambda: applied[0])
    chief = tf_session(worker.target, graph=worker.graph)

    def round_applied(steps):  # before the queue hook, as the sync hook runs
        applied[0] += 1
        worker.global_step.load(applied[0], chief)

    class Restore(v1.train.SessionRunHook):  # after the queue hook: the first run's report is made
        def after_run(self, run_context, run_values):
            if len(worker.trained) == 16:  # ps 0 restarts, restored to a checkpoint before the first round
                applied[0] = 0
                worker.global_step.load(0, chief)
                raise tf.errors.UnavailableError(None, None, "ps 0 restarted")

    ended = worker.run([worker.recorder(round_applied), worker.hook, Restore()], timeout_secs=60)
    chief.close()
    assert ended, "the epoch did not end in 60 s"
    assert len(worker.made) == 2 and worker.feed.finished  # the session made again, the epoch ended
    assert sorted(worker.trained) == sorted([(0, o) for o in range(16)] + [(0, o) for o in range(48)]), worker.trained


@pytest.mark.servers
def test_a_queue_call_that_times_out_mid_training_makes_the_session_again_and_loses_no_example(cluster, tmp_path):
    # The elastic test paused workers (SIGSTOP) while a worker joined; one resumed inside a call to the queue
    # whose deadline had passed, and the DeadlineExceeded it met in a hook ended it with exit 138.
    worker = _OneWorkerQueue(cluster[0].target, tmp_path, 3, 40, _FinishAnsweredLate)
    assert worker.train(timeout_secs=60), "the epoch did not end in 60 s"
    assert worker.sessions.timed_out and len(worker.made) == 2  # the call timed out, and the session was made again
    assert worker.feed.finished  # the epoch ended: every file finished, the one whose answer came late included
    assert worker.trained_each_example()
    # Read twice: at most the batches of the file whose finish was lost, trained before the new session.
    assert len(worker.trained) - 3 * 40 <= 40


@pytest.mark.servers
def test_a_take_that_fails_until_the_session_is_made_again_ends_the_pipeline_and_loses_no_example(cluster, tmp_path):
    # A chief whose ps 0 restarted stopped for good (the Criteo drill, with ps 0 killed): its pipeline asked
    # the queue again and again while the step waited on the read, the session's close waited on the step,
    # and only the chief's next session would have restored the queue. The pipeline now hands the error to
    # the session's Coordinator and ends, and MonitoredSession makes the session again.
    worker = _OneWorkerQueue(cluster[0].target, tmp_path, 3, 40, _TakeLostUntilMadeAgain)
    lost = worker.sessions
    assert worker.train(timeout_secs=60), (f"the training session waited on its input for 60 s: {lost.failed} "
                                           f"failed take(s), sessions made {len(worker.made)}")
    assert lost.failed >= 1 and len(worker.made) == 2  # the take failed, and the session was made again
    assert worker.feed.finished  # the epoch ended: every file finished
    assert worker.trained_each_example()
    # Read twice: at most the first file's batches trained before the new session gave it back.
    assert len(worker.trained) - 3 * 40 <= 40


@pytest.mark.servers
def test_a_take_that_fails_inside_a_step_leaves_its_session_for_the_training_thread_to_close(cluster, tmp_path):
    # The Criteo drill's chief once stopped for good after ps 0 was killed: MonitoredSession closed the training
    # session, which waited for the step in flight, while that step's input pipeline closed the feed's session
    # after a failed take, which waited in turn. A take that fails inside a step leaves its session to the hook's
    # thread, which closes it as the next session is made.
    worker = _OneWorkerQueue(cluster[0].target, tmp_path, 3, 40, _TakeUnavailableOnce)
    feed_sessions = worker.sessions
    assert worker.train(timeout_secs=60), f"the training session did not end in 60 s: closed {feed_sessions.closed_by}"
    assert feed_sessions.takes >= 2 and len(worker.made) == 2  # the take failed, and the session was made again
    assert feed_sessions.closed_by and set(feed_sessions.closed_by) == {"training"}, feed_sessions.closed_by
    assert worker.feed.finished and worker.trained_each_example()


@pytest.mark.servers
def test_a_worker_silent_past_its_lease_trains_none_of_the_file_another_worker_took_meanwhile(cluster, tmp_path):
    # The elastic test paused two workers (SIGSTOP) for longer than their lease while a third joined: it took
    # their files, and as they resumed they trained the batches they had read of them, 1,264 examples of an
    # epoch trained twice.
    class Clock:  # its time jumps when the test says; a take that finds no file waits as it would
        now = 0.0
        sleep = staticmethod(time.sleep)

        def __call__(self):
            return self.now

    clock = Clock()
    worker = _OneWorkerQueue(cluster[0].target, tmp_path, 3, 40, _FaultyFeedSessions, clock=clock, num_workers=2)
    with tf.Graph().as_default() as graph:  # a second worker's queue: the same state on ps 0
        with v1.device("/job:ps/task:0"):
            global_step = v1.train.get_or_create_global_step()
        other = work_queue.WorkQueue(3, 1, 2, 1, 60.0, "/job:ps/task:0", global_step)
        other_session = tf_session(cluster[1].target, graph=graph)
    taken = []

    def pause_past_the_lease(step):
        if step == 1:  # the first worker is silent for 61 s: the second reclaims its file, trains it, finishes it
            key, _, reclaimed, start, _ = other_session.run(other.take, {other.now: time.time() + 61})
            other_session.run(other.finish, {other.key: key, other.examples: 40})
            taken.append((int(key), int(reclaimed), int(start)))
            clock.now += 61

    assert worker.train(timeout_secs=60, after_step=pause_past_the_lease), "the epoch did not end in 60 s"
    [(key, reclaimed, start)] = taken
    assert key == 0 and reclaimed >= 1 and start == 0, taken  # file 0, held by the first worker, 16 trained unreported
    # Resumed, the first worker trained none of file 0 beyond its first step: its session was made again and
    # its input started afresh on the files still to take.
    assert sorted(o for k, o in worker.trained if k == 0) == list(range(16)), worker.trained
    assert len(worker.made) == 2 and worker.feed.finished
    assert {(k, o) for k, o in worker.trained if k} == {(k, o) for k in (1, 2) for o in range(40)}


@pytest.mark.servers
def test_the_report_of_a_step_that_failed_rides_on_the_next_call(cluster, tmp_path):
    # A step carries the trained prefixes its predecessors moved; one that failed (a ps lost mid-step) lost
    # them, and the next reader of those files trained their examples again.
    write_embedded_as_tfrecord(tmp_path, examples=80, num_files=2)
    cfg = inputs.DataConfig(name="tfrecord", data_dir=str(tmp_path), input_queue=True, shuffle_buffer=1)
    graph, queue, feed, batches, (keys, ordinals), init = _one_feed(cluster, cfg, 2, files_per_pass=1)
    with tf_session(cluster[0].target, graph=graph) as session:
        session.run(init)
        feed.restart()
        session.run(batches.initializer)
        for _ in range(3):  # three steps of file 0, each reporting what the one before moved
            session.run(queue.report, feed.report())
            feed.delivered()
            step_keys, step_ordinals = session.run([keys, ordinals])
            feed.trained(step_keys, step_ordinals)
        assert step_keys.tolist() == [0] * 8
        feed.report()  # the fourth step carries the third's move, and fails before ps 0 has it
        feed.restart()  # the session made again: file 0 goes back to the queue
        key, _, _, start, _ = session.run(queue.take)
        feed.stop()
    assert (key, start) == (0, 24)  # the next reader skips the 24 examples trained


@pytest.mark.inprocess
def test_an_audit_file_cut_mid_record_reads_its_whole_records(tmp_path):
    # A worker killed while it wrote a step's records, or read while it writes them, leaves a record cut short.
    path = tmp_path / layout.AUDIT
    whole = np.array([[0, 3, 10], [0, 3, 11]], "<i8")
    path.write_bytes(whole.tobytes() + np.array([1, 4], "<i8").tobytes())
    np.testing.assert_array_equal(queue_hook.read_audit(str(path)), whole)


@pytest.mark.inprocess
def test_a_resume_over_other_training_files_is_refused_naming_what_changed(tmp_path):
    data, model_dir = tmp_path / "data", str(tmp_path / "model")
    record = layout.queue_files(model_dir)
    data.mkdir()
    for name, text in (("train-0.csv", "a\n1\n"), ("train-1.csv", "a\n1\n2\n")):
        (data / name).write_text(text)

    def files():
        return work_queue.files_of(sorted(str(p) for p in data.glob("train-*.csv")))

    first = files()
    assert first == [["train-0.csv", 4], ["train-1.csv", 6]]
    work_queue.record_files(record, first)
    assert work_queue.files_refusal(record, first, True, str(data)) is None
    moved = tmp_path / "moved"
    data.rename(moved)  # the same files elsewhere are the same files
    data = moved
    assert work_queue.files_refusal(record, files(), True, str(data)) is None
    (data / "train-1.csv").write_text("a\n1\n2\n3\n")
    (data / "train-0.csv").unlink()
    (data / "train-2.csv").write_text("a\n")
    refusal = work_queue.files_refusal(record, files(), True, str(data))
    assert refusal == (
        f"--input_queue: the training files in {data} are not those the run in {model_dir} read (train-1.csv was 6 "
        f"bytes and is 8; train-2.csv is new and 1 more; {model_dir}/input_queue_files.json lists those): its "
        "checkpoint's epochs are of those files, and would be taken for these. Put those files back, or train these "
        "in a new --model_dir")
    assert work_queue.files_refusal(record, files(), False, str(data)) is None  # nothing to resume: a new one
    work_queue.record_files(record, files())
    assert work_queue.files_refusal(record, files(), True, str(data)) is None
