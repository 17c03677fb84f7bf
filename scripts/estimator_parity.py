#!/usr/bin/env python3
"""Runs the same TF1 Estimator programs on the real Estimator (TensorFlow 2.15.1, tensorflow-estimator
2.15.0, in a reference venv this script makes) and on ps_trainer.estimator (this venv), side by side.

    python scripts/estimator_parity.py --reference_venv=/tmp/tf215-venv

For each program (tests/programs/) and each side: one process, then a TF_CONFIG cluster of ps, chief,
worker and evaluator processes on 127.0.0.1. It prints the held-out figure the program's evaluation
logs last, the chief's training speed (the median of TensorFlow's `global_step/sec` lines, times the
program's batch size: examples/s), the whole job's wall time (launch to the last task but the ps
gone: the evaluator's final evaluation included) and how the ps ended (given 30 s more). The
clicks_csv program (click logs in CSV files this script writes from the trainer's clicks data) runs a third
and fourth way: its model_fn under `trainer.py --model_fn` on the same files, with the trainer's update
(Adagrad, as the program's) plain and with a lever (--local_steps); their held-out figure is the chief's
final held-out AUC and their speed the global step's rate over the chief's progress lines; and a fifth: the
program unmodified on a cluster with the lever given outside its code (PS_TRAINER_FLAGS="--local_steps=N"); and
a sixth: its graph in a bare `session.run((train_op, loss))` loop on the same cluster (scripts/bare_loop.py). In the
reference venv the one added line, `import ps_trainer.estimator`, imports an empty shim: each program gets
TF 2.15's own `tf.estimator` (its V2 canned classes) and `tf.compat.v1.estimator` (TF1's V1 classes), as it
gets this project's here. The reference ps never exits by itself; it is stopped (by its process group)
once the other tasks have ended, and reported so.

    python scripts/estimator_parity.py --bare_pairs=10

runs none of that: the clicks_csv program plain on a cluster and its bare loop, alternated ten times, and prints
the median of their examples/s ratios (no reference venv needed).
"""

import json
import os
import pathlib
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from ps_trainer.launch.processes import LOOPBACK, free_ports  # noqa: E402

flags.DEFINE_string("reference_venv", "/tmp/tf215-venv", "The reference venv (made here if missing).")
flags.DEFINE_list("programs", ["clicks", "census", "sync_cnn", "clicks_csv", "premade_v2"],
                  "Programs to run (PROGRAMS).")
flags.DEFINE_integer("lever_local_steps", 10, "clicks_csv's lever: trainer.py --model_fn's --local_steps.")
flags.DEFINE_integer("timeout_secs", 600, "A job still going after this long is stopped and reported.")
flags.DEFINE_integer("bare_pairs", 0, "Instead of the sides: the clicks_csv program plain and its bare loop, each on "
                     "1 ps + chief + worker without an evaluator, alternated this many times; prints each pair's "
                     "examples/s, their ratio and the median ratio.", lower_bound=0)
flags.DEFINE_boolean("evaluator", True, "Start the cluster's evaluator. Without it the training speed of the two "
                     "sides compares alike: TF1's evaluator sleeps start_delay_secs (120 s) while the chief trains, "
                     "this project's evaluates each checkpoint as it comes, on the same cores.")
FLAGS = flags.FLAGS

REFERENCE = ("tensorflow-cpu==2.15.1", "tensorflow-estimator==2.15.0", "numpy==1.26.4", "absl-py")
# name: (program, its batch size, the held-out figure to compare, the flags of every run)
PROGRAMS = {
    "clicks": ("clicks_estimator.py", 64, "auc", ["--train_steps=600"]),
    "census": ("census_wide_deep.py", 64, "auc", ["--train_steps=600"]),
    "sync_cnn": ("sync_cnn_estimator.py", 32, "accuracy", ["--train_steps=200"]),
    "clicks_csv": ("clicks_csv_estimator.py", 64, "auc", ["--train_steps=3000", "--batch_size=64"]),
    "premade_v2": ("premade_v2.py", 32, "accuracy", ["--train_steps=300"]),
}
CLICKS_CSV_EXAMPLES = 60000  # training examples of the trainer's clicks data, in 4 files
SHIM = "# The one line a program adds, on TensorFlow 2.15: tf.estimator is TensorFlow's own there.\n"
JOBS = ("ps", "chief", "worker", "evaluator")
LEVER_VARIABLE = "PS_TRAINER_FLAGS"  # ps_trainer/estimator/settings.py: the trainer's settings for a program


