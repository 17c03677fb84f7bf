"""What the tests share: where the project's programs are, how to run them and read what they wrote,
in-process clusters, and the data files the tests write. Fixtures are in conftest.py."""

import contextlib
import datetime
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np
import tensorflow as tf
from absl.flags import FLAGS

from ps_trainer import input as inputs
from ps_trainer.cluster import spec
from ps_trainer.flags import config as flag_config
from ps_trainer.flags import definitions
from ps_trainer.input import synthetic, tfrecord
from ps_trainer.launch import faults
from ps_trainer.launch.forked import ForkedTask
from ps_trainer.launch.processes import free_ports
from ps_trainer.training import graph as train_graph
from ps_trainer.training import hooks as training_hooks
from ps_trainer.training import evaluator, log_lines, plan, session_loop, start
from ps_trainer.training.config import RunConfig, TrainConfig

definitions.define(FLAGS)  # the trainer's flags, which the tests read as trainer.py does
v1 = tf.compat.v1
ROOT = pathlib.Path(__file__).resolve().parent.parent
TRAINER = ROOT / "trainer.py"
SCRIPTS = ROOT / "scripts"
DATA = ROOT / "tests" / "data"

# Small, fast runs: the defaults of the tests' clusters.
FAST_ARGS = ["--train_steps=200", "--log_every_n_steps=50", "--synthetic_examples=8000",
             "--save_checkpoint_steps=100"]


# ---------------------------------------------------------------- running the programs
def read_flags(*args):
    """Parses trainer.py's command line in-process, as trainer.main does, into a RunConfig: the flags read
    (flags/config.py), then checked against the disk (training/start.py)."""
    FLAGS.unparse_flags()
    argv = FLAGS(["trainer.py", *args])
    return start.settle(flag_config.read(FLAGS, argv))


def run_trainer(*args, timeout: float = 120, env=None, preload=True) -> subprocess.CompletedProcess:
    """trainer.py in a process of its own, run to its end (env: variables added to this one's).

    The process is forked from one that has imported the trainer (launch.forked.ForkedTask);
    preload=False starts a new Python, as a user's shell does, for what happens before main runs."""
    command = [sys.executable, str(TRAINER), *args]
    env = {**os.environ, **(env or {})}
    if not preload:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              env=env, cwd=ROOT)
    return _run_forked(command[1:], env, ROOT, timeout, program=False)


def run_program(program, *args, timeout: float = 300, cwd=ROOT, env=None) -> subprocess.CompletedProcess:
    """A user's program (a file, or a str of Python code, which is written to a file for it) run to its end as
    `python program args...` does (env: variables added to this one's).

    It is forked from a process that has imported TensorFlow alone (ForkedTask with program=True), as the
    program's own first import does: it skips the 3-4 s of CPU of a new Python's `import tensorflow`.
    test_e2e shows a forked program and a new Python end alike; a test of what happens before the program
    imports TensorFlow (its environment at start, the order of its imports) starts a new Python."""
    env = {**os.environ, **(env or {})}
    with tempfile.TemporaryDirectory() as folder:
        if isinstance(program, str):
            code, program = program, pathlib.Path(folder, "program.py")
            program.write_text(code)
        return _run_forked([str(program), *map(str, args)], env, cwd, timeout, program=True)


def _run_forked(argv, env, cwd, timeout: float, program: bool) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as captured:
        out, err = pathlib.Path(captured, "stdout"), pathlib.Path(captured, "stderr")
        task = ForkedTask(argv, env, out, err, cwd=cwd, program=program)
        try:
            code = task.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(task.pid, signal.SIGKILL)
            task.wait(timeout=30)
            raise
        return subprocess.CompletedProcess([sys.executable, *argv], code, out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))


def run_script(name: str, *args, timeout: float = 300) -> subprocess.CompletedProcess:
    """A script that starts no cluster (a generator, a converter) run to its end, as run_program runs a program."""
    return run_program(SCRIPTS / name, *args, timeout=timeout)


