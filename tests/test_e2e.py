"""End to end: real ps and worker processes of trainer.py on 127.0.0.1, checked as a user would."""

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys

import pytest
import tensorflow as tf

from ps_trainer.launch.forked import ForkedTask
from ps_trainer.launch.processes import free_ports
from tests.support import (
    SCRIPTS,
    describe,
    finished,
    lines_with,
    logged_step,
    read_flags,
    run_launcher,
    run_trainer,
    tensorboard,
    wait_for,
    wait_recording_exits,
    write_embedded_as_tfrecord,
)
from ps_trainer.cluster import shutdown
from ps_trainer.training import evaluator, exit_codes, log_lines

pytestmark = pytest.mark.e2e
TIMEOUT = 240  # seconds for a whole small cluster run on 2 busy cores
LN10 = 2.3026  # cross-entropy of a uniform guess over 10 classes


def held_out(cluster, checkpoint_name):
    """Held-out metrics of a checkpoint of the cluster's run (the latest if None), in this process."""
    cfg = read_flags(*cluster.trainer_args)
    path = (str(cluster.model_dir / checkpoint_name) if checkpoint_name
            else tf.train.latest_checkpoint(str(cluster.model_dir)))
    return evaluator.evaluate(cfg, path)[1]


def first_step_time(log):
    return log_lines.first_steps(log)[0].time


def test_async_cluster_trains_to_the_end_and_everything_exits(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=2)
    cluster.start_all()
    exits = wait_recording_exits(cluster, TIMEOUT)
    assert {key: code for key, (code, _) in exits.items()} == {
        ("ps", 0): 0, ("worker", 0): 0, ("worker", 1): 0}, describe(cluster)

    chief_log, other_log = cluster.log("worker", 0), cluster.log("worker", 1)
    chief = finished(chief_log)
    assert 200 <= int(chief["global_step"]) <= 202
    assert int(chief["local_steps"]) > 0 and int(finished(other_log)["local_steps"]) > 0
    # On held-out data, from the first checkpoint (step 0) to the last, whatever the scheduling:
    # accuracy climbs from chance to several times chance, and the loss falls.
    start, end = held_out(cluster, "model.ckpt-0"), held_out(cluster, None)
    assert start["loss"] > 0.8 * LN10 and start["accuracy"] < 0.2
    assert end["accuracy"] > 0.3 and end["loss"] < start["loss"]

    # The non-chief starts within a few seconds of the chief, not after a 30 s poll.
    assert abs((first_step_time(other_log) - first_step_time(chief_log)).total_seconds()) < 5

    reader = tf.train.load_checkpoint(str(cluster.model_dir))
    assert reader.get_tensor("global_step") >= 200
    assert reader.get_variable_to_shape_map()["mlp/hidden0/kernel"] == [784, 256]

    # Workers restarted once the job is over (the ps tasks gone), the chief too, read the chief's done
    # mark and exit 0 at once, not after --startup_timeout_secs of waiting for them.
    cluster.start("worker", 0)
    cluster.start("worker", 1)
    assert cluster.wait("worker", timeout=90) == {("worker", 0): 0, ("worker", 1): 0}, describe(cluster)
    for index in (0, 1):
        assert "training is over (the chief finished at global step" in cluster.log("worker", index)


def test_sync_cluster_on_two_ps_splits_the_variables_shares_steps_fairly_and_exits_promptly(make_cluster):
    # Two hidden layers: without a partitioner a lone 784x256 kernel would outweigh all the rest.
    cluster = make_cluster(num_ps=2, num_workers=2, trainer_args=["--sync_replicas", "--hidden_units=256,256"])
    cluster.start_all()
    exits = wait_recording_exits(cluster, TIMEOUT)
    assert all(code == 0 for code, _ in exits.values()), describe(cluster)
    placed = lines_with(cluster.log("worker", 0), "variables placed:")[0]
    sizes = dict(re.findall(r"(/job:ps/task:\d) ([\d.]+) MiB", placed))
    assert set(sizes) == {"/job:ps/task:0", "/job:ps/task:1"}
    assert all(float(size) > 0.1 for size in sizes.values()), placed

    logs = [cluster.log("worker", i) for i in range(2)]
    results = [finished(log) for log in logs]
    assert int(results[0]["global_step"]) == 200  # sync: one global step per aggregated round
    contributed = [int(r["local_steps"]) for r in results]
    for steps in contributed:
        assert 0.4 <= steps / sum(contributed) <= 0.6, contributed
    last_step = max([s.time for s in log_lines.steps(log) if s.step == 200][-1] for log in logs)
    latest_exit = max(when for _, when in exits.values())
    assert (latest_exit - last_step).total_seconds() < 30
    assert tf.train.load_checkpoint(str(cluster.model_dir)).get_tensor("global_step") == 200


