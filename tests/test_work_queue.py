"""--input_queue's work queue (input/work_queue.py) on a real ps, in one process: every file handed out
once, a dead worker's files handed out again, the queue's state saved and restored with the model, an
epoch ended exactly by its last file; an empty file and a file cut short through a worker's pipeline."""

import dataclasses
import pathlib
import time

import numpy as np
import pytest
import tensorflow as tf

import input as inputs
from input import work_queue
from input.work_queue import DONE, TODO
from tests.support import read_flags, write_click_csvs, write_embedded_as_tfrecord
from training import worker

pytestmark = pytest.mark.inprocess
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
        self.session = v1.Session(server.target, graph=self.graph)

    def take(self):
        key, over, _ = self.session.run(self.queue.take)
        return int(key), bool(over)

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


def test_a_worker_that_restarts_or_goes_silent_loses_its_files_to_the_others(cluster):
    first, second = Worker(cluster[0], 0, lease_secs=1.0), Worker(cluster[1], 1, lease_secs=1.0)
    first.session.run(first.init)
    held = [second.take()[0] for _ in range(2)]
    assert held == [0, 1]
    assert second.session.run(second.queue.release) == 2  # its restart gives them back
    assert [first.take()[0] for _ in range(2)] == [0, 1]
    assert not second.finish(0)[0]  # a file given back is no longer the restarted worker's to finish

    # A worker silent past its lease: the next take reclaims its files, and they are handed out again.
    later = second.take()[0]
    time.sleep(1.5)  # past the 1 s lease, with no call from the second worker
    first.session.run(first.queue.heartbeat)
    key, _, reclaimed = first.session.run(first.queue.take)
    assert reclaimed == 1 and key == later
    assert not second.finish(later)[0]
    assert first.finish(later)[0]


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


def test_the_queue_state_is_saved_and_restored_with_the_model(cluster, tmp_path):
    worker = Worker(cluster[0], 0, num_workers=1)
    worker.session.run(worker.init)
    for _ in range(3):
        worker.take()
    worker.finish(0, examples=7)
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
    assert [worker.take()[0] for _ in range(4)] == [1, 2, 3, 4]


def test_a_checkpoint_saved_without_the_queue_is_named_not_resumed(tmp_path):
    graph = tf.Graph()
    with graph.as_default(), v1.Session(graph=graph) as sess:
        v1.train.get_or_create_global_step()
        sess.run(v1.global_variables_initializer())
        path = v1.train.Saver().save(sess, str(tmp_path / "model.ckpt"))
    assert "was saved without the input queue" in work_queue.resume_refusal(path, NUM_FILES, "/data")


def test_the_queue_chosen_by_default_gives_way_to_a_checkpoint_of_fixed_shards(tmp_path):
    write_click_csvs(tmp_path / "csv")
    cfg = read_flags("--ps_hosts=127.0.0.1:2222", "--worker_hosts=127.0.0.1:2223", "--job_name=worker",
                     "--task_index=0", f"--model_dir={tmp_path / 'model'}", "--model=wide_deep", "--dataset=csv",
                     f"--data_dir={tmp_path / 'csv'}", "--label_column=clicked", "--numeric_columns=price")
    assert cfg.data.input_queue and cfg.data.input_queue_by_default
    assert worker._settle_input(cfg) is cfg  # pylint: disable=protected-access  (nothing to resume)
    graph = tf.Graph()
    with graph.as_default(), v1.Session(graph=graph) as sess:
        v1.train.get_or_create_global_step()
        sess.run(v1.global_variables_initializer())
        v1.train.Saver().save(sess, str(tmp_path / "model" / "model.ckpt"))
    assert not worker._settle_input(cfg).data.input_queue  # pylint: disable=protected-access
    explicit = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, input_queue_by_default=False))
    assert worker._settle_input(explicit) is explicit  # pylint: disable=protected-access  (refused later)


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
    graph = tf.Graph()
    with graph.as_default():
        with v1.device("/job:ps/task:0"):
            global_step = v1.train.get_or_create_global_step()
        queue = work_queue.WorkQueue(3, 0, 1, 1, 60.0, "/job:ps/task:0", global_step)
        feed = work_queue.ItemFeed(queue, "worker:0")
        batches = v1.data.make_initializable_iterator(inputs.queued_batches(cfg, inputs.Shard(0, 1, feed), 8))
        features, labels, keys, ordinals = batches.get_next()
        init = v1.global_variables_initializer()
    feed.connect(lambda: v1.Session(cluster[0].target, graph=graph))
    with v1.Session(cluster[0].target, graph=graph) as session:
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
