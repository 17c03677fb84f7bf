"""Faults: tasks killed with SIGKILL and restarted, a dead sync worker, the chief killed during
checkpoint saves, peers that are not up yet. Each run goes through scripts/inject_fault.py, as a
user would run it, and checks its report."""

import glob
import json
import logging
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
import tensorflow as tf

from ps_trainer.cluster import peers, shutdown
from ps_trainer.launch import faults
from tests.support import (ROOT, SCRIPTS, FakeClock, describe, finished, logged_step, run_launcher, run_program,
                           tf_session, wait_for, write_numbered_csvs)
from ps_trainer.training import checkpoints, exit_codes, log_lines, session_loop, watchdog

TRAIN_STEPS = 300
LN10 = 2.3026


def inject(tmp_path, *args, trainer_args=(), timeout_secs=240, train_steps=TRAIN_STEPS):
    """Runs the fault script; returns its JSON report (and asserts the script said it went right).
    The script gives up timeout_secs after its chaos, if any; keep the sum below the test's own timeout."""
    report_path = tmp_path / "report.json"
    chaos_secs = sum(float(arg.split("=", 1)[1]) for arg in args if arg.startswith("--chaos_secs="))
    result = run_launcher(
        [sys.executable, str(SCRIPTS / "inject_fault.py"), f"--run_dir={tmp_path / 'run'}",
         f"--report_json={report_path}", f"--train_steps={train_steps}", f"--timeout_secs={timeout_secs}", *args,
         "--", "--synthetic_examples=8000", *trainer_args],
        timeout=chaos_secs + timeout_secs + 40)
    assert result.returncode == 0 and report_path.exists(), result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(report_path.read_text())


def check_recovered(report, workers=2, steps_per_push=1, train_steps=TRAIN_STEPS):
    assert report["ok"] and report["finished"]
    assert report["exit_codes"] == {"ps 0": 0, **{f"worker {i}": 0 for i in range(workers)}}
    # Async: each other worker's last push may land past the last step.
    assert train_steps <= report["final_step"] <= train_steps + workers * steps_per_push
    # Every tensor of the final checkpoint reads. The chief saves it at its own last step: another
    # worker's push can still land after that save (async), so it may hold a step or two fewer.
    assert train_steps <= report["restored_step"] <= report["final_step"]
    # The global step never fell back past the checkpoint there was at the kill.
    assert report["lowest_step_after"] > report["checkpoint_at_kill"]
    # The model learned through the fault: the chief's held-out evaluation of the final checkpoint
    # (chance would be ln 10). Not the progress lines after the recovery: under load there can be none.
    assert report["heldout_loss"] is not None and report["heldout_loss"] < 0.8 * LN10, report


@pytest.mark.e2e
@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
def test_a_killed_worker_restarts_and_rejoins(tmp_path, sync):
    # Sync: back 5 s after the kill, past the 3 s after which the chief says why it waits.
    report = inject(tmp_path, "--kill=worker:1", "--at_step=100", *(["--restart_delay_secs=5"] if sync else []),
                    trainer_args=["--sync_replicas", "--stall_warning_secs=3"] if sync else [])
    check_recovered(report)
    if sync:  # the chief waited for it, saying why, and resumed when it came back
        chief_log = (tmp_path / "run" / "worker-0.log").read_text()
        assert re.search(r"no training step completed for [3-9] s; in sync mode every step needs gradients "
                         "from all 2 workers", chief_log)


@pytest.mark.e2e
@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
def test_a_killed_chief_restarts_and_carries_on_from_the_live_state_on_the_ps(tmp_path, sync):
    # No checkpoint but step 0's before the kill: the ps is far past it (sync: accumulators and tokens too).
    report = inject(tmp_path, "--kill=chief", "--at_step=100", "--save_checkpoint_steps=1000",
                    trainer_args=["--sync_replicas"] if sync else [])
    check_recovered(report)
    chief_log = (tmp_path / "run" / "worker-0.log").read_text()
    # The ps kept every variable: the restarted chief takes them as they are, at a step no older than
    # the kill's (sync: the rounds go on where they were), instead of restoring an older checkpoint.
    kept = re.findall(r"the ps tasks hold every variable already, at global step (\d+)", chief_log)
    assert len(kept) == 1 and int(kept[0]) >= report["killed_at_step"] - 2, chief_log[-3000:]
    assert report["lowest_step_after"] >= report["killed_at_step"] - 2
    other_log = (tmp_path / "run" / "worker-1.log").read_text()
    assert "Traceback" not in other_log  # it carried on (async) or waited (sync); it never failed