def reference_python(venv: pathlib.Path) -> str:
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *REFERENCE], check=True)
    return str(python)


def shim_dir(work: pathlib.Path) -> str:
    package = work / "shim" / "ps_trainer"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "estimator.py").write_text(SHIM)
    return str(work / "shim")


def steps_per_sec(log: str) -> float | None:
    rates = [float(rate) for rate in re.findall(r"global_step/sec: ([0-9.e+-]+)", log)]
    return statistics.median(rates) if rates else None


def final_figure(log: str, key: str) -> float | None:
    """`key` of the last evaluation the log holds (both Estimators log 'Saving dict for global step N:
    key = value, ...')."""
    from ps_trainer.training import log_lines  # noqa: PLC0415  (loaded where used: the script's processes start without it)
    return log_lines.last_evaluation(log).get(key)


def stop_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def write_clicks_csv(directory: pathlib.Path) -> pathlib.Path:
    """The trainer's clicks data as CSV files, train-0..3.csv and eval-0.csv, with a header each."""
    import numpy as np  # noqa: PLC0415  (loaded where used: the script's processes start without it)
    from ps_trainer import input as inputs  # noqa: PLC0415  (loaded where used: the script's processes start without it)
    directory.mkdir(parents=True, exist_ok=True)
    cfg = inputs.DataConfig(name="clicks", synthetic_examples=CLICKS_CSV_EXAMPLES)
    for split, files in (("train", 4), ("eval", 1)):
        rows = []
        for features, labels in inputs.DATASETS["clicks"].records(cfg, split, inputs.Shard(0, 1)).batch(10000):
            columns = [np.char.decode(features[name].numpy().astype(bytes)) for name in ("user", "item", "category")]
            columns += [features[name].numpy() for name in ("hour", "price")] + [labels.numpy()]
            rows.extend(",".join(str(value) for value in row) for row in zip(*columns))
        for index in range(files):
            (directory / f"{split}-{index}.csv").write_text(
                "user,item,category,hour,price,clicked\n" + "".join(f"{row}\n" for row in rows[index::files]))
    return directory


def trainer_command(data_dir: pathlib.Path, program_args, lever_args) -> list[str]:
    """trainer.py training clicks_csv's model_fn on the same files, with the program's optimizer."""
    steps = next(arg for arg in program_args if arg.startswith("--train_steps="))
    batch = next(arg for arg in program_args if arg.startswith("--batch_size="))
    return [str(ROOT / "trainer.py"),
            f"--model_fn={ROOT / 'tests' / 'programs' / PROGRAMS['clicks_csv'][0]}:model_fn",
            "--model_fn_params=update=runtime", "--dataset=csv", f"--data_dir={data_dir}", "--label_column=clicked",
            "--categorical_columns=user,item,category", "--numeric_columns=hour,price", "--optimizer=adagrad",
            "--learning_rate=0.1", steps, batch, "--log_every_n_steps=200", "--export_saved_model=false",
            *lever_args]


