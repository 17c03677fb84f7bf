#!/usr/bin/env python3
"""Benchmarks the trainer against single-process training, interleaved, and prints a table.

    python scripts/benchmark.py                         # every model and layout, 3 repetitions
    python scripts/benchmark.py --models=mlp --repetitions=5 --output_dir=bench/

For each model (the default mlp at batch 128, a 10M-parameter mlp, the cnn) it runs the same model
and data as single-process training (trainer.py with no cluster) and as clusters of 1 ps + 1
worker, 1 ps + 2 workers and 2 ps + 2 workers, async and sync, plus two levers (10 steps per run;
float16 on the wire), one repetition of every layout before the next repetition, so that machine
noise hits them all alike. Each run is real processes on 127.0.0.1. Throughput is steady state:
examples per second from the chief's progress lines after a warm-up. Startup is measured too:
launch to every worker's first step, the chief's first step to every worker's ("lag"), and the
last step to every process gone. TF2's ParameterServerStrategy and MultiWorkerMirroredStrategy run
the default MLP (scripts/tf2_baselines.py), each compared with the trainer's 1 ps + 2 workers
("trainer x"). Prints medians and ratios to single-process; writes results.json and results.png
into --output_dir. Trainer flags after '--' go to every run (e.g. --wire_dtype=bfloat16);
--layouts picks layouts by name.
"""

import dataclasses
import json
import pathlib
import statistics
import subprocess
import sys
import time

from absl import app, flags

from launch import terminal
from launch.processes import TRAINER, LocalCluster
from training import log_lines

flags.DEFINE_list("models", ["mlp", "mlp10m", "cnn"], "Models to run.")
flags.DEFINE_list("layouts", [], "Layouts to run, by name as printed (default: all); the single process always "
                  "runs, as the reference.")
flags.DEFINE_integer("repetitions", 3, "Repetitions of every layout.", lower_bound=1)
flags.DEFINE_integer("warmup_steps", 300, "Global steps before measuring: past the first epoch, which "
                     "makes the cached data.", lower_bound=1)
flags.DEFINE_integer("measure_steps", 800, "Global steps measured.", lower_bound=1)
flags.DEFINE_string("output_dir", "runs/benchmark", "Where logs, results.json and results.png go.")
flags.DEFINE_string("summarize", None, "Run nothing: print the table of an earlier run's results.json (and "
                    "redraw its results.png beside it).")
FLAGS = flags.FLAGS

MODELS = {
    "mlp": ["--model=mlp", "--hidden_units=256", "--batch_size=128"],
    "mlp10m": ["--model=mlp", "--hidden_units=4096,1600", "--batch_size=128"],  # 9.8M parameters
    "cnn": ["--model=cnn", "--batch_size=64"],
}
# Fewer measured steps for the slow models, so that a run takes tens of seconds, not minutes.
STEP_SCALE = {"mlp": 1.0, "mlp10m": 0.25, "cnn": 0.25}


# What README recommends for small dense models in async mode: the per-run cost of the session
# and its hooks paid once per 10 steps.
RECOMMENDED_STEPS_PER_RUN = 10


@dataclasses.dataclass(frozen=True)
class Layout:
    name: str
    num_ps: int = 0  # 0: single process
    num_workers: int = 1
    sync: bool = False
    tf2_strategy: str | None = None  # a TF2 alternative, by scripts/tf2_baselines.py (mlp models only)
    trainer_args: tuple[str, ...] = ()  # the levers this layout adds

    @property
    def single(self) -> bool:
        return self.num_ps == 0 and not self.tf2_strategy


LAYOUTS = [
    Layout("single process"),
    Layout("1 ps + 1 worker", 1, 1),
    Layout("1 ps + 2 workers", 1, 2),
    Layout("2 ps + 2 workers", 2, 2),
    Layout("1 ps + 2 workers 10/run", 1, 2, trainer_args=(f"--steps_per_run={RECOMMENDED_STEPS_PER_RUN}",)),
    Layout("1 ps + 1 worker f16 wire", 1, 1, trainer_args=("--wire_dtype=float16",)),
    Layout("1 ps + 2 workers sync", 1, 2, sync=True),
    Layout("2 ps + 2 workers sync", 2, 2, sync=True),
    Layout("TF2 ParameterServerStrategy", 1, 2, tf2_strategy="ps"),
    Layout("TF2 MultiWorkerMirrored", 0, 2, tf2_strategy="mwms"),
]


