#!/usr/bin/env python3
"""Runs a local cluster, kills one task with SIGKILL, restarts it, and reports the outcome.

    python scripts/inject_fault.py --kill=worker:1 --at_step=300
    python scripts/inject_fault.py --kill=ps:0 --at_step=300 --pause_secs=40   # SIGSTOP for 40 s, then SIGCONT
    python scripts/inject_fault.py --kill=ps:0 --at_step=300 -- --sync_replicas
    python scripts/inject_fault.py --kill=random --seed=7           # a random task at a random step
    python scripts/inject_fault.py --during_saves=20                # kill the chief mid-save, 20 times
    python scripts/inject_fault.py --chaos_secs=900 --num_ps=2 -- --sync_replicas   # random kills, 15 min
    python scripts/inject_fault.py --chaos_kills=4 --train_steps=2000 --num_ps=2   # 4 kills, by global step
    python scripts/inject_fault.py --chaos_secs=60 --num_epochs=3 --train_steps=1000000 -- --dataset=csv \
        --data_dir=/data/clicks ...          # the same through --input_queue, judged by its epochs
    python scripts/inject_fault.py --chaos_kills=2 --seed=5 --train_steps=2000 \
        --program=tests/programs/clicks_estimator.py   # an Estimator program's cluster, as trainer.py's

Prints whether training finished, the final step, whether the final checkpoint restores, and the
time lost; exits 0 only if all of it went right. Chaos mode kills a random running task (ps tasks
included) every --chaos_interval_secs for --chaos_secs, restarts each after a random short delay,
lets training run to its end, and lists every violation of: exit 0 only at --train_steps, checkpoint
steps never go back, nothing left running. Flags after '--' go to every trainer.py. With --program
(chaos mode), an Estimator program runs in place of trainer.py, as scripts/run_local.py runs one (a
chief, --num_workers - 1 workers, the ps tasks and an evaluator, told their roles by TF_CONFIG), given
--model_dir and --train_steps (its max_steps) and the flags after '--'.
"""

import json
import pathlib
import random

from absl import app, flags

from ps_trainer.launch import chaos, faults, terminal
from ps_trainer.launch.forked import HelperTimeout
from ps_trainer.launch.processes import LocalCluster

flags.DEFINE_string("kill", "worker:1", "Task to kill: job:index (worker:1, ps:0), 'chief', or 'random'.")
flags.DEFINE_string("at_step", "random", "Global step at which to kill it, or 'random' (10%..60% of "
                    "--train_steps).")
flags.DEFINE_integer("seed", 0, "Seed for --kill=random and --at_step=random.")
flags.register_validator("at_step", lambda value: value == "random" or value.isdigit(),
                         message="--at_step must be a global step (a whole number) or 'random'")
flags.DEFINE_integer("during_saves", 0, "Instead: kill the chief this many times, each during a checkpoint "
                     "save (the chief saves every step), and check that every restart restores.", lower_bound=0)
flags.DEFINE_integer("train_steps", 1000, "Training steps of the run (with --during_saves: steps after "
                     "the last restart).", lower_bound=1)
flags.DEFINE_integer("num_ps", 1, "Number of ps tasks.", lower_bound=1)
flags.DEFINE_integer("num_workers", 2, "Number of workers.", lower_bound=1)
flags.DEFINE_float("restart_delay_secs", 1.0, "Pause between the kill and the restart.", lower_bound=0)
flags.DEFINE_float("pause_secs", 0, "Instead of killing the --kill task: stop it (SIGSTOP) for this long, then let "
                   "it go on (SIGCONT), with no restart.", lower_bound=0)
flags.DEFINE_float("chaos_secs", 0, "Instead: kill random tasks for this long (chaos mode).", lower_bound=0)
flags.DEFINE_list("chaos_interval_secs", ["6", "20"], "Chaos mode: MIN,MAX seconds between kills.")
flags.DEFINE_integer("chaos_kills", 0, "Instead of --chaos_secs: this many random kills, at global steps drawn "
                     "between 10% and 60% of --train_steps (each once the last killed task is back), so that the "
                     "count does not depend on the machine's speed.", lower_bound=0)
