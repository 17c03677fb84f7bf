#!/usr/bin/env python3
"""Runs the same TF1 Estimator programs on the real Estimator (TensorFlow 2.15.1, tensorflow-estimator
2.15.0, in a reference venv this script makes) and on ps_trainer.estimator (this venv), side by side.

    python scripts/estimator_parity.py --reference_venv=/tmp/tf215-venv

For each program (tests/programs/) and each side: one process, then a TF_CONFIG cluster of ps, chief,
worker and evaluator processes on 127.0.0.1. It prints the held-out figure the program's evaluation
logs last, the chief's training speed (the median of TensorFlow's `global_step/sec` lines, times the
program's batch size: examples/s), the whole job's wall time (launch to the last task but the ps
gone: the evaluator's final evaluation included) and how the ps ended (given 30 s more). In the
reference venv the one added line, `import ps_trainer.estimator`, imports a shim that sets
`tf.estimator = tf.compat.v1.estimator`: the V1 classes TF1 programs were written for. The reference
ps never exits by itself; it is stopped (by its process group) once the other tasks have ended, and
reported so.
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
flags.DEFINE_list("programs", ["clicks", "census", "sync_cnn"], "Programs to run (PROGRAMS).")
flags.DEFINE_integer("timeout_secs", 600, "A job still going after this long is stopped and reported.")
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
}
SHIM = "import tensorflow as tf\ntf.estimator = tf.compat.v1.estimator  # TF1's V1 classes\n"
JOBS = ("ps", "chief", "worker", "evaluator")


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
    lines = [line for line in log.splitlines() if "Saving dict for global step" in line]
    if not lines:
        return None
    figures = dict(pair.split(" = ") for pair in lines[-1].split(": ", 2)[-1].split(", "))
    return float(figures[key]) if key in figures else None


def stop_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def run_job(python, env, program, args, work, cluster: bool) -> dict:
    """One run: (figure, steps/s, wall, ps ending) from the logs of its processes."""
    model_dir = work / "model"
    jobs = (JOBS if FLAGS.evaluator else JOBS[:-1]) if cluster else ("local",)
    hosts = dict(zip(("ps", "chief", "worker"), (f"{LOOPBACK}:{port}" for port in free_ports(3))))
    procs, logs = {}, {}
    start = time.monotonic()
    for job in jobs:
        job_env = dict(env)
        if cluster:
            job_env["TF_CONFIG"] = json.dumps({"cluster": {name: [address] for name, address in hosts.items()},
                                               "task": {"type": job, "index": 0}})
        logs[job] = open(work / f"{job}.log", "w")  # pylint: disable=consider-using-with  # closed below
        procs[job] = subprocess.Popen([python, str(ROOT / "tests" / "programs" / program),
                                       f"--model_dir={model_dir}", *args], env=job_env, cwd=work, stdout=logs[job],
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
    evaluated = texts["evaluator" if cluster and FLAGS.evaluator else "chief" if cluster else "local"]
    return {"codes": {job: ended.get(job) for job in jobs if job != "ps"}, "steps_per_sec": steps_per_sec(trainer),
            "figure": evaluated, "wall": wall, "ps": ps_ending}


def main(argv):
    del argv
    work_root = pathlib.Path(tempfile.mkdtemp(prefix="estimator-parity-"))
    reference_env = {**os.environ, "PYTHONPATH": shim_dir(work_root)}
    reference_env.pop("TF_USE_LEGACY_KERAS", None)  # TF 2.15's Keras is Keras 2 already
    sides = {"TF 2.15 Estimator": (reference_python(pathlib.Path(FLAGS.reference_venv)), reference_env),
             "ps_trainer.estimator": (sys.executable, {**os.environ, "PYTHONPATH": str(ROOT)})}
    print(f"{'program':9} {'side':22} {'mode':8} {'held-out':>9} {'examples/s':>11} {'job wall s':>11}  ps")
    for name in FLAGS.programs:
        program, batch, key, args = PROGRAMS[name]
        for cluster in (False, True):
            for side, (python, env) in sides.items():
                work = work_root / name / side.split()[0] / ("cluster" if cluster else "local")
                work.mkdir(parents=True)
                result = run_job(python, env, program, args, work, cluster)
                figure = final_figure(result["figure"], key)
                rate = result["steps_per_sec"]
                failed = {job: code for job, code in result["codes"].items() if code != 0}
                print(f"{name:9} {side:22} {'cluster' if cluster else 'one':8} "
                      f"{key[:3]} {figure if figure is None else round(figure, 3)!s:>5} "
                      f"{'-' if rate is None else round(rate * batch):>11} {result['wall']:>11.1f}  {result['ps']}"
                      + (f"  FAILED {failed} (logs in {work})" if failed else ""), flush=True)
    print(f"logs: {work_root}")


if __name__ == "__main__":
    app.run(main)