def run_job(python, env, command, args, work, cluster: bool, evaluator=None) -> dict:
    """One run: (figure, steps/s, wall, ps ending) from the logs of its processes. `command`: the program
    (its path and flags but --model_dir)."""
    model_dir = work / "model"
    evaluator = FLAGS.evaluator if evaluator is None else evaluator
    jobs = (JOBS if evaluator else JOBS[:-1]) if cluster else ("local",)
    hosts = dict(zip(("ps", "chief", "worker"), (f"{LOOPBACK}:{port}" for port in free_ports(3))))
    procs, logs = {}, {}
    start = time.monotonic()
    for job in jobs:
        job_env = dict(env)
        if cluster:
            job_env["TF_CONFIG"] = json.dumps({"cluster": {name: [address] for name, address in hosts.items()},
                                               "task": {"type": job, "index": 0}})
        logs[job] = open(work / f"{job}.log", "w")  # closed below
        procs[job] = subprocess.Popen([python, *command, f"--model_dir={model_dir}", *args], env=job_env, cwd=work,
                                      stdout=logs[job],
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    ended, ps_ending, wall = {}, "-", float(FLAGS.timeout_secs)
    try:
        while time.monotonic() - start < FLAGS.timeout_secs:
            for job, proc in procs.items():
                if job not in ended and proc.poll() is not None:
                    ended[job] = proc.returncode
            others = [job for job in procs if job != "ps"]
            if all(job in ended for job in others):
                wall = time.monotonic() - start
                if "ps" in ended:
                    ps_ending = f"exit {ended['ps']}"
                elif "ps" in procs:
                    grace = time.monotonic()
                    while procs["ps"].poll() is None and time.monotonic() - grace < 30:
                        time.sleep(0.2)
                    if procs["ps"].poll() is None:
                        stop_group(procs["ps"])
                        ps_ending = "killed (never exits)"
                    else:
                        ps_ending = f"exit {procs['ps'].returncode}"
                        ended["ps"] = procs["ps"].returncode
                break
            time.sleep(0.2)
    finally:
        for proc in procs.values():
            stop_group(proc)
        for log in logs.values():
            log.close()
    texts = {job: (work / f"{job}.log").read_text() for job in jobs}
    trainer = texts["chief" if cluster else "local"]
    evaluated = texts["evaluator" if cluster and evaluator else "chief" if cluster else "local"]
    return {"codes": {job: ended.get(job) for job in jobs if job != "ps"}, "steps_per_sec": steps_per_sec(trainer),
            "figure": evaluated, "wall": wall, "ps": ps_ending}


def print_row(name, side, cluster, key, figure, rate, batch, result, work):
    failed = {job: code for job, code in result["codes"].items() if code != 0}
    print(f"{name:10} {side:30} {'cluster' if cluster else 'one':8} "
          f"{key[:3]} {figure if figure is None else round(figure, 3)!s:>5} "
          f"{'-' if rate is None else round(rate * batch):>11} {result['wall']:>11.1f}  {result['ps']}"
          + (f"  FAILED {failed} (logs in {work})" if failed else ""), flush=True)


def run_trainer_sides(work_root, data_dir, batch, key, args):
    """clicks_csv's model_fn under trainer.py, plain and with the lever, on the same CSV files."""
    from ps_trainer.training import log_lines  # noqa: PLC0415  (loaded where used: the script's processes start without it)
    sides = {"trainer.py --model_fn": [],
             f"trainer.py --model_fn --local_steps={FLAGS.lever_local_steps}": [
                 f"--local_steps={FLAGS.lever_local_steps}"]}
    for cluster in (False, True):
        for side, lever in sides.items():
            if lever and not cluster:
                continue  # a lever of the cluster: one process has no ps to spare the trips to
            work = work_root / "clicks_csv" / ("trainer-lever" if lever else "trainer") / (
                "cluster" if cluster else "local")
            work.mkdir(parents=True)
            result = run_job(sys.executable, {**os.environ, "PYTHONPATH": str(ROOT)},
                             trainer_command(data_dir, args, lever), [], work, cluster, evaluator=False)
            figure = log_lines.finished_values(result["figure"]).get(f"heldout_{key}")
            rate = log_lines.examples_per_sec(result["figure"], 1, 200)  # global steps/s: x batch below
            print_row("clicks_csv", side, cluster, key, figure if figure is None else float(figure), rate, batch,
                      result, work)


def run_bare_side(work_root, batch, key, args):
    """clicks_csv's graph (its input_fn and model_fn) in a bare session.run((train_op, loss)) loop on the same
    cluster (scripts/bare_loop.py): the floor of the runtime's session loop, on TF 2.21 (no held-out figure)."""
    work = work_root / "clicks_csv" / "bare" / "cluster"
    work.mkdir(parents=True)
    program = ROOT / "tests" / "programs" / PROGRAMS["clicks_csv"][0]
    result = run_job(sys.executable, {**os.environ, "PYTHONPATH": str(ROOT)},
                     [str(ROOT / "scripts" / "bare_loop.py"), f"--program={program}"], args, work, True,
                     evaluator=False)
    print_row("clicks_csv", "bare session.run loop", True, key, None, steps_per_sec(result["figure"]), batch,
              result, work)


def run_bare_pairs(work_root, pairs):
    """The clicks_csv program plain on a cluster against its graph in the bare loop, alternated `pairs` times (the
    machine's drift falls on both alike): each pair's examples/s and ratio, then the median ratio."""
    program, batch, _, args = PROGRAMS["clicks_csv"]
    args = [*args, f"--data_dir={write_clicks_csv(work_root / 'clicks_csv_data')}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    path = ROOT / "tests" / "programs" / program
    ratios = []
    for pair in range(pairs):
        rates = []
        for side, command in (("program", [str(path)]), ("bare", [str(ROOT / "scripts" / "bare_loop.py"),
                                                                   f"--program={path}"])):
            work = work_root / "pairs" / f"{pair}-{side}"
            work.mkdir(parents=True)
            result = run_job(sys.executable, env, command, args, work, True, evaluator=False)
            if result["steps_per_sec"] is None or any(code != 0 for code in result["codes"].values()):
                raise SystemExit(f"pair {pair}: the {side} run failed {result['codes']} (logs in {work})")
            rates.append(result["steps_per_sec"] * batch)
        ratios.append(rates[0] / rates[1])
        print(f"pair {pair}: program {rates[0]:,.0f} examples/s, bare loop {rates[1]:,.0f}: {ratios[-1]:.3f}x",
              flush=True)
    print(f"median {statistics.median(ratios):.3f}x of {pairs} pairs ({min(ratios):.3f}x to {max(ratios):.3f}x)")


def main(argv):
    del argv
    work_root = pathlib.Path(tempfile.mkdtemp(prefix="estimator-parity-"))
    if FLAGS.bare_pairs:
        run_bare_pairs(work_root, FLAGS.bare_pairs)
        print(f"logs: {work_root}")
        return
    reference_env = {**os.environ, "PYTHONPATH": shim_dir(work_root)}
    reference_env.pop("TF_USE_LEGACY_KERAS", None)  # TF 2.15's Keras is Keras 2 already
    sides = {"TF 2.15 Estimator": (reference_python(pathlib.Path(FLAGS.reference_venv)), reference_env),
             "ps_trainer.estimator": (sys.executable, {**os.environ, "PYTHONPATH": str(ROOT)})}
    print(f"{'program':10} {'side':30} {'mode':8} {'held-out':>9} {'examples/s':>11} {'job wall s':>11}  ps")
    for name in FLAGS.programs:
        program, batch, key, args = PROGRAMS[name]
        if name == "clicks_csv":
            data_dir = write_clicks_csv(work_root / "clicks_csv_data")
            args = [*args, f"--data_dir={data_dir}"]
        program_sides = dict(sides)
        if name == "clicks_csv":  # the program unmodified, with a lever given outside its code (cluster only)
            ours = sides["ps_trainer.estimator"]
            program_sides[f"{LEVER_VARIABLE} --local_steps={FLAGS.lever_local_steps}"] = (ours[0], {
                **ours[1], LEVER_VARIABLE: f"--local_steps={FLAGS.lever_local_steps}"})
        for cluster in (False, True):
            for side, (python, env) in program_sides.items():
                if LEVER_VARIABLE in env and not cluster:
                    continue  # a lever of the cluster: one process has no ps to spare the trips to
                work = work_root / name / side.split()[0] / ("cluster" if cluster else "local")
                work.mkdir(parents=True)
                result = run_job(python, env, [str(ROOT / "tests" / "programs" / program)], args, work, cluster)
                print_row(name, side, cluster, key, final_figure(result["figure"], key), result["steps_per_sec"],
                          batch, result, work)
        if name == "clicks_csv":
            run_trainer_sides(work_root, data_dir, batch, key, PROGRAMS[name][3])
            run_bare_side(work_root, batch, key, args)
    print(f"logs: {work_root}")


if __name__ == "__main__":
    app.run(main)