def test_sync_rounds_of_accumulated_batches_stop_at_the_last_round_and_learn(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=2, trainer_args=["--sync_replicas", "--accumulate_batches=4",
                                                                 "--train_steps=60"])
    cluster.start_all()
    exits = wait_recording_exits(cluster, TIMEOUT)
    assert all(code == 0 for code, _ in exits.values()), describe(cluster)
    chief = finished(cluster.log("worker", 0))
    assert int(chief["global_step"]) == 60  # a global step is one round, of 4 micro-batches per worker
    assert tf.train.load_checkpoint(str(cluster.model_dir)).get_tensor("global_step") == 60
    assert float(chief["heldout_accuracy"]) > 0.3, describe(cluster)


def test_a_chief_restarted_after_the_end_exits_0_when_a_peers_last_push_came_after_its_final_save(tmp_path):
    # Async: the chief's final checkpoint is of --train_steps (200), and a peer's push landed after it,
    # so the chief finished at 201 and marked that. Restarted by an orchestrator, the chief found
    # "training over at 201" and exited 138 ("final checkpoint could not be saved") over model.ckpt-200.
    model_dir = tmp_path / "model"
    first = run_trainer(f"--model_dir={model_dir}", "--train_steps=200", "--synthetic_examples=2000",
                        "--export_saved_model=false", "--log_every_n_steps=100")
    assert first.returncode == 0, first.stderr[-3000:]
    assert tf.train.latest_checkpoint(str(model_dir)).endswith("model.ckpt-200")
    shutdown.mark_done(str(model_dir), 0, 201, 200)
    ps, chief, other = free_ports(3)
    again = run_trainer(f"--ps_hosts=127.0.0.1:{ps}", f"--worker_hosts=127.0.0.1:{chief},127.0.0.1:{other}",
                        "--job_name=worker", "--task_index=0", f"--model_dir={model_dir}", "--train_steps=200",
                        "--synthetic_examples=2000", "--export_saved_model=false")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "training is over (the chief finished at global step 201)" in again.stderr

    # Its checkpoints removed since (by hand, a retention policy): the mark alone cannot be exported
    # or trained on. It had exited 138 ("could not be saved"), again at every restart an orchestrator made.
    for path in [*model_dir.glob("model.ckpt-*"), model_dir / "checkpoint"]:
        path.unlink()
    gone = run_trainer(*again.args[2:])
    assert gone.returncode == exit_codes.TRAINED_MODEL_GONE.code, gone.stderr[-3000:]
    line, = lines_with(gone.stderr, "the trained model is gone")
    assert (f"{model_dir}/done/replica-0 says training finished at global step 200, but no checkpoint of that step "
            f"is in {model_dir} (the newest: none)") in line
    assert "Traceback" not in gone.stderr


