"""The log lines other programs read: written by the trainer's own functions through absl, read back
by the parsers the launchers, drills and benchmark use."""

import datetime
import io
import logging as std_logging

import pytest
from absl import logging

from ps_trainer.launch import terminal
from ps_trainer.training import log_lines

pytestmark = pytest.mark.pure


@pytest.fixture
def written():
    """What absl writes to a log file (its prefix, then the message), as the trainer's stderr has it."""
    stream = io.StringIO()
    handler = std_logging.StreamHandler(stream)
    handler.setFormatter(logging.PythonFormatter())
    std_logging.getLogger("absl").addHandler(handler)
    old_level = logging.get_verbosity()
    logging.set_verbosity(logging.INFO)
    yield stream
    logging.set_verbosity(old_level)
    std_logging.getLogger("absl").removeHandler(handler)


def test_first_step_and_progress_lines_read_back(written):
    log_lines.log_first_step("worker:1", 57, 2.30258)
    log_lines.log_progress("worker:1", 400, 2000, 0.53214, 0.8437, 9120.4, 21.2, {"mean": 1.04, "max": 3})
    log_lines.log_progress("chief:0", 500, 2000, float("nan"), 0.1, 0.0, 0.0)
    text = written.getvalue()
    steps = log_lines.steps(text)
    assert [(s.task, s.step, s.first) for s in steps] == [("worker:1", 57, True), ("worker:1", 400, False),
                                                           ("chief:0", 500, False)]
    assert steps[0].loss == pytest.approx(2.3026) and steps[1].loss == pytest.approx(0.5321)
    assert abs(steps[0].time - datetime.datetime.now()) < datetime.timedelta(minutes=1)
    assert [s.step for s in log_lines.first_steps(text)] == [57]
    assert str(log_lines.task_lines(text)[1]).startswith("worker:1 step 400/2000 loss 0.5321 accuracy 0.844 ")


def test_a_session_made_again_reads_back_with_its_global_step(written):
    log_lines.log_first_step("worker:0", 0, 2.3)
    log_lines.log_session_again("worker:0", 412)
    log_lines.log_session_again("chief:0", 980)
    assert log_lines.sessions_again(written.getvalue()) == [412, 980]
    assert log_lines.sessions_again("W1128 07:00:00.000 1 x.py:1] worker:0 first step done at global step 0") == []


def test_the_finished_line_reads_back_its_fields_and_the_last_one_counts(written):
    log_lines.log_finished("worker:0", {"global_step": 100, "loss": "0.5000"})
    log_lines.log_finished("worker:0", {"global_step": 2000, "local_steps": 1001, "heldout_accuracy": "0.8510"})
    assert log_lines.finished_values(written.getvalue()) == {
        "global_step": "2000", "local_steps": "1001", "heldout_accuracy": "0.8510"}
    assert log_lines.finished_values("I1123 07:00:00.000000 1 x.py:1] worker:0 step 1/2 loss 1\n") == {}


def test_the_input_queues_epoch_lines_read_back(written):
    log_lines.log_epoch_done("worker:1", 0, 250, 8000)
    log_lines.log_epoch_tally("worker:1", 0, 4, 4000, 0, 0)
    log_lines.log_epoch_tally("worker:1", 1, 3, 3000, 170, 0)
    log_lines.log_epoch_tally("worker:1", 2, 5, 5000, 0, 96)
    log_lines.log_epoch_tally("worker:1", 3, 2, 2000, 12, 40)
    text = written.getvalue()
    assert [(epoch, step, n) for epoch, step, n in log_lines.epochs_done(text)] == [(0, 250, 8000)]
    assert log_lines.epoch_tallies(text) == {0: (4, 4000, 0, 0), 1: (3, 3000, 170, 0), 2: (5, 5000, 0, 96),
                                            3: (2, 2000, 12, 40)}


def test_examples_per_sec_counts_from_the_first_line_past_warmup():
    lines = [f"I0102 00:00:{second:02d}.000000 7 hooks.py:1] worker:0 step {step}/900 loss 1.0000 accuracy 0.500 "
             f"1 examples/sec 0:00:01 left" for second, step in ((0, 50), (10, 100), (20, 300))]
    assert log_lines.examples_per_sec("\n".join(lines), 64, warmup_steps=100) == pytest.approx(200 * 64 / 10)
    assert log_lines.examples_per_sec("\n".join(lines[:2]), 64, warmup_steps=100) is None  # one line past warm-up


def test_log_times_across_new_year_keep_their_order():
    now = datetime.datetime(2027, 1, 1, 0, 0, 30)
    before = log_lines.log_time("I1231 23:59:50.000000 1 hooks.py:125] worker:0 step 10/20", now)
    after = log_lines.log_time("I0101 00:00:10.500000 1 hooks.py:125] worker:0 step 20/20", now)
    assert before.year == 2026 and after.year == 2027
    assert (after - before).total_seconds() == 20.5


