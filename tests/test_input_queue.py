"""--input_queue end to end: real ps and worker processes on 127.0.0.1 share the training files
through the work queue on ps 0, through a worker killed mid-epoch and restarted, and end when
--num_epochs are trained, every example of each epoch in it."""

import contextlib
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from ps_trainer.input import work_queue
from ps_trainer.launch import chaos
from tests import support
from tests.support import describe, finished, wait_for
from ps_trainer.training import checkpoints, exit_codes, log_lines

pytestmark = pytest.mark.e2e
FILES, ROWS_PER_FILE, BATCH = 16, 500, 32
EXAMPLES = FILES * ROWS_PER_FILE
EPOCH_EXAMPLES, EPOCH_BATCH = 12000, 100  # the kill drill's


def write_numbered_csvs(data_dir, rows=(ROWS_PER_FILE,) * FILES) -> None:
    support.write_numbered_csvs(data_dir, rows, eval_rows=ROWS_PER_FILE)


@contextlib.contextmanager
def busy_cores(count: int):
    """`count` CPU-bound processes beside the test's cluster (a loaded machine), each stopped by its own group."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True,
                              stdin=subprocess.DEVNULL) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            support.stop_process_group(proc)


@pytest.mark.drill
@pytest.mark.parametrize("mode, batches_a_step", [([], 1), (["--sync_replicas"], 2)], ids=["async", "sync"])
def test_a_worker_killed_mid_epoch_on_a_busy_machine_trains_each_example_once_and_the_epochs_end_on_time(
        make_cluster, tmp_path, mode, batches_a_step):
    """Two epochs of 12,000 examples in 4 files at batch 100 (120 steps an epoch; 60 in sync mode, where a step
    is a round of both workers' batches), shuffled over a buffer that holds a whole pass, worker 1 killed once
    a checkpoint reached a third of the run and restarted, two busy processes beside the cluster: the files it
    held go on where its steps left them, past its trained prefix too (the examples its shuffle trained ahead
    of it are skipped), so the run ends at the two epochs' steps."""
    data_dir = tmp_path / "data"
    support.write_embedded_as_tfrecord(data_dir, examples=EPOCH_EXAMPLES, num_files=4)
    support.write_embedded_as_tfrecord(data_dir, split="eval")
    cluster = make_cluster(num_ps=1, num_workers=2, trainer_args=[
        "--dataset=tfrecord", f"--data_dir={data_dir}", "--num_epochs=2", f"--batch_size={EPOCH_BATCH}",
        "--input_queue_audit", "--train_steps=100000", "--save_checkpoint_steps=20", "--log_every_n_steps=20",
        "--export_saved_model=false", *mode])
    ideal = 2 * EPOCH_EXAMPLES // (EPOCH_BATCH * batches_a_step)
    with busy_cores(2):
        cluster.start_all()
        wait_for(lambda: (checkpoints.checkpoint_step(tf.train.latest_checkpoint(str(cluster.model_dir))) or 0)
                 >= ideal // 3, 240, f"a checkpoint of step {ideal // 3}", cluster)
        cluster.kill("worker", 1)
        cluster.start("worker", 1)
        codes = cluster.wait(timeout=240)
    assert set(codes.values()) == {0}, describe(cluster)
    logs = [cluster.log("worker", i) for i in (0, 1)]
    done = sorted(set(entry for log in logs for entry in log_lines.epochs_done(log)))
    assert [(epoch, examples) for epoch, _, examples in done] == [(0, EPOCH_EXAMPLES), (1, EPOCH_EXAMPLES)], done
    # The global step is the epochs' steps, within the killed worker's last step (trained, its report to ride
    # on the next): nothing its shuffle had trained ahead of a file's prefix is trained again.
    final_step = int(finished(logs[0])["global_step"])
    assert ideal <= final_step <= ideal + 5, (final_step, done)
    assert final_step == done[-1][1]
    assert tf.train.load_checkpoint(str(cluster.model_dir)).get_tensor("global_step") == final_step
    # Each example by its ID (epoch, file, ordinal), as the workers trained them: every one of each epoch,
    # and none twice but the killed worker's last batch.
    audit = chaos.count_audit(cluster.model_dir)
    assert sorted(audit) == [0, 1] and all(audit[e][0] == EPOCH_EXAMPLES for e in audit), audit
    assert sum(audit[e][1] for e in audit) <= EPOCH_BATCH, audit
    assert float(finished(logs[0])["heldout_accuracy"]) > 0.5  # ten classes: chance is 0.1; measured 0.66


def test_a_cluster_stopped_mid_epoch_resumes_the_epoch_from_its_checkpoint(make_cluster, tmp_path):
    data_dir = tmp_path / "data"
    write_numbered_csvs(data_dir)
    args = ["--dataset=csv", f"--data_dir={data_dir}", "--numeric_columns=x1,x2", "--model=wide_deep",
            "--hidden_units=16", "--input_queue", "--num_epochs=1", f"--batch_size={BATCH}", "--train_steps=100000",
            "--log_every_n_steps=20", "--save_checkpoint_steps=40"]
    first = make_cluster(num_ps=1, num_workers=2, trainer_args=args, name="first")
    first.start_all()
    deadline = time.monotonic() + 180
    model_dir = str(first.model_dir)

    def saved_mid_epoch():
        newest = tf.train.latest_checkpoint(model_dir)
        if newest is None:
            return False
        _, examples, _ = work_queue.unpack(tf.train.load_checkpoint(newest).get_tensor(work_queue.STATE), FILES)
        return examples[0] > 0

    wait_for(saved_mid_epoch, deadline - time.monotonic(), "a checkpoint with some of the epoch's files done", first)
    for job, index in (("worker", 0), ("worker", 1), ("ps", 0)):  # the whole cluster, at once
        first.kill(job, index)
    checkpoint = tf.train.load_checkpoint(tf.train.latest_checkpoint(model_dir))
    saved_step = int(checkpoint.get_tensor("global_step"))
    epoch, examples, owners = work_queue.unpack(checkpoint.get_tensor(work_queue.STATE), FILES)
    assert epoch == 0 and 0 < examples[0] < EXAMPLES, describe(first)  # mid-epoch, some files done
    leased = int((owners[0] >= 0).sum())

    second = make_cluster(num_ps=1, num_workers=2, trainer_args=[*args, f"--model_dir={model_dir}"], name="second")
    second.start_all()
    codes = second.wait(timeout=max(30, deadline - time.monotonic()))
    assert set(codes.values()) == {0}, describe(second)
    logs = [second.log("worker", i) for i in (0, 1)]
    assert sorted({(e, n) for log in logs for e, _, n in log_lines.epochs_done(log)}) == [(0, EXAMPLES)]
    # The resumed run finished the rest of the epoch: the files not done at the checkpoint, and no file
    # done before it; of those, it trained what the checkpoint's prefixes had not (the leased ones').
    tallies = [t[0] for t in (log_lines.epoch_tallies(log) for log in logs) if 0 in t]
    resumed, skipped = sum(t[1] for t in tallies), sum(t[2] for t in tallies)
    assert resumed == EXAMPLES - examples[0], (resumed, examples[0])
    packed = checkpoint.get_tensor(work_queue.PREFIXES)[:FILES]  # epoch 0's files' slots: their keys are 0..15
    prefixes = np.where(packed >> work_queue.COUNT_BITS == np.arange(FILES),
                        packed & ((1 << work_queue.COUNT_BITS) - 1), 0)
    assert skipped == prefixes[owners[0] != work_queue.DONE].sum(), (skipped, prefixes, owners)
    trained = resumed - skipped
    steps = int(finished(logs[0])["global_step"]) - saved_step
    assert trained / BATCH <= steps <= trained / BATCH + 2 * FILES, (steps, trained, leased)

    # The next day's logs (as many files, other rows) on the same model_dir: its epoch and its done
    # marks are of the files above. The chief found "training is over", trained nothing and exited 0.
    write_numbered_csvs(tmp_path / "day2", rows=(ROWS_PER_FILE + 10,) * FILES)
    day2 = make_cluster(num_ps=1, num_workers=2, name="day2", trainer_args=[
        *args, f"--data_dir={tmp_path / 'day2'}", f"--model_dir={model_dir}"])
    day2.start("worker", 0)  # the chief refuses before it waits for a ps
    assert day2.wait("worker", timeout=120) == {("worker", 0): exit_codes.BAD_FLAGS.code}, describe(day2)
    refusal, = support.lines_with(day2.log("worker", 0), "are not those the run in")
    assert (f"--input_queue: the training files in {tmp_path / 'day2'} are not those the run in {model_dir} read "
            "(train-00.csv was ") in refusal and "and 14 more" in refusal, refusal


def test_sync_training_on_uneven_files_ends_at_the_last_example_without_a_hang(make_cluster, tmp_path):
    # One file holds over half the examples: while its worker trains it, the other has nothing left to
    # read, and every round still needs its gradient (an empty batch's).
    rows = (3000,) + (300,) * 7
    examples = sum(rows)
    data_dir = tmp_path / "data"
    write_numbered_csvs(data_dir, rows)
    cluster = make_cluster(num_ps=1, num_workers=2, trainer_args=[
        "--dataset=csv", f"--data_dir={data_dir}", "--numeric_columns=x1,x2", "--model=wide_deep",
        "--hidden_units=16", "--input_queue", "--input_queue_audit", "--num_epochs=1", "--sync_replicas",
        f"--batch_size={BATCH}",
        "--train_steps=100000", "--log_every_n_steps=20", "--save_checkpoint_steps=100000"])
    cluster.start_all()
    codes = cluster.wait(timeout=180)  # a hang at the end of the epoch stops here
    assert set(codes.values()) == {0}, describe(cluster)
    logs = [cluster.log("worker", i) for i in (0, 1)]
    done = [entry for log in logs for entry in log_lines.epochs_done(log)]
    assert [(epoch, n) for epoch, _, n in done] == [(0, examples)], describe(cluster)
    tallies = [log_lines.epoch_tallies(log)[0] for log in logs]
    # Every example once: nothing read again, nothing left out, and both workers took files.
    assert sum(files for files, *_ in tallies) == len(rows) and all(files for files, *_ in tallies), tallies
    assert sum(n for _, n, _, _ in tallies) == examples, tallies
    assert not any(skipped or again for _, _, skipped, again in tallies), tallies
    assert chaos.count_audit(cluster.model_dir) == {0: [examples, 0, examples]}  # each example ID once
    final_step = int(finished(logs[0])["global_step"])
    # The run ended with the round that trained its last example. A round takes one batch of each
    # worker: the big file alone took a round per batch, more rounds than the examples fill when both
    # workers read (those rounds had an empty batch of the other worker's).
    assert final_step == done[-1][1], describe(cluster)
    assert rows[0] / BATCH <= final_step <= rows[0] / BATCH + len(rows) * (300 / BATCH + 1), final_step
    assert rows[0] / BATCH > examples / BATCH / 2 + len(rows)
    assert tf.train.load_checkpoint(str(cluster.model_dir)).get_tensor("global_step") == final_step
    assert float(finished(logs[0])["heldout_accuracy"]) > 0.9


def test_a_file_gone_between_epochs_stops_the_workers_naming_it(make_cluster, tmp_path):
    data_dir = tmp_path / "data"
    write_numbered_csvs(data_dir)
    cluster = make_cluster(num_ps=1, num_workers=2, trainer_args=[
        "--dataset=csv", f"--data_dir={data_dir}", "--numeric_columns=x1,x2", "--model=wide_deep",
        "--hidden_units=16", "--input_queue", "--num_epochs=50", f"--batch_size={BATCH}", "--train_steps=100000"])
    cluster.start_all()
    deadline = time.monotonic() + 120
    wait_for(lambda: any(log_lines.epochs_done(cluster.log("worker", i)) for i in (0, 1)), deadline - time.monotonic(),
             "the first epoch done", cluster)
    (data_dir / "train-05.csv").unlink()
    codes = cluster.wait("worker", timeout=max(30, deadline - time.monotonic()))
    assert set(codes.values()) == {exit_codes.BAD_DATA.code}, describe(cluster)
    for index in (0, 1):
        errors = [line for line in cluster.log("worker", index).splitlines() if line.startswith("E1")]
        assert any(f"{data_dir / 'train-05.csv'}; No such file or directory (an input file is gone" in line
                   for line in errors), describe(cluster)
