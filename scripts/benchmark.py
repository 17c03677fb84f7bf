#!/usr/bin/env python3
"""Benchmarks the trainer against single-process training, interleaved, and prints a table.

    python scripts/benchmark.py                         # every model and layout, 3 repetitions
    python scripts/benchmark.py --models=mlp --repetitions=5 --output_dir=bench/

For each model (the default mlp at batch 128, a 10M-parameter mlp, the cnn; wide_deep and
wide_deep_dynamic, on --models) it runs the same model and data as single-process training
(trainer.py with no cluster) and as clusters of 1 ps + 1 worker, 1 ps + 2 workers and 2 ps + 2
workers, async and sync, plus the levers (10 steps per run, on 1 and 2 ps and in one process;
float16 on the wire; 10 local steps; 4 accumulated batches), one repetition of every layout before
the next repetition, so that machine noise hits them all alike. Each run is real processes on
127.0.0.1. Throughput is steady state: examples per second from the chief's progress lines after a
warm-up. Startup is measured too: launch to every worker's first step, the chief's first step to
every worker's ("lag"), and the last step to every process gone. TF2's ParameterServerStrategy and
MultiWorkerMirroredStrategy run the default MLP (scripts/tf2_baselines.py), each compared with the
trainer's 1 ps + 2 workers ("trainer x"). Prints medians and ratios to single-process; writes
results.json and results.png into --output_dir. Trainer flags after '--' go to every run (e.g.
--wire_dtype=bfloat16); --layouts picks layouts by name.
"""

import dataclasses
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

import tensorflow as tf
from absl import app, flags

from ps_trainer import input as inputs
from ps_trainer import model as mdl
from ps_trainer.cluster import spec
from ps_trainer.launch import measure, terminal
from ps_trainer.launch.processes import LocalCluster, SingleProcess
from ps_trainer.training import evaluator, exit_codes, log_lines, plan, preemption, run_record
from ps_trainer.training.config import RunConfig, TrainConfig

flags.DEFINE_list("models", ["mlp", "mlp10m", "cnn"], "Models to run.")
flags.DEFINE_list("layouts", [], "Layouts to run, by name as printed (default: all); the single process always "
                  "runs, as the reference.")
flags.DEFINE_integer("repetitions", 3, "Repetitions of every layout.", lower_bound=1)
flags.DEFINE_integer("warmup_steps", 300, "Global steps before measuring: past the first epoch, which "
                     "makes the cached data.", lower_bound=1)
flags.DEFINE_integer("measure_steps", 800, "Global steps measured.", lower_bound=1)
flags.DEFINE_string("output_dir", "runs/benchmark", "Where logs, results.json and results.png go.")
flags.DEFINE_float("target_accuracy", None, "Time-to-accuracy mode: train each layout for a time budget, with a "
                   "checkpoint every second, evaluate every checkpoint on the held-out split afterwards, and "
                   "report the time from the first step to the first checkpoint at this held-out accuracy, its "
                   "ratio to the single process, and the last checkpoint's accuracy.", lower_bound=0, upper_bound=1)
flags.DEFINE_float("budget_factor", 3.0, "Time-to-accuracy mode: each layout trains for this many times the "
                   "single process's time to the target (measured first in each repetition), plus 10 s.",
                   lower_bound=1)
flags.DEFINE_string("summarize", None, "Run nothing: print the table of an earlier run's results.json (and "
                    "redraw its results.png beside it).")
FLAGS = flags.FLAGS

MODELS = {
    "mlp": ["--model=mlp", "--hidden_units=256", "--batch_size=128"],
    "mlp10m": ["--model=mlp", "--hidden_units=4096,1600", "--batch_size=128"],  # 9.8M parameters
    "cnn": ["--model=cnn", "--batch_size=64"],
    # Click-log models on zipf_clicks (13 numeric and 26 categorical columns, Zipf-distributed IDs):
    # hashed tables of 10,000 rows a column, and dynamic tables that grow with the IDs met.
    "wide_deep": ["--model=wide_deep", "--dataset=zipf_clicks", "--synthetic_examples=200000", "--batch_size=256"],
    "wide_deep_dynamic": ["--model=wide_deep", "--dataset=zipf_clicks", "--synthetic_examples=200000",
                          "--batch_size=256", "--embedding=dynamic", "--embedding_growth",
                          "--embedding_capacity=4000000"],
    # and with a user's history besides: a multi-valued column of 0 to 50 items, about 12 an example.
    "wide_deep_history": ["--model=wide_deep", "--dataset=zipf_clicks", "--synthetic_examples=200000",
                          "--batch_size=256", "--multi_valued_columns=history"],
}
# Fewer measured steps for the slow models, so that a run takes tens of seconds, not minutes.
STEP_SCALE = {"mlp": 1.0, "mlp10m": 0.25, "cnn": 0.25, "wide_deep": 0.5, "wide_deep_dynamic": 0.5,
              "wide_deep_history": 0.5}