def test_a_rerun_with_more_steps_resumes_from_the_checkpoint(make_cluster):
    first = make_cluster(num_ps=1, num_workers=1, name="first", trainer_args=["--keep_checkpoint_max=2"])
    first.start_all()
    assert all(code == 0 for code, _ in wait_recording_exits(first, TIMEOUT).values()), describe(first)
    # Saved at steps 0, 100 and 200; --keep_checkpoint_max=2 keeps the newest two.
    kept = sorted(p.name for p in first.model_dir.glob("model.ckpt-*.index"))
    assert kept == ["model.ckpt-100.index", "model.ckpt-200.index"]

    second = make_cluster(num_ps=1, num_workers=1, name="second",
                          trainer_args=[f"--model_dir={first.model_dir}", "--train_steps=300"])
    second.start_all()
    assert all(code == 0 for code, _ in wait_recording_exits(second, TIMEOUT).values()), describe(second)
    resumed_at = log_lines.first_steps(second.log("worker", 0))[0].step
    assert resumed_at == 201  # the first step after the restored step 200, never back to 0
    assert int(finished(second.log("worker", 0))["local_steps"]) == 100
    assert tf.train.load_checkpoint(str(first.model_dir)).get_tensor("global_step") == 300


def test_the_chief_trains_without_waiting_for_another_worker(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=2)
    cluster.start("ps", 0)
    cluster.start("worker", 0)
    codes = cluster.wait("worker", timeout=TIMEOUT)
    assert codes == {("worker", 0): 0}, describe(cluster)
    assert int(finished(cluster.log("worker", 0))["global_step"]) == 200
    assert cluster.procs[("ps", 0)].poll() is None  # still serving: worker 1 has not reported

    cluster.start("worker", 1)  # late: training is over, so it reports done and leaves
    exits = wait_recording_exits(cluster, 120)
    assert all(code == 0 for code, _ in exits.values()), describe(cluster)
    assert int(finished(cluster.log("worker", 1))["local_steps"]) == 0


def test_a_ps_stopped_by_sigterm_exits_cleanly(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=1)
    cluster.start("ps", 0)
    wait_for(lambda: "serving on" in cluster.log("ps", 0), 60, "the ps to serve", cluster)
    cluster.kill("ps", 0, signal.SIGTERM)
    assert cluster.wait("ps", timeout=20) == {("ps", 0): exit_codes.PREEMPTED}
    assert "SIGTERM received" in cluster.log("ps", 0) and "Traceback" not in cluster.log("ps", 0)


def test_a_bad_flag_exits_non_zero_with_its_message():
    result = run_trainer("--ps_hosts=ps0", "--worker_hosts=w0:2222", "--job_name=ps", preload=False)
    assert result.returncode == exit_codes.FAILED  # README: 1, an error with its one-line reason
    assert "--ps_hosts: 'ps0' is not host:port" in result.stderr
    assert "Traceback" not in result.stderr
    # TensorFlow's C++ start-up notices are held back: the usage and the error are what a user reads.
    held_back = ("oneDNN", "InitializeLog", "Could not find cuda drivers", "cuInit")
    assert not [notice for notice in held_back if notice in result.stderr], result.stderr[:500]
    assert result.stderr.startswith("ps-trainer: one script for every host")


def test_a_forked_task_fails_serves_and_dies_as_a_started_one(make_cluster):
    # The tests fork their tasks from a process that has imported the trainer (launch.forked.
    # ForkedTask). The same bad command line, forked and started: the same exit code and error line.
    bad = ("--ps_hosts=ps0", "--worker_hosts=w0:2222", "--job_name=ps")
    forked, started = run_trainer(*bad), run_trainer(*bad, preload=False)
    assert forked.returncode == started.returncode == exit_codes.FAILED
    assert lines_with(forked.stderr, "--ps_hosts:") == lines_with(started.stderr, "--ps_hosts:") != []
    # Its environment reaches it (its cluster from TF_CONFIG); it leads a process group of its own, by
    # whose id it is stopped; SIGKILL reads as a negative code, as subprocess.Popen gives it.
    cluster = make_cluster(num_ps=1, num_workers=1, tf_config=True)
    proc = cluster.start("ps", 0)
    assert isinstance(proc, ForkedTask) and os.getpgid(proc.pid) == proc.pid
    # The ps logs its address once it serves.
    wait_for(lambda: f"serving on {cluster.address('ps', 0)}" in cluster.log("ps", 0), 60, "the ps to serve", cluster)
    log = cluster.log("ps", 0)
    assert proc.poll() is None and f"serving on {cluster.address('ps', 0)}" in log, describe(cluster)
    assert "from TF_CONFIG" in log, log
    cluster.kill("ps", 0)
    assert proc.returncode == -signal.SIGKILL