@dataclasses.dataclass
class Result:
    model: str
    layout: str
    repetition: int
    examples_per_sec: float | None
    first_step_secs: float | None  # launch to every worker's first step
    first_step_lag_secs: float | None  # the chief's first step to every worker's
    exit_secs: float | None  # last step to every process gone
    ok: bool


def run_once(model: str, layout: Layout, repetition: int, extra_args, run_dir: pathlib.Path) -> Result:
    steps = int(FLAGS.warmup_steps + FLAGS.measure_steps * STEP_SCALE[model])
    warmup = FLAGS.warmup_steps
    batch = int(next(a for a in MODELS[model] if a.startswith("--batch_size")).split("=")[1])
    args = [*MODELS[model], f"--train_steps={steps}", "--log_every_n_steps=20", "--save_checkpoint_secs=100000",
            "--save_summaries_steps=100000", "--synthetic_examples=20000", *extra_args]
    args += layout.trainer_args
    if layout.sync:
        args.append("--sync_replicas")
    per_step = batch * (layout.num_workers if layout.sync else 1)
    name = f"{model}-{layout.name.replace(' ', '_').replace('+', '')}-{repetition}"
    directory = run_dir / name
    if layout.tf2_strategy:
        return run_tf2(model, layout, repetition, batch, steps)
    if layout.num_ps == 0:
        directory.mkdir(parents=True, exist_ok=True)
        log_path = directory / "local-0.log"
        start = time.time()
        with open(log_path, "wb") as log:
            proc = subprocess.run([sys.executable, str(TRAINER), f"--model_dir={directory / 'model'}", *args],
                                  stdout=log, stderr=subprocess.STDOUT, timeout=1800)
        end = time.time()
        text = log_path.read_text(errors="replace")
        return Result(model, layout.name, repetition, log_lines.examples_per_sec(text, per_step, warmup),
                      *_first_steps([text], start), _exit_secs([text], end), proc.returncode == 0)
    cluster = LocalCluster(directory, layout.num_ps, layout.num_workers, [f"--model_dir={directory / 'model'}", *args])
    with cluster:
        start = time.time()
        cluster.start_all()
        codes = cluster.wait(timeout=1800)
        end = time.time()
    logs = [cluster.log("worker", i) for i in range(layout.num_workers)]
    return Result(model, layout.name, repetition, log_lines.examples_per_sec(logs[0], per_step, warmup),
                  *_first_steps(logs, start), _exit_secs(logs, end), set(codes.values()) == {0})


# The TF2 alternatives run the default MLP only: on the 10M-parameter one ParameterServerStrategy
# takes minutes per run here, and the CNN would need a Keras-free copy of the trainer's.
TF2_MODELS = {"mlp"}


def run_tf2(model, layout, repetition, batch, steps) -> Result:
    if model not in TF2_MODELS:
        return Result(model, layout.name, repetition, None, None, None, None, True)
    hidden = next(a for a in MODELS[model] if a.startswith("--hidden_units"))
    per_worker = max(1, FLAGS.warmup_steps // layout.num_workers)
    proc = subprocess.run(
        [sys.executable, str(pathlib.Path(__file__).with_name("tf2_baselines.py")), f"--strategy={layout.tf2_strategy}",
         f"--num_workers={layout.num_workers}", hidden, f"--batch_size={batch}", f"--warmup_steps={per_worker}",
         f"--measure_steps={max(1, (steps - FLAGS.warmup_steps) // layout.num_workers)}"],
        capture_output=True, text=True, timeout=1800)
    rates = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("examples/sec")]
    return Result(model, layout.name, repetition, float(rates[-1]) if rates else None, None, None, None, bool(rates))


def _first_steps(logs, start):
    """(launch to every worker's first step, the chief's first step to every worker's); chief first."""
    times = []
    for log in logs:
        first = log_lines.first_steps(log)
        if not first:
            return None, None
        times.append(first[0].time.timestamp() - start)  # log lines carry wall-clock times
    return max(times), max(times) - times[0]


def _exit_secs(logs, end):
    last = []
    for log in logs:
        lines = log_lines.task_lines(log)
        if not lines:
            return None
        last.append(lines[-1].time.timestamp())
    return end - max(last)


