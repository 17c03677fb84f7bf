#!/usr/bin/env python3
"""Runs a real local cluster of trainer.py, or of a TF1 Estimator program: N ps and M workers on free
127.0.0.1 ports.

    python scripts/run_local.py                       # 1 ps + 2 workers, default model and data
    python scripts/run_local.py --num_ps=2 -- --sync_replicas --train_steps=3000
    python scripts/run_local.py --program=my_estimator_program.py -- --train_steps=3000

Flags after '--' go to every trainer.py (or program). A program (`import ps_trainer.estimator` added)
runs as a chief, --num_workers - 1 workers, the ps tasks and an evaluator, each told its role by
TF_CONFIG. Streams each worker's progress lines, waits for the workers, checks that every ps exited on
its own, prints a summary, and exits non-zero if any task failed. On Ctrl-C, SIGTERM or any failure it
stops every process it started, by process group.
"""

import pathlib

from absl import app, flags

from ps_trainer.launch import terminal
from ps_trainer.launch.processes import LocalCluster

flags.DEFINE_integer("num_ps", 1, "Number of ps tasks.", lower_bound=1)
flags.DEFINE_integer("num_workers", 2, "Number of worker tasks.", lower_bound=1)
flags.DEFINE_bool("preload", True, "Fork every task from one process that has imported the trainer (a --program's "
                  "from one that has imported TensorFlow alone): 3-4 s of CPU less each, and a first step sooner; "
                  "--nopreload starts each as `python trainer.py` (or `python PROGRAM`).")
flags.DEFINE_string("program", None, "A TF1 Estimator program (train_and_evaluate from TF_CONFIG, with "
                    "`import ps_trainer.estimator`) to run in place of trainer.py.")
terminal.define_flags("runs/<timestamp> (model_dir goes there too)", timeout_secs=1800, ps_exit_secs=30)
FLAGS = flags.FLAGS


def _given_model_dir(trainer_args):
    """The trainer's --model_dir as given (--model_dir=DIR or --model_dir DIR, the last one), else None."""
    for i in reversed(range(len(trainer_args))):
        flag, equals, value = trainer_args[i].partition("=")
        if flag == "--model_dir":
            return value if equals else (trainer_args[i + 1] if i + 1 < len(trainer_args) else None)
    return None


def main(argv):
    terminal.check_ports()
    trainer_args = argv[1:]
    run_dir = terminal.run_dir()
    model_dir = _given_model_dir(trainer_args)
    if model_dir is None:
        model_dir = run_dir / "model"
        trainer_args.append(f"--model_dir={model_dir}")
    if FLAGS.program and not pathlib.Path(FLAGS.program).is_file():
        raise app.UsageError(f"--program={FLAGS.program}: no such file")
    if FLAGS.program:  # the chief is one of the workers, as trainer.py's worker 0 is
        cluster = LocalCluster(run_dir, FLAGS.num_ps, FLAGS.num_workers - 1, trainer_args, chief=True,
                               preload=FLAGS.preload, program=FLAGS.program, evaluator=True)
    else:
        cluster = LocalCluster(run_dir, FLAGS.num_ps, FLAGS.num_workers, trainer_args, preload=FLAGS.preload)
    code = terminal.launch(cluster, FLAGS.timeout_secs, FLAGS.ps_exit_secs)
    if code == 0:
        print(f"checkpoints and summaries in {model_dir}")
    return code


if __name__ == "__main__":
    app.run(main)