flags.DEFINE_list("chaos_restart_delay_secs", ["0.5", "3"], "Chaos mode: MIN,MAX seconds before a restart.")
flags.DEFINE_integer("num_epochs", 0, "Chaos mode: train with --input_queue to this many epochs (the data flags "
                     "after '--' name files); the run is judged by its epochs, --train_steps only caps it.",
                     lower_bound=0)
flags.DEFINE_integer("save_checkpoint_steps", 100, "Checkpoint interval of the run.", lower_bound=1)
flags.DEFINE_bool("preload", True, "Fork every task, and every restart, from one process that has imported the "
                  "trainer (a --program's from one that has imported TensorFlow alone): 3-4 s of CPU less each; "
                  "--nopreload starts each as `python trainer.py` (or `python PROGRAM`).")
flags.DEFINE_string("program", None, "Chaos mode: a TF1 Estimator program (train_and_evaluate from TF_CONFIG, "
                    "`import ps_trainer.estimator`, flags --model_dir and --train_steps) in place of trainer.py.")
flags.DEFINE_string("report_json", None, "Also write the report to this file as JSON.")
terminal.define_flags("runs/fault-<timestamp>", timeout_secs=900, ps_exit_secs=30)
FLAGS = flags.FLAGS
KEEP_CHECKPOINT_MAX = 3


def target(rng, num_ps, num_workers) -> tuple[str, int]:
    if FLAGS.kill == "random":
        return rng.choice([("ps", i) for i in range(num_ps)] + [("worker", i) for i in range(num_workers)])
    if FLAGS.kill == "chief":
        return ("worker", 0)
    job, _, index = FLAGS.kill.partition(":")
    if job not in ("ps", "worker") or not index.isdigit():
        raise app.UsageError(f"--kill={FLAGS.kill}: expected worker:N, ps:N, chief or random")
    if int(index) >= (num_ps if job == "ps" else num_workers):
        raise app.UsageError(f"--kill={FLAGS.kill}: the cluster has {num_ps} ps and {num_workers} workers")
    return job, int(index)


def seconds_range(flag: str) -> tuple[float, float]:
    try:
        low, high = (float(value) for value in FLAGS[flag].value)
    except ValueError:
        low = high = -1.0
    if not 0 <= low <= high:
        raise app.UsageError(f"--{flag}={','.join(FLAGS[flag].value)}: expected MIN,MAX seconds, 0 <= MIN <= MAX")
    return low, high


def main(argv):
    terminal.check_ports()
    terminal.interrupt_on_signals()
    run_dir = terminal.run_dir("fault-")
    try:
        return run(argv[1:], run_dir)
    except (faults.FaultError, HelperTimeout) as err:
        print(f"FAILED: {err}; see the logs in {run_dir}")
        return 1


def chaos_cluster(trainer_args, run_dir, model_dir) -> LocalCluster:
    """The cluster chaos mode runs: trainer.py's, or --program's (the chief one of --num_workers, as
    scripts/run_local.py starts a program, with an evaluator)."""
    if FLAGS.program:
        if not pathlib.Path(FLAGS.program).is_file():
            raise app.UsageError(f"--program={FLAGS.program}: no such file")
        return LocalCluster(run_dir, FLAGS.num_ps, FLAGS.num_workers - 1,
                            [f"--model_dir={model_dir}", f"--train_steps={FLAGS.train_steps}", *trainer_args],
                            chief=True, preload=FLAGS.preload, program=FLAGS.program, evaluator=True)
    epochs = ["--input_queue", "--input_queue_audit", f"--num_epochs={FLAGS.num_epochs}"] if FLAGS.num_epochs else []
    return LocalCluster(run_dir, FLAGS.num_ps, FLAGS.num_workers,
                        [*trainer_flags(trainer_args, model_dir), f"--train_steps={FLAGS.train_steps}",
                         f"--save_checkpoint_steps={FLAGS.save_checkpoint_steps}", *epochs], preload=FLAGS.preload)