def summarize(results: list[Result], layouts) -> list[dict]:
    """Medians per model and layout. Ratios are medians of each repetition's own ratio, so that a
    machine that speeds up or slows down between repetitions (a shared VM does) moves both sides."""
    rows = []
    for model in sorted({r.model for r in results}, key=list(MODELS).index):
        for layout in layouts:
            rate = _median(results, model, layout.name, "examples_per_sec")
            rows.append({
                "model": model, "layout": layout.name, "examples_per_sec": rate,
                "vs_single": _median_ratio(results, model, layout.name, "single process"),
                "trainer_vs_this": (_median_ratio(results, model, "1 ps + 2 workers", layout.name)
                                    if layout.tf2_strategy else None),
                "first_step_secs": _median(results, model, layout.name, "first_step_secs"),
                "first_step_lag_secs": _median(results, model, layout.name, "first_step_lag_secs"),
                "exit_secs": _median(results, model, layout.name, "exit_secs"),
                "failed_runs": sum(not r.ok for r in results if r.model == model and r.layout == layout.name),
            })
    return rows


def _median_ratio(results, model, layout, reference):
    """Median over repetitions of layout's examples/sec over reference's in the same repetition."""
    def rate(name, repetition):
        return next((r.examples_per_sec for r in results if r.model == model and r.layout == name and r.ok
                     and r.repetition == repetition and r.examples_per_sec), None)
    ratios = [rate(layout, rep) / rate(reference, rep) for rep in sorted({r.repetition for r in results})
              if rate(layout, rep) and rate(reference, rep)]
    return statistics.median(ratios) if ratios else None


def _median(results, model, layout, field):
    values = [getattr(r, field) for r in results if r.model == model and r.layout == layout and r.ok
              and getattr(r, field) is not None]
    return statistics.median(values) if values else None


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def table(rows) -> str:
    lines = [f"{'model':8} {'layout':28} {'examples/s':>11} {'x single':>9} {'trainer x':>10} {'1st step s':>11} "
             f"{'lag s':>6} {'exit s':>7} failed"]
    for row in rows:
        lines.append(f"{row['model']:8} {row['layout']:28} {_fmt(row['examples_per_sec'], '11.0f')} "
                     f"{_fmt(row['vs_single'], '9.2f')} {_fmt(row['trainer_vs_this'], '10.2f')} "
                     f"{_fmt(row['first_step_secs'], '11.1f')} {_fmt(row['first_step_lag_secs'], '6.1f')} "
                     f"{_fmt(row['exit_secs'], '7.1f')} {row['failed_runs']}")
    return "\n".join(lines)


def chart(rows, path):
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    models = sorted({r["model"] for r in rows}, key=list(MODELS).index)
    figure, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = [r for r in rows if r["model"] == model]
        ax.barh([r["layout"] for r in mine], [r["vs_single"] or 0 for r in mine])
        ax.axvline(1.0, color="gray", linestyle="--")
        ax.set_title(f"{model}: examples/sec vs single process")
        ax.invert_yaxis()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def resummarize(path: pathlib.Path):
    runs = json.loads(path.read_text())["runs"]
    results = [Result(**{field.name: run.get(field.name) for field in dataclasses.fields(Result)}) for run in runs]
    names = {r.layout for r in results}
    rows = summarize(results, [layout for layout in LAYOUTS if layout.name in names])
    print(table(rows))
    chart(rows, path.with_name("results.png"))


def main(argv):
    if FLAGS.summarize:
        resummarize(pathlib.Path(FLAGS.summarize))
        return
    terminal.interrupt_on_signals()
    out = pathlib.Path(FLAGS.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    layouts = [layout for layout in LAYOUTS if not FLAGS.layouts or layout.name in FLAGS.layouts or layout.single]
    known = [layout.name for layout in LAYOUTS]
    unknown = set(FLAGS.layouts) - set(known)
    if unknown:
        raise app.UsageError(f"--layouts: unknown {', '.join(sorted(unknown))}; known: {', '.join(known)}")
    results = []
    for repetition in range(FLAGS.repetitions):
        for model in FLAGS.models:
            for layout in layouts:
                result = run_once(model, layout, repetition, argv[1:], out / "logs")
                results.append(result)
                print(f"rep {repetition} {model:7} {layout.name:24} {_fmt(result.examples_per_sec, '8.0f')} ex/s "
                      f"first step {_fmt(result.first_step_secs, '.1f')} s, exit {_fmt(result.exit_secs, '.1f')} s"
                      f"{'' if result.ok else '  FAILED'}", flush=True)
    rows = summarize(results, layouts)
    print("\n" + table(rows))
    (out / "results.json").write_text(json.dumps({"args": argv[1:], "rows": rows,
                                                   "runs": [dataclasses.asdict(r) for r in results]}, indent=1))
    chart(rows, out / "results.png")
    print(f"\nwrote {out / 'results.json'} and {out / 'results.png'}")


if __name__ == "__main__":
    app.run(main)
