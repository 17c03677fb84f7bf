#!/usr/bin/env python3
"""Times the same training job from two checkouts of ps-trainer, interleaved, and prints the phases.

    git worktree add /tmp/last-release <commit>
    python scripts/compare_releases.py --baselines=/tmp/last-release --repetitions=2

Each repetition runs the job once from each of --baselines and once from --candidate (default: this
tree), one after the other, so that machine noise hits them all alike. The job is real processes on 127.0.0.1
(default: 1 ps + 2 async workers, 3,000 steps of the default MLP at batch 128). For each run it
prints the whole job (launch to every process gone) and its three phases, read from the chief's
log: start-up (launch to the first step), the steps (first step to its last progress line, within
--log_every_n_steps of --train_steps) and the end (that line to every process gone: the last steps,
the ps shutdown, the export, the held-out figure). Both trees run with this Python, so they share one TensorFlow.
"""

import dataclasses
import pathlib
import statistics
import sys
import tempfile
import time
from datetime import datetime

from absl import app, flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from ps_trainer.launch.processes import LocalCluster  # noqa: E402
from ps_trainer.training import log_lines  # noqa: E402

flags.DEFINE_list("baselines", None, "Checkouts of the releases to compare with (e.g. git worktrees).",
                  required=True)
flags.DEFINE_string("candidate", str(pathlib.Path(__file__).resolve().parent.parent), "The checkout to compare.")
flags.DEFINE_integer("repetitions", 2, "Runs of each tree.", lower_bound=1)
flags.DEFINE_integer("num_workers", 2, "Workers of the job (with one ps).", lower_bound=1)
flags.DEFINE_integer("train_steps", 3000, "The job's --train_steps.", lower_bound=100)
flags.DEFINE_list("trainer_args", ["--batch_size=128", "--log_every_n_steps=100"], "Flags of every run.")
flags.DEFINE_integer("timeout_secs", 600, "A run still going after this long is stopped and reported.")
FLAGS = flags.FLAGS


@dataclasses.dataclass(frozen=True)
class Timing:
    whole: float
    startup: float
    steps: float
    end: float


class TreeCluster(LocalCluster):
    """A LocalCluster whose tasks run another checkout's trainer.py (with --nothread_spinning where the
    cores are short, if that tree has the flag)."""

    def __init__(self, tree: pathlib.Path, *args, **kwargs):
        knows_spinning = '"thread_spinning"' in (tree / "flags" / "definitions.py").read_text()
        super().__init__(*args, share_cores=knows_spinning, **kwargs)
        self.trainer = str(tree / "trainer.py")

    def command(self, job, index, extra_args=(), trainer=None):
        return super().command(job, index, extra_args, trainer=self.trainer)


def run_once(tree: pathlib.Path, run_dir: pathlib.Path) -> Timing:
    args = [f"--model_dir={run_dir / 'model'}", f"--train_steps={FLAGS.train_steps}", *FLAGS.trainer_args]
    cluster = TreeCluster(tree, run_dir, num_ps=1, num_workers=FLAGS.num_workers, trainer_args=args)
    launched = datetime.now()
    with cluster:
        cluster.start_all()
        codes = cluster.wait(timeout=FLAGS.timeout_secs)
        gone = datetime.now()
    if any(code != 0 for code in codes.values()):
        raise SystemExit(f"{tree}: a task did not exit 0 ({codes}); logs in {run_dir}")
    steps = log_lines.steps(cluster.log("worker", 0))
    first = next(step for step in steps if step.first)
    last = steps[-1]  # the last progress line: within --log_every_n_steps of --train_steps
    return Timing(whole=(gone - launched).total_seconds(), startup=(first.time - launched).total_seconds(),
                  steps=(last.time - first.time).total_seconds(), end=(gone - last.time).total_seconds())


def main(argv):
    del argv
    trees = {f"baseline{i}": pathlib.Path(path).resolve() for i, path in enumerate(FLAGS.baselines)}
    trees["candidate"] = pathlib.Path(FLAGS.candidate).resolve()
    results = {name: [] for name in trees}
    with tempfile.TemporaryDirectory(prefix="compare-releases-") as work:
        for repetition in range(FLAGS.repetitions):
            for name, tree in trees.items():
                timing = run_once(tree, pathlib.Path(work) / f"{name}-{repetition}")
                results[name].append(timing)
                print(f"{name:10s} run {repetition + 1}: whole {timing.whole:6.1f} s  start-up {timing.startup:5.1f} s"
                      f"  steps {timing.steps:6.1f} s  end {timing.end:5.1f} s", flush=True)
                time.sleep(1)
    for name, tree in trees.items():
        print(f"{name}: {tree}")
    print("\nmedians (s)       whole  start-up   steps     end")
    for name, timings in results.items():
        medians = [statistics.median(getattr(t, field) for t in timings)
                   for field in ("whole", "startup", "steps", "end")]
        print(f"{name:16s} " + "  ".join(f"{m:7.1f}" for m in medians))


if __name__ == "__main__":
    app.run(main)