FORKED_PROGRAM = """
import atexit, os, sys
from absl import flags
print("main:", __name__, "path0:", sys.path[0] == os.path.dirname(os.path.abspath(__file__)),
      "ps_trainer:", sorted(name for name in sys.modules if name.startswith("ps_trainer")),
      "trainer flags:", "ps_hosts" in flags.FLAGS, "argv:", sys.argv[1:], "env:", os.environ.get("FORKED_CASE"),
      flush=True)
atexit.register(lambda: print("atexit ran", flush=True))
case = sys.argv[1]
if case == "raise":
    raise ValueError("a program's own error")
sys.exit(int(case) if case.isdigit() else case)
"""


@pytest.mark.parametrize("case, code, line", [("0", 0, None), ("3", 3, None), ("a reason", 1, "a reason"),
                                              ("raise", 1, "ValueError: a program's own error")])
def test_a_forked_program_runs_exits_and_reports_as_python_program_py_does(tmp_path, case, code, line):
    # An Estimator program's tasks in the tests and under scripts/run_local.py are forked from a process that
    # has imported TensorFlow alone (ForkedTask with program=True): the program sees what `python program.py`
    # shows it (__main__, its folder first on the path, no ps_trainer module, no absl flag), and its end
    # reads as Python's: the exit code, sys.exit's message or the traceback, the atexit functions run.
    program = tmp_path / "program.py"
    program.write_text(FORKED_PROGRAM)
    results = {}
    for forked in (True, False):
        log = tmp_path / f"{forked}.log"
        env = {**os.environ, "FORKED_CASE": case}
        if forked:
            proc = ForkedTask([str(program), case], env, log, cwd=tmp_path, program=True)
            assert os.getpgid(proc.pid) == proc.pid
            returncode = proc.wait(timeout=120)
        else:
            with open(log, "w") as out:
                returncode = subprocess.run([sys.executable, str(program), case], stdout=out, stderr=subprocess.STDOUT,
                                            env=env, cwd=tmp_path, timeout=120, stdin=subprocess.DEVNULL).returncode
        text = log.read_text()
        seen = [row for row in text.splitlines() if row.startswith("main:")]
        results[forked] = (returncode, seen, "atexit ran" in text)
        assert line is None or line in text, text[-2000:]
    assert results[True] == results[False], results
    returncode, [seen], atexit_ran = results[True]
    assert returncode == code and atexit_ran, results
    assert seen == f"main: __main__ path0: True ps_trainer: [] trainer flags: False argv: ['{case}'] env: {case}", seen


def test_download_only_needs_a_directory():
    result = run_trainer("--download_only")
    assert result.returncode == exit_codes.FAILED and "--download_only needs --data_dir" in result.stderr


def test_a_port_in_use_and_another_hosts_address_are_named_before_any_server_starts():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_trainer(f"--ps_hosts=127.0.0.1:{port}", "--worker_hosts=127.0.0.1:1", "--job_name=ps",
                             "--task_index=0")
    # Transient: on Kubernetes the previous pod may still hold the port, or DNS still name its address.
    assert result.returncode == exit_codes.RETRY
    assert f"port {port} of this task's address 127.0.0.1:{port} (ps:0) is in use on this host" in result.stderr
    # Every host started with the same --task_index: this host would serve another host's address.
    result = run_trainer("--ps_hosts=127.0.0.1:1", "--worker_hosts=127.0.0.1:2,192.0.2.7:2222", "--job_name=worker",
                         "--task_index=1", "--allow_public_addresses", "--model_dir=/tmp/unused")
    assert result.returncode == exit_codes.RETRY and "Traceback" not in result.stderr
    assert "this task is worker:1, whose address in the cluster is 192.0.2.7:2222, but 192.0.2.7 is not an " \
           "address of this host" in result.stderr