@pytest.mark.e2e
@pytest.mark.parametrize("trainer_args", [["--local_steps=1"], ["--local_steps=10"],
                                          ["--local_steps=10", "--model=wide_deep", "--dataset=clicks"]],
                         ids=["plain", "local_steps", "rounds_of_rows"])
def test_a_killed_ps_restarts_and_the_chief_restores_onto_it(tmp_path, trainer_args):
    # With --local_steps the workers' copies are refilled from the restored variables; with hashed tables,
    # a round cut by the kill pushes nothing, and the next reads its rows from the restored tables.
    local_steps = int(trainer_args[0].split("=")[1])
    # The kill lands mid-run, not in the chief's final save: the fault script sees step 100 in the logs a poll
    # later, and rounds of local steps can reach 300 within it. A ps lost in that save ends the chief 138 for its
    # orchestrator to restart, and this script restarts only the ps.
    train_steps = 1000 if local_steps > 1 else TRAIN_STEPS
    report = inject(tmp_path, "--kill=ps:0", "--at_step=100", trainer_args=trainer_args, train_steps=train_steps)
    check_recovered(report, steps_per_push=local_steps, train_steps=train_steps)
    chief_log = (tmp_path / "run" / "worker-0.log").read_text()
    if "--model=wide_deep" in trainer_args:
        # Two classes: check_recovered's bar is ten classes' chance. Measured: 0.69-0.71, and 0.65 where
        # the other worker trained alone from checkpoint 0, 7 epochs of its shard; chance is 0.5.
        assert float(finished(chief_log)["heldout_auc"]) > 0.6, finished(chief_log)
    # It restores the latest checkpoint: the one registered when the ps came back (a save in flight at the kill
    # may have been registered just after it; CI once saw checkpoint 0 at the kill and a newer one restored).
    after_error = chief_log.split("An error was raised")[-1]
    restored = re.findall(r"Restoring parameters from .*model\.ckpt-(\d+)", after_error)
    assert restored[:1] == [str(report["checkpoint_at_restart"])], after_error[-3000:]  # (then the export's)
    assert report["checkpoint_at_kill"] <= report["checkpoint_at_restart"]


@pytest.mark.e2e
def test_a_ps_paused_longer_than_a_call_may_wait_goes_on_and_every_task_ends_at_the_last_step(tmp_path):
    # 12 s: past the 10 s a worker's call to ps 0 may take (input/work_queue.CALL_TIMEOUT_MS). Nothing is
    # restarted: the workers wait, or make their sessions again, and go on where the ps was.
    report = inject(tmp_path, "--kill=ps:0", "--at_step=100", "--pause_secs=12")
    check_recovered(report)
    assert report["fault"] == "paused for 12 s (SIGSTOP, then SIGCONT)"
    for index in (0, 1):
        assert "exit 138" not in (tmp_path / "run" / f"worker-{index}.log").read_text()


@pytest.mark.e2e
def test_killing_the_chief_during_saves_never_leaves_a_checkpoint_that_fails_to_restore(tmp_path):
    report = inject(tmp_path, "--during_saves=2", "--seed=1", "--train_steps=40")
    assert report["clean"], report
    assert any(r["hit_save"] for r in report["rounds"])  # kills land inside a save
    for round_ in report["rounds"]:
        assert round_["restored"] == round_["registered"] is not None
    assert report["checkpoints_kept"] <= report["keep_checkpoint_max"] and report["leftovers_at_end"] == 0


@pytest.mark.e2e
def test_a_sync_worker_that_stays_dead_makes_the_others_exit_with_a_clear_message(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=2, trainer_args=[
        "--sync_replicas", "--train_steps=100000", "--stall_warning_secs=2", "--stall_timeout_secs=8"])
    cluster.start_all()
    wait_for(lambda: logged_step(cluster.log("worker", 0)) >= 50, 240, "the chief's global step 50", cluster)
    cluster.kill("worker", 1)
    assert cluster.wait("worker", timeout=60) == {("worker", 0): exit_codes.STALLED.code,
                                                  ("worker", 1): -9}, describe(cluster)
    assert exit_codes.kind(exit_codes.STALLED.code) == exit_codes.TRANSIENT  # Kubeflow's ExitCode policy restarts it
    log = cluster.log("worker", 0)
    assert re.search(r"no training step completed for [2-7] s; in sync mode every step needs gradients from all 2",
                     log)
    assert f"Giving up (--stall_timeout_secs=8): exit {exit_codes.STALLED.code}" in log