def run_launcher(argv, timeout: float) -> subprocess.CompletedProcess:
    """Runs a script that starts a cluster of its own (a launcher, the fault script) to its end.

    On a timeout, or when the test itself is interrupted (pytest-timeout), the script gets SIGTERM,
    on which it stops every task it started, before its process group is killed: a SIGKILL alone
    would leave its tasks, each in a session of its own, running.
    """
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            text=True, start_new_session=True, cwd=ROOT)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except BaseException:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def stop_process_group(proc: subprocess.Popen, grace_secs: float = 20) -> None:
    """SIGTERM to the process group a process leads (started with start_new_session), SIGKILL to it
    after grace_secs; returns once the process is reaped."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_secs)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


# ---------------------------------------------------------------- reading what they wrote
def lines_with(log: str, needle: str) -> list[str]:
    return [line for line in log.splitlines() if needle in line]


def logged_step(log: str) -> int:
    """The highest global step a first-step or progress line of this log names (0 before any).
    A line's step is read in the run that increments it, so it can be one past the step its line
    stands for: wait for a step with this, not for a line's text."""
    return max((step.step for step in log_lines.steps(log)), default=0)


def finished(log: str) -> dict[str, str]:
    """key=value pairs of a worker's 'finished:' line, read as the launchers read it."""
    values = log_lines.finished_values(log)
    assert values, "worker never logged its 'finished:' line"
    return values


def describe(cluster) -> str:
    """Every task's exit state and log tail, for assertion messages."""
    parts = []
    for (job, index), proc in cluster.tasks():
        tail = "\n".join(cluster.log(job, index).splitlines()[-15:])
        parts.append(f"--- {job} {index}: returncode {proc.poll()}\n{tail}")
    return "\n".join(parts)


class FakeClock:
    """A clock (cluster/clock.py) that a test drives: its time moves only when a wait sleeps on it, so a
    timeout is reached at once, after exactly the polls the wait makes."""

    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, secs):
        self.sleeps.append(secs)
        self.now += secs


class _NoTasks:
    """A cluster of no tasks, for launch.faults.wait_until's check of failed tasks."""

    @staticmethod
    def tasks():
        return []


def wait_for(condition, timeout: float, what: str, cluster=None) -> None:
    """launch.faults.wait_until as a test's assertion: polls condition() until it is true, and fails, naming
    `what`, once `timeout` seconds have passed or as soon as a task of `cluster` (if given) has exited with
    a code other than 0; it never carries on."""
    try:
        faults.wait_until(cluster or _NoTasks(), condition, time.monotonic() + timeout, what)
    except faults.FaultError as err:
        raise AssertionError(f"{err}" + (f"\n{describe(cluster)}" if cluster else "")) from None


def wait_recording_exits(cluster, timeout: float) -> dict:
    """Polls every task until all have exited or `timeout` passes: {(job, i): (code, exit time)}. A task that
    exits non-zero is recorded, not failed on: the caller judges the codes."""
    exits = {}

    def every_task_exited():
        for key, proc in cluster.tasks():
            if key not in exits and proc.poll() is not None:
                exits[key] = (proc.returncode, datetime.datetime.now())
        return len(exits) == len(cluster.tasks())

    try:
        wait_for(every_task_exited, timeout, "every task to exit")
    except AssertionError as err:
        raise AssertionError(f"{err}\n{describe(cluster)}") from None
    return exits


# ---------------------------------------------------------------- in-process clusters
def tf_session(target: str = "", graph=None) -> v1.Session:
    """A session with the graph optimizer set as the runtime sets its own (cluster/spec.graph_rewrites)."""
    return v1.Session(target, graph=graph, config=spec.graph_rewrites())


def in_process_cluster(num_workers: int = 1, num_ps: int = 1):
    """tf.test.create_local_cluster's servers: (worker servers, ps servers, a ClusterConfig per worker)."""
    workers, ps_servers = tf.test.create_local_cluster(num_workers=num_workers, num_ps=num_ps,
                                                       worker_config=spec.graph_rewrites(),
                                                       ps_config=spec.graph_rewrites())
    hosts = {job.name: tuple(job.tasks[i] for i in sorted(job.tasks)) for job in workers[0].server_def.cluster.job}
    configs = [spec.ClusterConfig(hosts["ps"], hosts["worker"], "worker", i) for i in range(num_workers)]
    return workers, ps_servers, configs