# Models with tables on the ps: --accumulate_batches refuses them (flags/config.check_dense_lever), so
# its layouts are not run for them; --local_steps copies the rows of a round (hashed tables) or keeps
# the tables on the ps a step at a time (dynamic ones) and copies the rest.
TABLE_MODELS = {"wide_deep", "wide_deep_dynamic", "wide_deep_history"}
DENSE_LEVERS = ("--accumulate_batches=",)
# Time-to-accuracy mode: how long a reference layout trains (a target it misses in this time is too high).
REFERENCE_BUDGET_SECS = 40


# The levers at the settings README recommends for small dense models: the per-run cost of the
# session and its hooks paid once per 10 steps; a round trip per 10 local steps (async) or per 4
# accumulated batches (sync).
RECOMMENDED_STEPS_PER_RUN = 10
RECOMMENDED_LOCAL_STEPS = 10
RECOMMENDED_ACCUMULATE = 4


@dataclasses.dataclass(frozen=True)
class Layout:
    name: str
    num_ps: int = 0  # 0: single process
    num_workers: int = 1
    sync: bool = False
    tf2_strategy: str | None = None  # a TF2 alternative, by scripts/tf2_baselines.py (mlp models only)
    trainer_args: tuple[str, ...] = ()  # the levers this layout adds
    pinned: bool = False  # every task on a core of its own (os.sched_setaffinity): what a host of its own keeps
    reference: str = "single process"  # the layout its ratio is to

    @property
    def single(self) -> bool:
        return self.num_ps == 0 and not self.tf2_strategy

    @property
    def batches_per_step(self) -> int:
        """Batches one global step covers: every worker's in a sync round, times its accumulated ones."""
        accumulated = next((int(a.split("=")[1]) for a in self.trainer_args if a.startswith("--accumulate_batches=")),
                           1)
        return (self.num_workers if self.sync else 1) * accumulated


LOCAL = f"--local_steps={RECOMMENDED_LOCAL_STEPS}"
PER_RUN = f"--steps_per_run={RECOMMENDED_STEPS_PER_RUN}"
ACCUMULATE = f"--accumulate_batches={RECOMMENDED_ACCUMULATE}"
LAYOUTS = [
    Layout("single process"),
    Layout("1 ps + 1 worker", 1, 1),
    Layout("1 ps + 2 workers", 1, 2),
    Layout("2 ps + 2 workers", 2, 2),
    Layout("1 ps + 2 workers 10/run", 1, 2, trainer_args=(PER_RUN,)),
    Layout("2 ps + 2 workers 10/run", 2, 2, trainer_args=(PER_RUN,)),
    # The same lever in one process: what it saves there (the ratios stay to the plain single process).
    Layout("single process 10/run", trainer_args=(PER_RUN,)),
    Layout("1 ps + 2 workers 10 local", 1, 2, trainer_args=(LOCAL,)),
    Layout("2 ps + 2 workers 10 local", 2, 2, trainer_args=(LOCAL,)),
    Layout("1 ps + 1 worker f16 wire", 1, 1, trainer_args=("--wire_dtype=float16",)),
    Layout("1 ps + 2 workers sync", 1, 2, sync=True),
    Layout("1 ps + 2 workers sync 4 acc", 1, 2, sync=True, trainer_args=(ACCUMULATE,)),
    Layout("2 ps + 2 workers sync", 2, 2, sync=True),
    Layout("single process 1 core", pinned=True),
    Layout("1 ps + 1 worker own cores", 1, 1, pinned=True, reference="single process 1 core"),
    Layout("1 ps + 1 worker own cores 10 local", 1, 1, trainer_args=(LOCAL,), pinned=True,
           reference="single process 1 core"),
    Layout("TF2 ParameterServerStrategy", 1, 2, tf2_strategy="ps"),
    Layout("TF2 MultiWorkerMirrored", 0, 2, tf2_strategy="mwms"),
]
# The trainer layouts each TF2 alternative is compared with: plain, and with the lever on.
COMPARED_WITH_TF2 = ("1 ps + 2 workers", "1 ps + 2 workers 10 local")


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
    cpu_ms_per_step: dict | None = None  # task: CPU ms per global step, measured past the warm-up
    loopback_bytes_per_step: float | None = None
    time_to_target_secs: float | None = None  # time-to-accuracy mode: first step to the target
    final_accuracy: float | None = None  # held-out accuracy of the last checkpoint
    rpcs_per_step: float | None = None  # one worker's RPCs per global step (async layouts; counted, not timed)
    accuracy_curve: list | None = None  # time-to-accuracy mode: [seconds from the first step, held-out accuracy]