@pytest.mark.e2e
def test_a_chief_that_ends_in_a_permanent_error_ends_its_ps_and_workers_with_its_reason(make_cluster, tmp_path):
    data_dir = tmp_path / "data"
    write_numbered_csvs(data_dir, (6000, 6000), eval_rows=200)
    chief_file = data_dir / "train-00.csv"  # fixed shards: the chief's file alone
    lines = chief_file.read_text().splitlines()
    lines[5000] = "4999,0.5"  # two fields where the header has four: ~300 steps after the chief's first
    chief_file.write_text("\n".join(lines) + "\n")
    cluster = make_cluster(num_ps=1, num_workers=2, evaluator=True, trainer_args=[
        "--dataset=csv", f"--data_dir={data_dir}", "--numeric_columns=x1,x2", "--model=wide_deep",
        "--hidden_units=8", "--noinput_queue", "--shuffle_buffer=1", "--batch_size=16", "--train_steps=1000000",
        "--log_every_n_steps=10", "--stall_timeout_secs=600", "--eval_timeout_secs=600"])
    cluster.start_all()
    # The chief holds still (short of its bad record) until worker 1 trains too: then both are mid-run.
    wait_for(lambda: log_lines.first_steps(cluster.log("worker", 0)), 180, "the chief's first step", cluster)
    cluster.kill("worker", 0, signal.SIGSTOP)
    try:
        wait_for(lambda: log_lines.first_steps(cluster.log("worker", 1)), 180, "worker 1's first step", cluster)
    finally:
        cluster.kill("worker", 0, signal.SIGCONT)
    assert set(cluster.wait(timeout=0).values()) == {None}, describe(cluster)
    chief = cluster.procs[("worker", 0)]
    assert chief.wait(timeout=180) == exit_codes.BAD_DATA.code, describe(cluster)
    reason = "train-00.csv record 5000"
    assert reason in cluster.log("worker", 0)
    # Within their mark checks (MARK_CHECK_SECS each), not --stall_timeout_secs nor --eval_timeout_secs.
    assert cluster.wait(timeout=60) == {("ps", 0): 1, ("worker", 0): 1, ("worker", 1): 1, ("evaluator", 0): 1}, (
        describe(cluster))
    ended = "the chief ended in a permanent error, so nothing more will train; exiting with it: worker:0:"
    for job, index in (("ps", 0), ("worker", 1), ("evaluator", 0)):
        line = next(line for line in cluster.log(job, index).splitlines() if ended in line)
        assert reason in line, line


@pytest.mark.e2e
def test_a_worker_started_before_its_ps_waits_for_it_then_trains(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=1, trainer_args=["--train_steps=50"])
    cluster.start("worker", 0)
    wait_for(lambda: "waiting for ps 0 at" in cluster.log("worker", 0), 60, "the worker to wait for its ps", cluster)
    cluster.start("ps", 0)
    assert cluster.wait(timeout=240) == {("worker", 0): 0, ("ps", 0): 0}, describe(cluster)
    assert f"waiting for ps 0 at {cluster.ps_hosts[0]} (retrying for up to" in cluster.log("worker", 0)