def train_one_worker(tmp_path, data_cfg, model_cfg, steps_per_run, train_steps, wire_dtype="float32", cluster=None,
          local_steps=1, optimizer="momentum", rounds=False, save_steps=20, graph_saver=False):
    """Trains to train_steps in a MonitoredTrainingSession, in this process or as the one worker of
    `cluster` (a ClusterConfig, server target), saving every save_steps (with graph_saver, through the
    training graph's own saver, as the chief does: it evicts before each save); returns the steps each run
    took, the global step after each, the progress hook, the checkpoint steps kept and the number of
    variables. The step path: rounds of rows (rounds), --local_steps, --steps_per_run or single steps."""
    cluster_cfg, target = cluster or (spec.ClusterConfig(), "")
    if rounds:
        path = plan.StepPath(plan.ROUNDS, steps_per_run, local_steps)
    elif local_steps > 1:
        path = plan.StepPath(plan.LOCAL_STEPS, steps_per_run)
    else:
        path = plan.StepPath(plan.STEPS_PER_RUN if steps_per_run > 1 else plan.SINGLE, steps_per_run)
    cfg = RunConfig(cluster_cfg, TrainConfig(train_steps=train_steps, step_path=path, batch_size=32,
                                             learning_rate=0.1, wire_dtype=wire_dtype,
                                             local_steps=local_steps, optimizer=optimizer),
                    model_cfg, data_cfg)
    runs = []
    with tf.Graph().as_default():
        graph = train_graph.build_graph(cfg)
        step = graph.step
        progress = training_hooks.ProgressHook("local:0", step.metrics.loss, step.metrics.accuracy, train_steps, 32,
                                               every_n=20, steps_done=step.steps_done, steps_per_run=steps_per_run)
        global_step = v1.train.get_global_step()
        scaffold = v1.train.Scaffold(saver=graph.saver if graph_saver else None)
        # The chief's saves as the runtime makes them, without the graph files, which no caller reads.
        saves = session_loop.ChiefSaverHook(str(tmp_path), None, save_steps, scaffold, steps_per_run=path.steps_per_run,
                                            save_graph_def=False)
        with v1.train.MonitoredTrainingSession(master=target, checkpoint_dir=str(tmp_path), scaffold=scaffold,
                                               config=spec.graph_rewrites(),
                                               hooks=[*step.hooks, progress],
                                               chief_only_hooks=[*step.chief_only_hooks, saves],
                                               save_checkpoint_steps=None, save_summaries_steps=None,
                                               save_summaries_secs=None, log_step_count_steps=0) as sess:
            while not sess.should_stop():
                if step.steps_done is None:
                    sess.run(step.train_op)
                    done = 1
                else:  # train_op is the loop; steps_done, its count
                    done = sess.run(step.steps_done)
                reached = sess.run_step_fn(lambda step_context: step_context.session.run(global_step))
                runs.append((int(done), int(reached)))
        variables = len(v1.global_variables())
    state = v1.train.get_checkpoint_state(str(tmp_path))
    saved = sorted(int(path.split("-")[-1]) for path in state.all_model_checkpoint_paths)
    return runs, progress, saved, variables


def trained_runs(runs):
    """train_one_worker's (steps, global step) runs without a last run that took no step. StopAtStepHook
    reads the global step in the same session.run as the steps, unordered with them: a read taken before
    the run's last step makes it ask for one more run to see the step reached, and that run takes none
    (the loop is at --train_steps); a read taken after it stops the session at once."""
    return runs[:-1] if runs and runs[-1][0] == 0 else runs


def held_out(checkpoint_dir, data_cfg, model_cfg, max_examples=2000) -> dict[str, float]:
    """{'loss', 'accuracy'[, 'auc']} of the newest checkpoint in `checkpoint_dir` over the held-out
    split: what a test judges training by (never one batch's loss)."""
    cfg = RunConfig(spec.ClusterConfig(), TrainConfig(), model_cfg, data_cfg)
    return evaluator.evaluate(cfg, tf.train.latest_checkpoint(str(checkpoint_dir)), max_examples)[1]


def join_all(threads, timeout=30):
    """Joins each thread, failing the test if one is still running after `timeout` s."""
    for thread in threads:
        thread.join(timeout)
        assert not thread.is_alive(), "a sync step did not finish"


