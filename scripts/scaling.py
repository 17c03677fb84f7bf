#!/usr/bin/env python3
"""Held-out accuracy and wall time per worker count: does learning hold as workers are added?

    python scripts/scaling.py                                   # mlp and cnn, 1/2/4/8 workers, async and sync
    python scripts/scaling.py --models=mlp --workers=1,4 --modes=async -- --momentum=0.9

Each run is a real local cluster (1 ps + N workers on 127.0.0.1) at the trainer's default optimizer
settings, trained on the same number of examples (--examples): async runs take examples / batch
global steps (one batch each), sync runs examples / (N * batch) (one batch per worker each). The
figure is the chief's own evaluation of the final checkpoint on the held-out split (the 'finished:'
line). A single process on the same examples is the reference. Trainer flags after '--' go to every
run. Prints a table and writes results.json into --output_dir.
"""

import json
import pathlib
import subprocess
import sys
import time

from absl import app, flags

from ps_trainer.launch import terminal
from ps_trainer.launch.processes import TRAINER, LocalCluster
from ps_trainer.training import log_lines

flags.DEFINE_list("models", ["mlp", "cnn"], "Models to run.")
flags.DEFINE_list("workers", ["1", "2", "4", "8"], "Worker counts.")
flags.DEFINE_list("modes", ["async", "sync"], "async, sync or both.")
flags.DEFINE_integer("examples", 192000, "Training examples every run sees, whatever its worker count.",
                     lower_bound=1)
flags.DEFINE_integer("batch_size", 64, "Per-worker batch size.", lower_bound=1)
flags.DEFINE_string("output_dir", None, "Where results.json and the runs go. Default: runs/scaling-<timestamp>.")
flags.DEFINE_integer("timeout_secs", 1200, "Give up on one run after this long.", lower_bound=1)
FLAGS = flags.FLAGS


def run_one(run_dir: pathlib.Path, model: str, workers: int | None, sync: bool, extra_args) -> dict:
    """Trains one layout (workers=None: a single process) and returns its figures."""
    per_step = FLAGS.batch_size * (workers if sync else 1)
    steps = max(1, FLAGS.examples // per_step)
    args = [f"--model_dir={run_dir / 'model'}", f"--model={model}", f"--train_steps={steps}",
            f"--batch_size={FLAGS.batch_size}", "--export_saved_model=false", "--save_checkpoint_secs=3600",
            *(["--sync_replicas"] if sync else []), *extra_args]
    start = time.monotonic()
    if workers is None:
        run_dir.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run([sys.executable, str(TRAINER), *args], capture_output=True, text=True,
                              timeout=FLAGS.timeout_secs, stdin=subprocess.DEVNULL)
        (run_dir / "local-0.log").write_text(proc.stderr)
        codes, chief_log = {("local", 0): proc.returncode}, proc.stderr
    else:
        with LocalCluster(run_dir, 1, workers, args) as cluster:
            cluster.start_all()
            codes = cluster.wait("worker", timeout=FLAGS.timeout_secs)
            codes.update(cluster.wait("ps", timeout=60))
            chief_log = cluster.log("worker", 0)
    result = log_lines.finished_values(chief_log)
    return {"model": model, "workers": workers or 0, "mode": "sync" if sync else "async", "global_steps": steps,
            "seconds": round(time.monotonic() - start, 1), "all_exit_0": all(c == 0 for c in codes.values()),
            "heldout_accuracy": float(result.get("heldout_accuracy", "nan")),
            "heldout_loss": float(result.get("heldout_loss", "nan"))}


def main(argv):
    terminal.interrupt_on_signals()
    output = pathlib.Path(FLAGS.output_dir or terminal.run_dir("scaling-")).resolve()
    extra_args = argv[1:]
    layouts = [(model, None, False) for model in FLAGS.models]
    layouts += [(model, int(n), mode == "sync") for model in FLAGS.models for mode in FLAGS.modes
                for n in FLAGS.workers]
    results = []
    print(f"{'model':6} {'layout':26} {'global steps':>12} {'held-out acc':>12} {'held-out loss':>13} "
          f"{'wall s':>7}  exits")
    for model, workers, sync in layouts:
        name = "single process" if workers is None else f"1 ps + {workers} workers, {'sync' if sync else 'async'}"
        result = run_one(output / f"{model}-{workers or 0}-{'sync' if sync else 'async'}", model, workers, sync,
                         extra_args)
        results.append(result)
        print(f"{model:6} {name:26} {result['global_steps']:>12} {result['heldout_accuracy']:>12.3f} "
              f"{result['heldout_loss']:>13.3f} {result['seconds']:>7.1f}  "
              f"{'all 0' if result['all_exit_0'] else 'FAILED'}", flush=True)
    (output / "results.json").write_text(json.dumps(results, indent=1))
    print(f"results in {output / 'results.json'}")
    return 0 if all(r["all_exit_0"] for r in results) else 1


if __name__ == "__main__":
    app.run(main)