def trainer_args(model: str, layout: Layout, extra_args, directory: pathlib.Path) -> list[str]:
    if FLAGS.target_accuracy is None:
        steps = int(FLAGS.warmup_steps + FLAGS.measure_steps * STEP_SCALE[model])
        # A run that stops learning is measured to its end; its held-out accuracy shows it.
        run = [f"--train_steps={steps}", "--save_checkpoint_secs=100000", "--synthetic_examples=20000",
               "--not_learning=warn"]
    else:  # stopped at its time budget; a checkpoint every second, every one kept for the evaluation; the
        # default dataset's size (on 20,000 examples held-out accuracy levels off early, at 0.83)
        run = ["--train_steps=100000000", "--save_checkpoint_secs=1", "--keep_checkpoint_max=100000",
               "--export_saved_model=false", "--not_learning=off", "--synthetic_examples=60000"]
    args = [f"--model_dir={directory / 'model'}", *MODELS[model], *run, "--log_every_n_steps=20",
            "--save_summaries_steps=100000", *extra_args, *layout.trainer_args]
    return args + (["--sync_replicas"] if layout.sync else [])


def _name_and_value(arg: str):
    """('name', 'value') of --name=value; ('name', True) of a bare --name."""
    name, _, value = arg[2:].partition("=")
    return name, value or True


def layout_config(model: str, layout: Layout) -> RunConfig:
    """The RunConfig of one worker of an async layout, for counting its round trips."""
    args = dict(_name_and_value(arg) for arg in [*MODELS[model], *layout.trainer_args])
    model_cfg = mdl.ModelConfig(name=args["model"], **({"hidden_units": tuple(int(u) for u in args["hidden_units"]
                                                                             .split(","))}
                                                      if "hidden_units" in args else {}),
                                embedding=args.get("embedding", "hashed"),
                                embedding_growth=bool(args.get("embedding_growth", False)),
                                embedding_capacity=int(args.get("embedding_capacity", 100000)),
                                embedding_partitions=max(1, layout.num_ps))
    local = int(args.get("local_steps", 1))
    needs = mdl.needs_of(model_cfg.name)
    optimizer = needs.default_optimizer or TrainConfig.optimizer
    path = plan.step_path(plan.StepSettings(
        local_steps=local, steps_per_run=int(args.get("steps_per_run", 1)), has_tables=needs.partitioned_tables,
        tables_take_rounds=plan.tables_take_rounds(needs, model_cfg.embedding, optimizer),
        model=model_cfg.name, distributed=True))
    train = TrainConfig(batch_size=BATCH[model], local_steps=local, step_path=path, optimizer=optimizer,
                        wire_dtype=args.get("wire_dtype", "float32"))
    cluster = spec.ClusterConfig(("ps",) * layout.num_ps, ("worker",), "worker", 0)
    return RunConfig(cluster, train, model_cfg, inputs.DataConfig(name=args.get("dataset", "synthetic"),
                                                                  synthetic_examples=2000))


def rpcs_per_step(model: str, layout: Layout) -> float | None:
    """RPCs per global step of one worker (launch/measure.round_trips), for async trainer layouts."""
    if layout.single or layout.sync or layout.tf2_strategy:
        return None
    cfg = layout_config(model, layout)
    if model in TABLE_MODELS and cfg.train.local_steps > 1 and cfg.train.batches_per_read == 1:
        return None  # a run is one step, and every Kth run's push rides on it: one run's count would mislead
    return measure.round_trips(cfg).per_step