def test_a_nan_loss_stops_training_naming_the_step(tmp_path):
    result = run_trainer(f"--model_dir={tmp_path}", "--learning_rate=1e30", "--train_steps=50",
                         "--synthetic_examples=1000")
    assert result.returncode == 1
    message = [line for line in result.stderr.splitlines() if "the loss became NaN or Inf" in line]
    assert message and re.search(r"after global step \d+", message[0]), result.stderr[-3000:]
    reader = tf.train.load_checkpoint(str(tmp_path))
    assert reader.get_tensor("global_step") == 0  # only the initial checkpoint; no NaN one
    assert tf.reduce_all(tf.math.is_finite(reader.get_tensor("mlp/hidden0/kernel")))


def test_a_bad_record_stops_training_naming_its_file_and_index(tmp_path):
    path = write_embedded_as_tfrecord(tmp_path / "data", bad_label_at=7)[0]
    result = run_trainer(f"--model_dir={tmp_path / 'model'}", "--dataset=tfrecord",
                         f"--data_dir={tmp_path / 'data'}", "--train_steps=20")
    assert result.returncode == 1
    expected = (f": bad input record: {path} record 7: 'label' is 12, outside 0..9 "
                "(--skip_bad_records skips such records, logging each)")
    assert any(line.endswith(expected) for line in result.stderr.splitlines()), result.stderr[-3000:]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("input_queue", [True, False])
def test_skip_bad_records_trains_on_the_rest_and_logs_the_skip(make_cluster, tmp_path, input_queue):
    path = write_embedded_as_tfrecord(tmp_path / "data", bad_label_at=7)[0]
    cluster = make_cluster(num_ps=1, num_workers=2, trainer_args=[
        "--dataset=tfrecord", f"--data_dir={tmp_path / 'data'}", "--skip_bad_records", "--train_steps=60",
        "--input_queue" if input_queue else "--noinput_queue"])
    cluster.start_all()
    assert cluster.wait(timeout=TIMEOUT) == {("ps", 0): 0, ("worker", 0): 0, ("worker", 1): 0}, describe(cluster)
    skipped = f"skipped bad record 1 (so far, this worker): BadRecord: {path} record 7: 'label' is 12"
    logs = [cluster.log("worker", index) for index in (0, 1)]
    if input_queue:  # the file goes to one worker at a time, epoch after epoch: whoever reads it skips record 7
        skips = [line for log in logs for line in log.splitlines() if "skipped bad record" in line]
        assert any(skipped in line for line in skips), describe(cluster)
        assert all(f"BadRecord: {path} record 7: 'label' is 12" in line for line in skips), skips
    else:  # one file, two workers: records are split by index, so record 7 is worker 1's to skip
        assert skipped in logs[1] and "skipped bad record" not in logs[0]
    assert int(finished(logs[0])["global_step"]) >= 60