@pytest.mark.e2e
def test_the_fault_script_imports_no_tensorflow_of_its_own():
    # Its tasks are forked from a server that has imported the trainer; its checkpoint reads run in a
    # helper forked from that server (launch/checkpoint_reads.py): 3-4 s of CPU less a drill.
    result = subprocess.run([sys.executable, "-X", "importtime", str(SCRIPTS / "inject_fault.py"), "--helpshort"],
                            capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert "--chaos_secs" in result.stdout, result.stderr[-2000:]  # its help (absl exits 1 after it)
    imported = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:")]
    assert "ps_trainer.launch.faults" in imported and "ps_trainer.launch.chaos" in imported, imported
    assert not [name for name in imported if name.split(".")[0] == "tensorflow"], imported


HELPER_PROBE = """
import multiprocessing, sys, time
from ps_trainer.launch import forked
forked.ForkedTask._start_server(multiprocessing.get_context("forkserver"))  # as the first forked task does
print(forked.call_with_tensorflow("ps_trainer.launch.checkpoint_reads", "registered_step", sys.argv[1]))
print("tensorflow here:", "tensorflow" in sys.modules)
forked.HELPER_CALL_SECS = 2
started = time.monotonic()
try:
    forked.call_with_tensorflow("time", "sleep", 30)
except forked.HelperTimeout as err:
    print(f"after {time.monotonic() - started:.0f} s: {err}")
"""


@pytest.mark.e2e
def test_the_tensorflow_helper_answers_and_a_call_it_never_answers_fails_naming_it(tmp_path):
    result = subprocess.run([sys.executable, "-c", HELPER_PROBE, str(tmp_path)], capture_output=True, text=True,
                            timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    # No checkpoint in tmp_path yet, read in the helper, not here; the stuck call given up after 2 s.
    assert result.stdout.splitlines() == [
        "None", "tensorflow here: False",
        "after 2 s: time.sleep(30): no answer from the TensorFlow helper in 2 s"], result.stdout + result.stderr[-2000:]


@pytest.mark.e2e
def test_a_ps_that_never_comes_up_is_named_after_the_timeout(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=1, trainer_args=["--startup_timeout_secs=3"])
    cluster.start("worker", 0)
    # Transient: a restart once the ps is up may succeed.
    assert cluster.wait(timeout=120) == {("worker", 0): exit_codes.PS_UNREACHABLE.code}, describe(cluster)
    assert (f"worker:0: ps 0 at {cluster.ps_hosts[0]} not reachable after 3 s (--startup_timeout_secs=3); "
            "is that task running") in cluster.log("worker", 0)


@pytest.mark.drill
@pytest.mark.e2e
@pytest.mark.timeout(420)
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_random_kills_of_any_task_end_trained_to_the_last_step(tmp_path, mode):
    # Sync chaos found the faults of issue 10 one by one; it is in the suite since it passed a
    # 15-minute soak (inject_fault.py --chaos_secs=900 --num_ps=2 -- --sync_replicas). Four kills at
    # global steps drawn between 10% and 60% of the run (--seed=3), each once the last one's task is
    # restarted: the count does not depend on how fast the machine trains, as kills by the clock did.
    # Sync stops while a task is down; async trains on (one worker killed, the other goes on through its
    # restart delay of up to 3 s), so its last 40% must outlast four restarts in a row.
    steps = 1000 if mode == "sync" else 3000
    report = inject(tmp_path, "--chaos_kills=4", "--num_ps=2", "--seed=3", f"--train_steps={steps}", timeout_secs=300,
                    trainer_args=["--sync_replicas"] if mode == "sync" else [])
    assert report["ok"] and report["violations"] == [], report
    assert len(report["kills"]) == 4, report
    assert set(report["exit_codes"].values()) == {0} and report["left_running"] == []
    assert all(step >= steps for step in report["finished_steps"].values())
    assert not report["checkpoints_went_back"] and report["restored_step"] >= steps


@pytest.mark.e2e
def test_two_ps_killed_in_a_row_in_sync_mode_still_train_to_the_last_step_with_clocks_minutes_apart(make_cluster):
    # Once seen: the token queue closed while a ps was down, every worker "finished" at once, 10,600
    # steps short, and the ps tasks exited 0 after them. And the wake tokens of a failed aggregation
    # once carried the chief's wall clock, which a worker whose clock ran ahead took for old: here
    # the chief runs 5 minutes behind the ps tasks and the other worker 5 minutes ahead (libfaketime).
    cluster = make_cluster(num_ps=2, num_workers=2, trainer_args=[
        "--sync_replicas", "--train_steps=400", "--log_every_n_steps=10", "--save_checkpoint_steps=50"])
    library = next(iter(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1")), None)
    for index, shift in ((0, "-5m"), (1, "+5m")) if library else ():
        cluster.env_of_task[("worker", index)] = {"LD_PRELOAD": library, "FAKETIME": shift}
    cluster.start_all()
    deadline = time.monotonic() + 240
    for ps in (0, 1):
        def highest_step():
            return max((s.step for s in faults.progress(cluster)), default=0)
        reached = highest_step() + 30
        wait_for(lambda r=reached: highest_step() >= r, deadline - time.monotonic(), f"global step {reached}", cluster)
        cluster.kill("ps", ps)
        time.sleep(0.5)  # elapsed time is the subject: the ps stays down a moment, as a crashed one does
        cluster.start("ps", ps)
    codes = cluster.wait(timeout=240)
    assert set(codes.values()) == {0}, describe(cluster)
    for index in (0, 1):
        assert int(finished(cluster.log("worker", index))["global_step"]) >= 400, describe(cluster)
    if library:  # the clocks really were 10 minutes apart: each worker's log lines carry its own time
        started = [log_lines.log_time(next(line for line in cluster.log("worker", i).splitlines()
                                           if "cluster from" in line)) for i in (0, 1)]
        assert 9 * 60 < (started[1] - started[0]).total_seconds() < 11 * 60, started


@pytest.mark.e2e
def test_a_worker_waiting_for_the_chief_rides_out_a_ps_that_goes_down_meanwhile(make_cluster, caplog):
    # Seen in the chaos drill: a worker waiting for the chief to restore a restarted ps exited 138
    # when the other ps went down under its poll. Here the waiting worker is this process (its own
    # server), and nobody initializes the variables until the ps has been killed and restarted.
    v1 = tf.compat.v1
    caplog.set_level(logging.INFO, logger="absl")
    cluster = make_cluster(num_ps=1, num_workers=1)
    spec = tf.train.ClusterSpec({"ps": cluster.ps_hosts, "worker": cluster.worker_hosts})
    server = v1.train.Server(spec, job_name="worker", task_index=0)
    deadline = time.monotonic() + 120

    def serving(times):
        return lambda: cluster.log("ps", 0).count(": serving on ") == times

    cluster.start("ps", 0)
    wait_for(serving(1), deadline - time.monotonic(), "the ps to serve", cluster)
    with tf.Graph().as_default() as graph:
        with v1.device("/job:ps/task:0"):
            v1.train.get_or_create_global_step()
        uninitialized, initialize = checkpoints.report_uninitialized(), v1.global_variables_initializer()
        outcome = {}

        def wait():
            try:
                with graph.as_default():
                    outcome["returned"] = session_loop.wait_for_chief_ready(server.target, None, 90, "worker:1",
                                                                      uninitialized)
            except Exception as err:
                outcome["raised"] = err

        waiter = threading.Thread(target=wait, daemon=True)
        waiter.start()
        time.sleep(2)  # elapsed time is the subject: the worker polls uninitialized variables a while first
        cluster.kill("ps", 0)
        cluster.start("ps", 0)
        wait_for(serving(2), deadline - time.monotonic(), "the restarted ps to serve", cluster)
        wait_for(lambda: "did not answer while waiting for the chief" in caplog.text or not waiter.is_alive(),
                 deadline - time.monotonic(), "the waiting worker to meet the restarted ps")
        with tf_session(server.target) as chief:
            chief.run(initialize)
        waiter.join(timeout=60)
    assert outcome == {"returned": None}, outcome


@pytest.mark.e2e
def test_a_ps_restarted_after_the_workers_finished_exits_on_their_marks(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=2, trainer_args=["--train_steps=60", "--export_saved_model=false"])
    cluster.start_all()
    assert set(cluster.wait(timeout=240).values()) == {0}, describe(cluster)
    # Restarted now, its done queue is new and empty, and no worker is left to report to it.
    cluster.start("ps", 0)
    assert cluster.wait("ps", timeout=60) == {("ps", 0): 0}, describe(cluster)
    assert "training replica(s) [0, 1] finished (marked in model_dir)" in cluster.log("ps", 0)
    # A rerun to a larger --train_steps does not take the old marks for its own: the ps waits.
    cluster.start("ps", 0, ["--train_steps=400"])
    # Its third start: once it serves (and handles SIGTERM), it reads the marks every MARK_CHECK_SECS.
    wait_for(lambda: cluster.log("ps", 0).count(": serving on ") == 3, 120, "the ps's third start", cluster)
    time.sleep(shutdown.MARK_CHECK_SECS + 1)  # elapsed time is the subject: its mark checks find nothing to end on
    assert cluster.wait("ps", timeout=0.1) == {("ps", 0): None}, describe(cluster)
    cluster.kill("ps", 0, signal.SIGTERM)
    assert cluster.wait("ps", timeout=30) == {("ps", 0): exit_codes.PREEMPTED}


# ---------------------------------------------------------------- the pieces, without processes

@pytest.mark.pure
def test_wait_for_peers_backs_off_and_gives_up_naming_the_missing():
    clock, probes = FakeClock(), []
    up = {"ps 0": True, "ps 1": False}

    def probe(address):
        probes.append((clock.now, address))
        return up["ps 0" if address == "a:1" else "ps 1"]

    with pytest.raises(peers.PeersUnreachable, match=r"ps 1 at b:2 not reachable after 30 s"):
        peers.wait_for_peers({"ps 0": "a:1", "ps 1": "b:2"}, 30, "worker:0", probe, clock)
    gaps = [b - a for (a, _), (b, _) in zip(probes[1:], probes[2:])]
    assert gaps[:3] == pytest.approx([0.2, 0.4, 0.8]) and max(gaps) == peers.MAX_BACKOFF_SECS  # doubling, capped
    assert [address for _, address in probes].count("a:1") == 1  # a peer that is up is not probed again


@pytest.mark.inprocess
def test_a_worker_whose_chief_never_initializes_the_variables_exits_chief_not_ready_at_its_startup_timeout(caplog):
    caplog.set_level("INFO", logger="absl")
    clock = FakeClock()
    with tf.Graph().as_default():
        tf.compat.v1.get_variable("weights", [2], initializer=tf.compat.v1.zeros_initializer())
        uninitialized = checkpoints.report_uninitialized()
        with pytest.raises(exit_codes.Failure, match=re.escape(
                "worker:1: the chief did not initialize the variables within 30 s (--startup_timeout_secs); "
                "is the chief task running?")) as raised:
            session_loop.wait_for_chief_ready("", None, 30, "worker:1", uninitialized, clock=clock)
    assert raised.value.outcome is exit_codes.CHIEF_NOT_READY
    # It polled every CHIEF_POLL_SECS until the timeout had passed, saying so every 10 s.
    assert set(clock.sleeps) == {session_loop.CHIEF_POLL_SECS} and 30 < clock.now <= 30 + session_loop.CHIEF_POLL_SECS
    assert caplog.text.count("worker:1: waiting for the chief to initialize 1 variables") == 3, caplog.text


@pytest.mark.pure
def test_the_stall_watchdog_warns_resets_on_progress_and_exits_at_the_timeout():
    clock, exits = FakeClock(), []
    dog = watchdog.StallWatchdog("worker:0", "a peer is down", 10, 30, clock=clock, exit_process=exits.append)
    warned = 0.0
    for _ in range(25):  # 25 s stalled: two warnings, no exit
        clock.sleep(1)
        warned = dog.check(warned)
    assert warned == 20 and not exits
    dog.after_run(None, None)  # a step completed
    warned = dog.check(warned)
    assert warned == 0
    for _ in range(30):
        clock.sleep(1)
        warned = dog.check(warned)
    assert exits == [exit_codes.STALLED.code]


@pytest.mark.pure
def test_files_of_unfinished_saves_are_removed_and_registered_ones_kept(tmp_path):
    for step in (10, 20, 30):
        for suffix in (".index", ".data-00000-of-00001", ".meta"):
            (tmp_path / f"model.ckpt-{step}{suffix}").write_bytes(b"x")
    (tmp_path / "model.ckpt-40_temp").mkdir()
    (tmp_path / "model.ckpt-40_temp" / "part-00000-of-00002.index").write_bytes(b"x")
    (tmp_path / "checkpoint.tmp8f3a").write_text("")
    (tmp_path / "events.out.tfevents.1").write_bytes(b"x")
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-20"\n'
                                         'all_model_checkpoint_paths: "model.ckpt-10"\n'
                                         'all_model_checkpoint_paths: "model.ckpt-20"\n')
    removed = checkpoints.remove_interrupted_saves(str(tmp_path), "worker:0")
    assert removed == ["checkpoint.tmp8f3a", "model.ckpt-30.data-00000-of-00001", "model.ckpt-30.index",
                       "model.ckpt-30.meta", "model.ckpt-40_temp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint", "events.out.tfevents.1", *sorted(f"model.ckpt-{s}{x}" for s in (10, 20)
                                                       for x in (".data-00000-of-00001", ".index", ".meta"))]


@pytest.mark.inprocess
def test_the_chief_restores_only_lost_state_and_then_clears_what_a_restore_makes_wrong(tmp_path):
    v1 = tf.compat.v1
    with tf.Graph().as_default():
        step = v1.train.get_or_create_global_step()
        weights = v1.get_variable("w", initializer=[1.0, 2.0])
        marks = v1.Variable([-1, -1], collections=[], name="marks")  # as SyncReplicasHook's pushed rounds
        v1.add_to_collection(checkpoints.RESET_BEFORE_RESTORE, lambda sess: sess.run(marks.initializer))
        saver = checkpoints.LiveStateSaver(checkpoints.report_uninitialized())
        with tf_session() as sess:
            sess.run([v1.global_variables_initializer(), marks.initializer])
            sess.run(step.assign(7))  # after the initializer: in one run their order is not defined
            path = saver.save(sess, str(tmp_path / "model.ckpt"), global_step=step)
            sess.run([step.assign(9), marks.assign([9, 9])])
            saver.restore(sess, path)  # every variable is there: the live state stays
            assert sess.run(step) == 9 and sess.run(marks).tolist() == [9, 9]
        with tf_session() as sess:  # as after a ps restart: the variables are gone
            sess.run(marks.initializer)
            sess.run(marks.assign([7, 7]))
            saver.restore(sess, path)
            assert sess.run(step) == 7 and sess.run(weights).tolist() == [1.0, 2.0]
            assert sess.run(marks).tolist() == [-1, -1]


PREEMPTION_PROBE = """
import os, signal, sys, time
from ps_trainer.training import preemption
stop = preemption.Preemption("worker:0", deadline_secs=1).install()
signal.signal(signal.SIGUSR1, lambda *_: None)  # another handled signal writes to the wakeup fd too
os.kill(os.getpid(), signal.SIGUSR1)
time.sleep(0.5)  # elapsed time is the subject: the watcher had its chance to take SIGUSR1 for a stop
print("after SIGUSR1:", stop.requested.is_set(), flush=True)
os.kill(os.getpid(), signal.SIGTERM)
stop.requested.wait(5)
print("after SIGTERM:", stop.requested.is_set(), flush=True)
time.sleep(30)  # elapsed time is the subject: the watcher's deadline ends the process first
"""


@pytest.mark.e2e
def test_only_a_stop_signal_requests_preemption_and_the_deadline_bounds_the_stop():
    result = run_program(PREEMPTION_PROBE, timeout=60)
    assert result.stdout.splitlines() == ["after SIGUSR1: False", "after SIGTERM: True"], result.stderr[-2000:]
    assert result.returncode == exit_codes.PREEMPTED and "still running 1 s after SIGTERM" in result.stderr


PS_GONE_PROBE = """
import os, signal, socket, time
from ps_trainer.training import preemption
ps = socket.create_server(("127.0.0.1", 0))
stop = preemption.Preemption("worker:1", deadline_secs=60, ps_hosts=[f"127.0.0.1:{ps.getsockname()[1]}"]).install()
os.kill(os.getpid(), signal.SIGTERM)
stop.requested.wait(5)
time.sleep(2)  # elapsed time is the subject: with its ps listening, the stopping worker is not ended
print("stopping with the ps listening: still running", flush=True)
print(f"ps closed at {time.monotonic()}", flush=True)
ps.close()
time.sleep(60)  # elapsed time is the subject: the watcher sees the ps gone and ends the process first
"""


@pytest.mark.e2e
def test_a_worker_told_to_stop_exits_at_once_when_its_ps_stops_listening():
    result = run_program(PS_GONE_PROBE, timeout=90)
    ended = time.monotonic()  # the system's monotonic clock: the probe's too
    lines = result.stdout.splitlines()
    assert lines[:1] == ["stopping with the ps listening: still running"] and len(lines) == 2, result.stderr[-2000:]
    assert result.returncode == exit_codes.PREEMPTED and "no longer listens (the job is ending)" in result.stderr
    # Counted from the ps's close, not from the start (a loaded machine takes seconds to import the probe's
    # modules): long before the 60 s deadline.
    assert ended - float(lines[1].removeprefix("ps closed at ")) < 30