def run_once(model: str, layout: Layout, repetition: int, extra_args, run_dir: pathlib.Path,
             budget_secs: float | None = None) -> Result:
    """One run of a layout; in time-to-accuracy mode, stopped `budget_secs` after its first step."""
    if layout.tf2_strategy:
        return run_tf2(model, layout, repetition)
    directory = run_dir / f"{model}-{layout.name.replace(' ', '_').replace('+', '').replace(',', '')}-{repetition}"
    # Fresh: a run into the directory of an earlier one would resume its checkpoint and append to its logs.
    shutil.rmtree(directory, ignore_errors=True)
    args = trainer_args(model, layout, extra_args, directory)
    if layout.single:
        cluster = SingleProcess(directory, args)
    else:
        cluster = LocalCluster(directory, layout.num_ps, layout.num_workers, args)
    with cluster:
        start = time.time()
        pids = start_pinned(cluster, layout)
        chief_log = cluster.log_path(*CHIEF)
        with measure.StepSampler(chief_log, pids) as sampler:
            if budget_secs is None:
                codes = cluster.wait("worker", timeout=1800)
                # A ps serves until every worker has finished: after a worker that failed it waits for a
                # restart, which a benchmark never makes.
                codes.update(cluster.wait(timeout=60))
            else:
                def alive():
                    return all(proc.poll() is None for _, proc in cluster.tasks())

                if measure.wait_for_first_step(chief_log, 600, alive) is not None:
                    deadline = time.monotonic() + budget_secs
                    while alive() and time.monotonic() < deadline:
                        time.sleep(0.5)
                cluster.stop_all(grace_secs=preemption.DEADLINE_SECS + 10)  # the trainer bounds its own stop
                codes = {key: 0 if code in (0, exit_codes.PREEMPTED) else code for key, code in cluster.wait().items()}
        end = time.time()
    logs = [cluster.log(*task) for task in worker_tasks(layout)]
    warmup = FLAGS.warmup_steps
    cost = sampler.cost(warmup)
    result = Result(model, layout.name, repetition,
                    log_lines.examples_per_sec(logs[0], BATCH[model] * layout.batches_per_step, warmup),
                    *_first_steps(logs, start), _exit_secs(logs, end), set(codes.values()) == {0},
                    cost.cpu_ms if cost else None, cost.loopback_bytes if cost else None)
    held_out = log_lines.finished_values(logs[0]).get("heldout_accuracy")
    result.final_accuracy = float(held_out) if held_out else None  # the chief's final evaluation
    if budget_secs is not None:
        result.accuracy_curve = accuracy_curve(directory / "model", logs[0])
        result.time_to_target_secs = next((secs for secs, accuracy in result.accuracy_curve
                                           if accuracy >= FLAGS.target_accuracy), None)
        result.final_accuracy = result.accuracy_curve[-1][1] if result.accuracy_curve else None
    return result


CHIEF = ("worker", 0)
BATCH = {model: int(next(a for a in args if a.startswith("--batch_size")).split("=")[1])
         for model, args in MODELS.items()}


def worker_tasks(layout):
    return [CHIEF] if layout.single else [("worker", i) for i in range(layout.num_workers)]


def start_pinned(cluster, layout) -> dict[str, int]:
    """Starts every task (ps first); with layout.pinned, each on a core of its own, the chief on core 0.
    Returns task name: pid."""
    tasks = [("ps", i) for i in range(layout.num_ps)] + worker_tasks(layout)
    cores = sorted(os.sched_getaffinity(0))
    pids = {}
    for position, task in enumerate(sorted(tasks, key=lambda t: t != CHIEF)):  # the chief first, on core 0
        proc = cluster.start(*task)
        if layout.pinned:  # before TensorFlow starts its threads, which inherit the mask
            os.sched_setaffinity(proc.pid, {cores[position % len(cores)]})
        pids[f"{task[0]} {task[1]}"] = proc.pid
    return pids


def accuracy_curve(model_dir: pathlib.Path, chief_log: str) -> list[tuple[float, float]]:
    """[(seconds from the chief's first step to a checkpoint's save, its held-out accuracy)] for every
    checkpoint of the run, evaluated here, after the run, so that no evaluation competes with training."""
    state = tf.train.get_checkpoint_state(str(model_dir))
    first = log_lines.first_steps(chief_log)
    if state is None or not first:
        return []
    cfg, _ = run_record.follow(RunConfig(spec.ClusterConfig(), TrainConfig(model_dir=str(model_dir)),
                                         mdl.ModelConfig(), inputs.DataConfig()), run_record.read(str(model_dir)))
    return [(round(os.path.getmtime(path + ".index") - first[0].time.timestamp(), 2),
             round(evaluator.evaluate(cfg, path)[1]["accuracy"], 4)) for path in state.all_model_checkpoint_paths]


# The TF2 alternatives run the default MLP only: on the 10M-parameter one ParameterServerStrategy
# takes minutes per run here, and the CNN would need a Keras-free copy of the trainer's.
TF2_MODELS = {"mlp"}