# ---------------------------------------------------------------- exported models
SERVE = """
import json, pathlib, sys
import numpy as np
import tensorflow as tf

features = {k: np.array(v, dtype=object if isinstance(v[0], str) else np.float32)
            for k, v in json.loads(pathlib.Path(sys.argv[2]).read_text()).items()}
served = tf.saved_model.load(sys.argv[1]).signatures["serving_default"](
    **{k: tf.constant(v.astype(str) if v.dtype == object else v) for k, v in features.items()})
print(json.dumps({"probabilities": served["probabilities"].numpy().tolist(),
                  "classes": served["classes"].numpy().tolist()}))
"""


def saved_maps(checkpoint, column: str = "user") -> dict[int, dict]:
    """{shard: {ID: row}} of the dynamic table of `column` (its variable scope's last name), read from a checkpoint."""
    reader = tf.train.load_checkpoint(checkpoint)
    maps = {}
    for name in reader.get_variable_to_shape_map():
        found = re.fullmatch(rf"(?:.*/)?{column}/shard(\d+)/rows_of_ids-keys", name)
        if found:
            keys, values = reader.get_tensor(name), reader.get_tensor(name[:-len("keys")] + "values")
            maps[int(found.group(1))] = {(k.decode() if isinstance(k, bytes) else int(k)): int(v)
                                         for k, v in zip(keys, values)}
    return maps