def test_an_errors_cause_is_its_first_line_that_is_not_framing():
    remote = ("\n=====================\nUNAVAILABLE: From /job:ps/replica:0/task:0:\nSocket closed\n"
              "=====================\n")
    assert log_lines.error_cause(remote) == "UNAVAILABLE: From /job:ps/replica:0/task:0: Socket closed"
    gone = "From /job:worker/replica:0/task:1:\n/data/train-05.csv; No such file or directory\n\t [[{{node x}}]]"
    assert log_lines.error_cause(gone) == ("From /job:worker/replica:0/task:1: /data/train-05.csv; No such file or "
                                           "directory")
    in_dataset = ("From /job:worker/replica:0/task:0:\nError in user-defined function passed to "
                  "ParallelInterleaveDatasetV4:197 transformation with iterator: "
                  "Iterator::Root::Prefetch::FlatMap[2]::Map::ParallelInterleaveV4: "
                  "/data/train-05.csv; No such file or directory\n\t [[{{node ReduceDataset}}]]")
    assert log_lines.error_cause(in_dataset) == log_lines.error_cause(gone).replace("task:1", "task:0")
    graph = "Graph execution error:\n\nDetected at node 'x' defined at:\n  File a.py\nloss is NaN\n\t [[{{node x}}]]"
    assert log_lines.error_cause(graph) == "loss is NaN"


def test_the_last_evaluation_line_reads_back_as_tensorflows_own_does(written):
    log_lines.log_evaluation({"global_step": 300, "loss": 0.61, "auc": 0.7})
    log_lines.log_evaluation({"global_step": 600, "loss": 0.42937, "auc": 0.88101, "accuracy": 0.783})
    assert log_lines.last_evaluation(written.getvalue()) == {"accuracy": 0.783, "auc": 0.88101, "global_step": 600,
                                                             "loss": 0.42937}
    assert "Saving dict for global step 600: accuracy = 0.783, auc = 0.88101, global_step = 600," in written.getvalue()
    # TF 2.15's Estimator through TensorFlow's logger, a value that is not a number among them.
    theirs = ("INFO:tensorflow:Saving dict for global step 1000: accuracy = 0.5, global_step = 1000, "
              "label/mean = 0.25, loss = 18.25, note = n/a\n")
    assert log_lines.last_evaluation(theirs) == {"accuracy": 0.5, "global_step": 1000, "label/mean": 0.25,
                                                 "loss": 18.25}
    assert log_lines.last_evaluation("I1123 07:00:00.000000 1 x.py:1] worker:0 step 1/2 loss 1\n") == {}


class _Logs:
    """A finished cluster's tasks and logs, as launch.terminal.summary reads them."""

    def __init__(self, logs):
        self.logs = logs

    def tasks(self):
        return [(key, None) for key in self.logs]

    def log(self, job, index):
        return self.logs[(job, index)]


def test_the_launchers_summary_names_the_chiefs_figures_and_the_newest_evaluation(written):
    log_lines.log_finished("worker:0", {"global_step": 2001, "loss": "0.3267", "accuracy": "0.859",
                                        "heldout_loss": "0.4088", "heldout_accuracy": "0.8480"})
    trainer = _Logs({("ps", 0): "", ("worker", 0): written.getvalue(), ("worker", 1): ""})
    assert terminal.summary(trainer) == ("final step 2001, held-out loss 0.4088, held-out accuracy 0.8480 (final "
                                         "checkpoint); last batch loss 0.3267, accuracy 0.859")
    # An Estimator program on ps, master, worker and evaluator: the master's line has its step alone; it
    # evaluated after its saves, the evaluator each checkpoint; the newest evaluation is named, the
    # evaluator's where both evaluated the final step.
    master = "I1130 23:50:55.000000 1 x.py:1] master:0 finished: global_step=602 seconds=6.0\n"
    evaluated = {step: f"I1130 23:50:56.000000 1 x.py:1] Saving dict for global step {step}: accuracy = 0.78299, "
                       f"auc = 0.8810188, global_step = {step}, loss = 0.4293794\n" for step in (400, 602)}
    program = _Logs({("master", 0): master + evaluated[602], ("worker", 0): "", ("ps", 0): "",
                     ("evaluator", 0): evaluated[400] + evaluated[602]})
    assert terminal.summary(program) == ("final step 602; evaluation of global step 602 (evaluator 0): "
                                         "accuracy 0.783, auc 0.881, loss 0.4294")
    program.logs[("evaluator", 0)] = evaluated[400]  # the evaluator stopped before the last checkpoint
    assert terminal.summary(program).startswith("final step 602; evaluation of global step 602 (master 0): ")