def run_tf2(model, layout, repetition) -> Result:
    if model not in TF2_MODELS or FLAGS.target_accuracy is not None:
        return Result(model, layout.name, repetition, None, None, None, None, True)
    steps = int(FLAGS.warmup_steps + FLAGS.measure_steps * STEP_SCALE[model])
    hidden = next(a for a in MODELS[model] if a.startswith("--hidden_units"))
    per_worker = max(1, FLAGS.warmup_steps // layout.num_workers)
    proc = subprocess.run(
        [sys.executable, str(pathlib.Path(__file__).with_name("tf2_baselines.py")), f"--strategy={layout.tf2_strategy}",
         f"--num_workers={layout.num_workers}", hidden, f"--batch_size={BATCH[model]}", f"--warmup_steps={per_worker}",
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
            cpu, single_cpu = _median_cpu(results, model, layout.name), _median_cpu(results, model, layout.reference)
            rows.append({
                "model": model, "layout": layout.name,
                "examples_per_sec": _median(results, model, layout.name, "examples_per_sec"),
                "vs_single": _median_ratio(results, model, layout.name, layout.reference, "examples_per_sec"),
                "trainer_vs_this": ({name: _median_ratio(results, model, name, layout.name, "examples_per_sec")
                                     for name in COMPARED_WITH_TF2} if layout.tf2_strategy else None),
                "cpu_ms_per_step": cpu,
                # per batch: a sync global step is a batch of every worker (times its accumulated ones)
                "cpu_ms_beyond_single": (None if cpu is None or single_cpu is None or layout.single
                                         else sum(cpu.values()) / layout.batches_per_step - sum(single_cpu.values())),
                "rpcs_per_step": _median(results, model, layout.name, "rpcs_per_step"),
                "loopback_kb_per_step": _scaled(_median(results, model, layout.name, "loopback_bytes_per_step"), 1e-3),
                "time_to_target_secs": _median(results, model, layout.name, "time_to_target_secs"),
                # single's time over this one's: above 1 is faster to the target
                "time_to_target_vs_single": _median_ratio(results, model, layout.reference, layout.name,
                                                          "time_to_target_secs"),
                "final_accuracy": _median(results, model, layout.name, "final_accuracy"),
                "first_step_secs": _median(results, model, layout.name, "first_step_secs"),
                "first_step_lag_secs": _median(results, model, layout.name, "first_step_lag_secs"),
                "exit_secs": _median(results, model, layout.name, "exit_secs"),
                "failed_runs": sum(not r.ok for r in results if r.model == model and r.layout == layout.name),
            })
    return rows


def _median_ratio(results, model, layout, reference, field):
    """Median over repetitions of layout's field over reference's in the same repetition."""
    def value(name, repetition):
        return next((getattr(r, field) for r in results if r.model == model and r.layout == name and r.ok
                     and r.repetition == repetition and getattr(r, field)), None)
    ratios = [value(layout, rep) / value(reference, rep) for rep in sorted({r.repetition for r in results})
              if value(layout, rep) and value(reference, rep)]
    return statistics.median(ratios) if ratios else None


def _median(results, model, layout, field):
    values = [getattr(r, field) for r in results if r.model == model and r.layout == layout and r.ok
              and getattr(r, field) is not None]
    return statistics.median(values) if values else None


def _median_cpu(results, model, layout) -> dict | None:
    """Per task, the median over repetitions of its CPU ms per global step."""
    runs = [r.cpu_ms_per_step for r in results if r.model == model and r.layout == layout and r.ok
            and r.cpu_ms_per_step]
    return {task: statistics.median(run[task] for run in runs) for task in runs[0]} if runs else None


def _scaled(value, factor):
    return None if value is None else value * factor


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def table(rows) -> str:
    accuracy_mode = any(row["time_to_target_secs"] is not None for row in rows)
    lines = [f"{'model':7} {'layout':37} {'examples/s':>10} {'x ref':>6} {'trainer x':>10} "
             + (f"{'to target s':>11} {'x ref':>6} " if accuracy_mode else "") + f"{'final acc':>9} "
             + f"{'CPU ms/step':>11} {'+ per batch':>11} {'lo KB/step':>10} {'RPCs/step':>9} {'1st step s':>10} "
             f"{'exit s':>6} failed"]
    for row in rows:
        versus = row["trainer_vs_this"]
        lines.append(
            f"{row['model']:7} {row['layout']:37} {_fmt(row['examples_per_sec'], '10.0f')} "
            f"{_fmt(row['vs_single'], '6.2f')} "
            f"{'/'.join(_fmt(v, '.2f') for v in versus.values()) if versus else '-':>10} "
            + (f"{_fmt(row['time_to_target_secs'], '11.1f')} {_fmt(row['time_to_target_vs_single'], '6.2f')} "
               if accuracy_mode else "") + f"{_fmt(row['final_accuracy'], '9.3f')} "
            + f"{_fmt(row['cpu_ms_per_step'] and sum(row['cpu_ms_per_step'].values()), '11.2f')} "
            f"{_fmt(row['cpu_ms_beyond_single'], '11.2f')} {_fmt(row['loopback_kb_per_step'], '10.1f')} "
            f"{_fmt(row.get('rpcs_per_step'), '9.2f')} "
            f"{_fmt(row['first_step_secs'], '10.1f')} {_fmt(row['exit_secs'], '6.1f')} {row['failed_runs']}")
    lines.append("CPU ms/step: every task's, per global step; + per batch: beyond the reference's, per batch "
                 "trained.")
    lines.append("x ref: examples/s over the reference layout's (single process; the pinned layouts: single "
                 "process 1 core). trainer x: the trainer's 1 ps + 2 workers (plain/10 local) over this.")
    lines += [f"  {row['model']} {row['layout']}: CPU ms per global step "
              + ", ".join(f"{task} {ms:.2f}" for task, ms in row["cpu_ms_per_step"].items())
              for row in rows if row["cpu_ms_per_step"] and len(row["cpu_ms_per_step"]) > 1]
    return "\n".join(lines)


def chart(rows, path):
    import matplotlib  # noqa: PLC0415  (matplotlib only for --chart)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415  (matplotlib only for --chart)
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


def budget(layout, done: dict) -> float | None:
    """Time-to-accuracy mode: a reference trains for REFERENCE_BUDGET_SECS; any other layout for
    --budget_factor times its reference's time to the target (as just measured), plus 10 s."""
    if FLAGS.target_accuracy is None:
        return None
    reference = done.get(layout.reference)
    if layout.name == layout.reference or reference is None or reference.time_to_target_secs is None:
        return REFERENCE_BUDGET_SECS
    return FLAGS.budget_factor * reference.time_to_target_secs + 10


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
    known = [layout.name for layout in LAYOUTS]
    unknown = set(FLAGS.layouts) - set(known)
    if unknown:
        raise app.UsageError(f"--layouts: unknown {', '.join(sorted(unknown))}; known: {', '.join(known)}")
    chosen = [layout for layout in LAYOUTS if not FLAGS.layouts or layout.name in FLAGS.layouts]
    needed = {layout.name for layout in chosen} | {layout.reference for layout in chosen} | {"single process"}
    layouts = [layout for layout in LAYOUTS if layout.name in needed]  # references first, as listed
    results = []
    for repetition in range(FLAGS.repetitions):
        for model in FLAGS.models:
            done = {}
            for layout in layouts:
                if model in TABLE_MODELS and any(arg.startswith(DENSE_LEVERS) for arg in layout.trainer_args):
                    results.append(Result(model, layout.name, repetition, None, None, None, None, True))
                    continue
                result = run_once(model, layout, repetition, argv[1:], out / "logs", budget(layout, done))
                if repetition == 0:  # counted once, in this process, after the run (never beside one)
                    result.rpcs_per_step = rpcs_per_step(model, layout)
                results.append(result)
                done[layout.name] = result
                print(f"rep {repetition} {model:7} {layout.name:37} {_fmt(result.examples_per_sec, '8.0f')} ex/s "
                      f"first step {_fmt(result.first_step_secs, '.1f')} s, exit {_fmt(result.exit_secs, '.1f')} s"
                      + (f", target in {_fmt(result.time_to_target_secs, '.1f')} s" if FLAGS.target_accuracy is not None
                         else "") + f", held-out accuracy {_fmt(result.final_accuracy, '.3f')}"
                      + f"{'' if result.ok else '  FAILED'}", flush=True)
    rows = summarize(results, layouts)
    print("\n" + table(rows))
    (out / "results.json").write_text(json.dumps({"args": argv[1:], "rows": rows,
                                                   "runs": [dataclasses.asdict(r) for r in results]}, indent=1))
    chart(rows, out / "results.png")
    print(f"\nwrote {out / 'results.json'} and {out / 'results.png'}")


if __name__ == "__main__":
    app.run(main)