def serve_in_fresh_process(export_dir, features) -> dict:
    """The export's serving_default signature on `features`, in a process that has imported TensorFlow and
    nothing of the project's, as a server would: its probabilities and classes."""
    payload = {k: [x.decode() for x in v] if v.dtype == object else v.tolist() for k, v in features.items()}
    with tempfile.TemporaryDirectory() as folder:
        features_file = pathlib.Path(folder, "features.json")
        features_file.write_text(json.dumps(payload))
        result = run_program(SERVE, export_dir, features_file, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- data files
def write_records(path, examples) -> None:
    """A TFRecord file of tf.train.Examples (or raw bytes, for records that are none)."""
    with tf.io.TFRecordWriter(str(path)) as writer:
        for example in examples:
            writer.write(example if isinstance(example, bytes) else example.SerializeToString())


def write_embedded_as_tfrecord(data_dir, examples: int = 400, bad_label_at: int | None = None,
                               num_files: int = 1, split: str = "train") -> list[str]:
    """The embedded dataset's training split (or `split`) as TFRecord files (one unless num_files), optionally
    with one record's label out of range (12 of 10 classes)."""
    cfg = inputs.DataConfig(synthetic_examples=examples)
    records = [({"image": f["image"].numpy()}, label.numpy())
               for f, label in synthetic.records(cfg, split, inputs.Shard(0, 1))]
    if bad_label_at is not None:
        records[bad_label_at] = (records[bad_label_at][0], 12)
    return tfrecord.write(records, synthetic.spec(cfg), str(data_dir), split, num_files=num_files)


def write_click_csvs(data_dir, rows: int = 3000, files: int = 2) -> None:
    """Click logs whose label is learnable from the city, with a column that is read by no one and a user's
    recent items (0 to 12 of 50, '|' between them; items 0-29 come more often before a click, 20-49 before
    none): train-*.csv and eval-*.csv."""
    rng, recent_rng = np.random.RandomState(0), np.random.RandomState(1)
    data_dir.mkdir(parents=True)
    for split, count in (("train", rows), ("eval", rows // 5)):
        for f in range(files):
            lines = ["user,city,price,hour,clicked,comment,recent"]
            for _ in range(count // files):
                user, city = rng.randint(300), rng.randint(20)
                price, hour = rng.uniform(1, 100), rng.randint(24)
                clicked = int(rng.rand() < (0.9 if city < 10 else 0.1))
                items = recent_rng.randint(30, size=recent_rng.randint(13)) + (0 if clicked else 20)
                recent = "|".join(f"i{item}" for item in items)
                lines.append(f"u{user},c{city},{price:.2f},{hour},{clicked},free text,{recent}")
            (data_dir / f"{split}-{f}.csv").write_text("\n".join(lines) + "\n")


def write_criteo_files(data_dir, rows: int = 4000) -> None:
    """Criteo's layout as it comes (tab-separated, no header, label, 13 integers, 26 hex ids, many
    fields empty), with a label learnable from the first id: train.txt and eval.txt."""
    rng = np.random.RandomState(0)
    data_dir.mkdir(parents=True)
    ads = [f"{rng.randint(2**32):08x}" for _ in range(40)]
    for split, count in (("train", rows), ("eval", rows // 4)):
        lines = []
        for _ in range(count):
            ad = rng.randint(len(ads))
            clicked = int(rng.rand() < (0.85 if ad % 2 else 0.15))
            integers = ["" if rng.rand() < 0.3 else str(rng.randint(1000)) for _ in range(13)]
            ids = [ads[ad]] + ["" if rng.rand() < 0.3 else f"{rng.randint(50):08x}" for _ in range(25)]
            lines.append("\t".join([str(clicked), *integers, *ids]))
        (data_dir / f"{split}.txt").write_text("\n".join(lines) + "\n")


def write_criteo_shaped_tsvs(data_dir, rows: int = 8000, files: int = 4) -> None:
    """Criteo's columns (label, I1..I13, C1..C26, many fields empty) with a header and a user's history
    (0 to 12 of 50 items, '|' between them; items 0-29 come more often before a click, 20-49 before none),
    tab-separated: train-*.tsv and eval-0.tsv. The label is learnable from C1 (the ad) and the history."""
    rng, history_rng = np.random.RandomState(0), np.random.RandomState(1)
    data_dir.mkdir(parents=True)
    ads = [f"{rng.randint(2**32):08x}" for _ in range(40)]
    header = "\t".join(["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27)), "history"])
    for split, count, split_files in (("train", rows, files), ("eval", rows // 4, 1)):
        for f in range(split_files):
            lines = [header]
            for _ in range(count // split_files):
                ad = rng.randint(len(ads))
                clicked = int(rng.rand() < (0.85 if ad % 2 else 0.15))
                integers = ["" if rng.rand() < 0.3 else str(rng.randint(1000)) for _ in range(13)]
                ids = [ads[ad]] + ["" if rng.rand() < 0.3 else f"{rng.randint(50):08x}" for _ in range(25)]
                items = history_rng.randint(30, size=history_rng.randint(13)) + (0 if clicked else 20)
                history = "|".join(f"i{item}" for item in items)
                lines.append("\t".join([str(clicked), *integers, *ids, history]))
            (data_dir / f"{split}-{f}.tsv").write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------- TensorBoard
@contextlib.contextmanager
def tensorboard(logdir, timeout: float = 120):
    """A real TensorBoard on logdir, bound to 127.0.0.1 on a free port, once it lists runs; yields a
    function that GETs a path of its HTTP API and returns the JSON. Stopped by its process group."""
    executable = pathlib.Path(sys.executable).with_name("tensorboard")
    assert executable.exists(), "tensorboard (in the test extra) is not installed"
    port, = free_ports(1)
    proc = subprocess.Popen([str(executable), f"--logdir={logdir}", "--host=127.0.0.1", f"--port={port}",
                             "--load_fast=false", "--reload_interval=1"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True)

    def get(path):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return json.loads(response.read())

    def lists_a_run():  # TensorBoard imports TensorFlow, then reads the event files, before it answers
        assert proc.poll() is None, f"tensorboard exited {proc.returncode}: {proc.stderr.read()[-2000:]}"
        with contextlib.suppress(OSError):
            return bool(get("/data/runs"))
        return False

    try:
        wait_for(lists_a_run, timeout, f"tensorboard to list a run of {logdir}")
        yield get
    finally:
        stop_process_group(proc)
        proc.stderr.close()


def write_numbered_csvs(data_dir, rows, eval_rows: int) -> None:
    """train-*.csv (rows[f] in file f) of numbered rows (id, x1, x2, label) whose label is learnable from
    x1 + x2, and an eval split of eval_rows."""
    rng = np.random.RandomState(0)
    data_dir.mkdir(parents=True)
    first = 0
    for split, sizes in (("train", rows), ("eval", (eval_rows,))):
        for f, size in enumerate(sizes):
            x = rng.normal(size=(size, 2))
            lines = ["id,x1,x2,label"] + [f"{first + i},{a:.4f},{b:.4f},{int(a + b > 0)}" for i, (a, b) in enumerate(x)]
            (data_dir / f"{split}-{f:02d}.csv").write_text("\n".join(lines) + "\n")
            first += size


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} from http://127.0.0.1:port/metrics (--metrics_port)."""
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def metric_value(samples, name, **labels):
    return samples[(f"pstrainer_{name}", tuple(sorted(labels.items())))]