def trainer_flags(trainer_args, model_dir) -> list[str]:
    return [f"--model_dir={model_dir}", "--log_every_n_steps=10", f"--keep_checkpoint_max={KEEP_CHECKPOINT_MAX}",
            *trainer_args]


def run(trainer_args, run_dir):
    rng = random.Random(FLAGS.seed)
    model_dir = run_dir / "model"
    if FLAGS.program and not (FLAGS.chaos_secs or FLAGS.chaos_kills):
        raise app.UsageError(f"--program={FLAGS.program} runs in chaos mode only: give --chaos_kills or --chaos_secs")
    if FLAGS.chaos_secs or FLAGS.chaos_kills:
        cluster = chaos_cluster(trainer_args, run_dir, model_dir)
        if FLAGS.program:  # no trainer server, so no TensorFlow helper to ask: this process reads the checkpoints
            faults.registered_step(model_dir)  # itself, so TensorFlow loads now, not while the first kill is due
        at_steps = chaos.kill_steps(FLAGS.train_steps, FLAGS.chaos_kills, FLAGS.seed) if FLAGS.chaos_kills else None
        when = f"at global steps {at_steps}" if at_steps else f"for {FLAGS.chaos_secs:g} s"
        print(f"chaos: killing random tasks {when}; logs in {run_dir}", flush=True)
        with cluster:
            report = chaos.run(cluster, str(model_dir), FLAGS.train_steps, FLAGS.chaos_secs,
                               seconds_range("chaos_interval_secs"), seconds_range("chaos_restart_delay_secs"),
                               FLAGS.seed, FLAGS.timeout_secs, num_epochs=FLAGS.num_epochs, at_steps=at_steps)
        ok = not report.violations
    elif FLAGS.during_saves:
        trainer_args = trainer_flags(trainer_args, model_dir)
        cluster = LocalCluster(run_dir, FLAGS.num_ps, 1, [*trainer_args, "--save_checkpoint_steps=1",
                                                          "--train_steps=1000000000"], preload=FLAGS.preload)
        print(f"killing the chief during checkpoint saves, {FLAGS.during_saves} times; logs in {run_dir}",
              flush=True)
        with cluster:
            report = faults.kill_during_saves(cluster, str(model_dir), FLAGS.during_saves, FLAGS.train_steps,
                                              KEEP_CHECKPOINT_MAX, FLAGS.timeout_secs, seed=FLAGS.seed)
        ok = report.clean
    else:
        trainer_args = trainer_flags(trainer_args, model_dir)
        job, index = target(rng, FLAGS.num_ps, FLAGS.num_workers)
        at_step = (int(FLAGS.at_step) if FLAGS.at_step != "random"
                   else rng.randint(FLAGS.train_steps // 10, FLAGS.train_steps * 6 // 10))
        cluster = LocalCluster(run_dir, FLAGS.num_ps, FLAGS.num_workers,
                               [*trainer_args, f"--save_checkpoint_steps={FLAGS.save_checkpoint_steps}",
                                f"--train_steps={FLAGS.train_steps}"], preload=FLAGS.preload)
        what = f"pausing {job} {index} for {FLAGS.pause_secs:g} s" if FLAGS.pause_secs else f"killing {job} {index}"
        print(f"{what} at global step {at_step}; logs in {run_dir}", flush=True)
        with cluster:
            report = faults.kill_and_restart(cluster, str(model_dir), job, index, at_step,
                                             FLAGS.restart_delay_secs, FLAGS.timeout_secs, FLAGS.pause_secs)
        ok = report.finished and report.final_step is not None and report.final_step >= FLAGS.train_steps
    print("\n".join(report.lines()))
    if FLAGS.report_json:
        with open(FLAGS.report_json, "w") as f:
            json.dump({**report.as_dict(), "ok": ok}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    app.run(main)