def test_per_host_scripts_run_a_cluster(tmp_path):
    ps_port, worker_port = free_ports(2)
    env = {**os.environ, "PYTHON": sys.executable, "LOG_DIR": str(tmp_path / "logs"),
           "PS_HOSTS": f"127.0.0.1:{ps_port}", "WORKER_HOSTS": f"127.0.0.1:{worker_port}",
           "MODEL_DIR": str(tmp_path / "model")}
    fast = ["--train_steps=100", "--synthetic_examples=2000"]
    procs = [subprocess.Popen([str(SCRIPTS / script), "--task_index=0", *fast], env=env,
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
             for script in ("run_ps.sh", "run_worker.sh")]
    try:
        codes = [proc.wait(timeout=TIMEOUT) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
    worker_log = (tmp_path / "logs" / "worker-0.log").read_text()
    assert codes == [0, 0], worker_log[-3000:]
    assert "logging to" in procs[0].stdout.read()
    assert int(finished(worker_log)["global_step"]) == 100
    assert "every training replica finished" in (tmp_path / "logs" / "ps-0.log").read_text()


def test_the_local_launcher_runs_and_summarizes(tmp_path):
    result = run_launcher(
        [sys.executable, str(SCRIPTS / "run_local.py"), f"--run_dir={tmp_path}", "--",
         "--train_steps=150", "--log_every_n_steps=50", "--synthetic_examples=2000",
         f"--model_dir={tmp_path / 'mine'}"], timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    # The model_dir it names is the one the trainer was given, and holds the final checkpoint.
    assert f"checkpoints and summaries in {tmp_path / 'mine'}\n" in result.stdout, result.stdout
    assert re.search(r"model\.ckpt-15\d$", tf.train.latest_checkpoint(str(tmp_path / "mine")))
    # The figure a newcomer reads first is the held-out one, labelled as such.
    assert re.search(r"summary: final step 15\d, held-out loss [\d.]+, held-out accuracy [\d.]+ \(final "
                     r"checkpoint\); last batch loss [\d.]+, accuracy [\d.]+; wall time", result.stdout)
    for task in ("ps 0", "worker 0", "worker 1"):
        assert f"{task}: exit 0" in result.stdout
    assert_gone(re.findall(r"\(pid (\d+)\)", result.stdout), expected=3)


def test_the_local_launcher_stops_everything_on_ctrl_c(tmp_path):
    launcher = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "run_local.py"), f"--run_dir={tmp_path}", "--",
         "--train_steps=100000", "--synthetic_examples=2000"],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
        # As from a shell's background job: SIGINT arrives ignored, and Ctrl-C must still work.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    output = ""
    try:
        wait_for(lambda: "first step done" in _read(tmp_path / "worker-0.log") or launcher.poll() is not None,
                 TIMEOUT, "the chief's first step under the launcher")
        assert launcher.poll() is None, "the launcher ended before its chief's first step"
        launcher.send_signal(signal.SIGINT)
        output, _ = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:  # a failed test still stops everything, by process id
            os.killpg(launcher.pid, signal.SIGKILL)
            output, _ = launcher.communicate(timeout=30)
            for pid in map(int, re.findall(r"\(pid (\d+)\)", output)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
    assert launcher.returncode == exit_codes.INTERRUPTED, output
    assert "SIGINT: stopped every task (3)" in output
    assert_gone(re.findall(r"\(pid (\d+)\)", output), expected=3)


def _read(path):
    return path.read_text(errors="replace") if path.exists() else ""


def assert_gone(pids, expected):
    assert len(pids) == expected
    for pid in map(int, pids):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_tf_config_cluster_with_an_evaluator_as_tensorboard_shows_it(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=1, chief=True, tf_config=True,
                           # In sync the chief takes every step, so its summaries draw the whole curve: in
                           # async, with its profile pausing it, the worker could take nearly all of them.
                           trainer_args=["--save_summaries_steps=20", "--profile_steps=20,25", "--sync_replicas"])
    cluster.start_all()
    # Flags of its own that disagree with the run: it follows the run's record in model_dir instead.
    cluster.start("evaluator", 0, ["--train_steps=50", "--hidden_units=8"])
    exits = wait_recording_exits(cluster, TIMEOUT)
    assert all(code == 0 for code, _ in exits.values()), describe(cluster)
    chief_log = cluster.log("chief", 0)
    assert "cluster from TF_CONFIG" in chief_log and "this task: chief:0 (chief)" in chief_log
    assert int(finished(chief_log)["global_step"]) >= 200
    assert int(finished(cluster.log("worker", 0))["local_steps"]) >= 190  # a round each: sync
    evaluator_log = cluster.log("evaluator", 0)
    assert "evaluated the final step's checkpoint" in evaluator_log
    assert "following the run in " in evaluator_log and "--train_steps=200 --hidden_units=256" in evaluator_log
    assert int(re.findall(r"evaluator: step (\d+):", evaluator_log)[-1]) == 200

    # What a person sees in TensorBoard, read from its HTTP API.
    with tensorboard(cluster.model_dir) as get:
        tags = get("/data/plugin/scalars/tags")

        def scalars(run, tag):
            return [(step, value) for _, step, value in get(f"/data/plugin/scalars/scalars?run={run}&tag={tag}")]

        assert {".", "eval", "workers/chief_0", "workers/worker_0"} <= set(tags), tags
        assert {"loss", "accuracy", "learning_rate", "gradient_global_norm"} <= set(tags["."]), tags["."]
        for task in ("chief_0", "worker_0"):
            assert {"examples/sec", "global_step/sec"} <= set(tags[f"workers/{task}"])
            assert all(value > 0 for _, value in scalars(f"workers/{task}", "examples/sec"))
        assert {round(value, 6) for _, value in scalars(".", "learning_rate")} == {0.05}
        losses = [value for _, value in scalars(".", "loss")]
        assert len(losses) >= 6, losses
        third = len(losses) // 3
        assert sum(losses[-third:]) / third < sum(losses[:third]) / third, losses  # means, never one batch
        held_out = scalars("eval", "accuracy")
        assert held_out[-1][0] >= 200 and held_out[-1][1] > 0.3, held_out  # chance: 0.1
    # The traces TensorBoard's profile plugin lists (the plugin is not installed here: see docs/outputs.md).
    for task in ("chief_0", "worker_0"):
        assert list((cluster.model_dir / "profile" / task).glob("plugins/profile/*/*.xplane.pb")), task


def test_sigterm_to_the_chief_saves_a_checkpoint_and_a_restart_resumes_from_it(make_cluster):
    # --worker_gone_secs: the ps stops waiting for worker 1 (refused below) soon after the chief is done.
    cluster = make_cluster(num_ps=1, num_workers=2, trainer_args=["--train_steps=100000",
                                                                  "--save_checkpoint_steps=1000000",
                                                                  "--worker_gone_secs=3"])
    cluster.start("ps", 0)
    cluster.start("worker", 0)  # the chief trains alone (async); worker 1 comes later
    wait_for(lambda: logged_step(cluster.log("worker", 0)) >= 100, TIMEOUT, "the chief's global step 100", cluster)
    # A worker started with a model flag of its own stops before its first step, naming both values: its
    # steps would have updated the chief's variables through another graph.
    cluster.start("worker", 1, ["--hidden_units=128"])
    assert cluster.procs[("worker", 1)].wait(timeout=TIMEOUT) == exit_codes.BAD_FLAGS.code, describe(cluster)
    other, = lines_with(cluster.log("worker", 1), "the chief trains with")
    assert other.endswith("worker:1: --hidden_units=128: the chief trains with --hidden_units=256 (run.json in "
                          "--model_dir): every worker needs the chief's model and data flags; start this one with them")
    # A second run started on the model_dir meanwhile stops before it touches it, naming the chief there.
    saved_before = sorted(p.name for p in cluster.model_dir.iterdir())
    second = run_trainer(f"--model_dir={cluster.model_dir}", "--train_steps=50", timeout=TIMEOUT)
    assert second.returncode == exit_codes.MODEL_DIR_IN_USE.code, second.stderr[-3000:]
    in_use, = lines_with(second.stderr, "is in use: the chief of another run trains there")
    assert f"at {cluster.worker_hosts[0]}, pid {cluster.procs[('worker', 0)].pid} on host" in in_use
    assert sorted(p.name for p in cluster.model_dir.iterdir()) == saved_before
    cluster.kill("worker", 0, signal.SIGTERM)
    assert cluster.procs[("worker", 0)].wait(timeout=60) == exit_codes.PREEMPTED, describe(cluster)
    log = cluster.log("worker", 0)
    stopped_at, saved = re.search(r"preempted at global step (\d+) \(the chief saved a checkpoint of global step "
                                  r"(\d+):", log).groups()
    step = int(saved)
    assert step == int(stopped_at) > 100  # the chief alone: nobody steps between the save and the line
    assert tf.train.load_checkpoint(str(cluster.model_dir)).get_tensor("global_step") == step
    assert cluster.procs[("ps", 0)].poll() is None  # training is not over: the ps keeps serving

    cluster.start("worker", 0, ["--train_steps=" + str(step + 50)])
    assert cluster.procs[("worker", 0)].wait(timeout=TIMEOUT) == 0, describe(cluster)
    resumed_at = log_lines.first_steps(cluster.log("worker", 0))[-1].step
    assert int(resumed_at) == step + 1
    assert cluster.wait("ps", timeout=60) == {("ps", 0): 0}
