"""Session hooks of the training loop."""

import time

import tensorflow as tf
from absl import logging

from ps_trainer.cluster import spec
from ps_trainer.training import log_lines
from ps_trainer.training.config import NO_STEP_LIMIT

v1 = tf.compat.v1



class ProgressHook(v1.train.SessionRunHook):
    """Logs one line every `every_n` local steps: global step, loss, accuracy, examples/sec, time left;
    and writes this worker's global_step/sec and examples/sec as summaries into summary_dir.

    Loss and accuracy are fetched only on logging steps; the global step (which StopAtStepHook
    fetches anyway) every step, so the last step reached is known when something fails. With
    several steps per run (steps_done: how many a run took), a line is logged after each run that
    crosses a multiple of every_n. In an asynchronous cluster (measure_staleness) each line and summary
    also gives the interval's staleness, mean and max: the other workers' updates that landed between
    one run's read of the global step and the next run's, per own step. It costs nothing: the global
    step is fetched anyway. In steady state its mean is the mean staleness of an update (N-1 with N
    equal workers); each run's figure is an upper bound of that run's staleness (it also counts the
    updates that land between its update and the next run's read).
    """

    def __init__(self, task_name, loss, accuracy, train_steps, batch_size, every_n, summary_dir=None,
                 steps_done=None, steps_per_run=1, measure_staleness=False, metrics=None):
        self._task_name = task_name
        self._steps_done = steps_done
        self._measure_staleness = measure_staleness
        self._last_read = None  # (global step the last run read, its own steps), within this session
        self._staleness = []  # per run of this interval: (foreign updates, own steps)
        self._steps_per_run = steps_per_run
        self._fetches = {"loss": loss, "accuracy": accuracy}
        self._summary_dir = summary_dir
        self._writer = None
        self._metrics = metrics  # training/metrics.TaskMetrics, updated with each progress line
        self._train_steps = train_steps
        self._batch_size = batch_size
        self._every_n = every_n
        self.own_steps = 0
        self.sessions = 0  # training sessions made: more than one when MonitoredSession made one again
        self.global_step = None
        self.loss = None
        self.accuracy = None

    def begin(self):
        self._global_step_tensor = v1.train.get_global_step()

    def after_create_session(self, session, coord):
        self.global_step = int(session.run(self._global_step_tensor))
        self.sessions += 1
        if self.sessions > 1:
            log_lines.log_session_again(self._task_name, self.global_step)
        self._mark = (time.monotonic(), self.own_steps, self.global_step)
        self._last_read = None
        if self._summary_dir and self._writer is None:
            self._writer = v1.summary.FileWriter(self._summary_dir)

    def before_run(self, run_context):
        fetches = {"global_step": self._global_step_tensor}
        if self._steps_done is not None:
            fetches["steps_done"] = self._steps_done
        logs_now = (self.own_steps + self._steps_per_run) // self._every_n > self.own_steps // self._every_n
        if self.own_steps == 0 or logs_now:
            fetches.update(self._fetches)
        return v1.train.SessionRunArgs(fetches)

    def after_run(self, run_context, run_values):
        results = run_values.results
        steps = int(results.get("steps_done", 1))
        if steps == 0:  # a run past --train_steps (the loop's own check stopped it)
            return
        first_run = self.own_steps == 0
        self.own_steps += steps
        read = int(results["global_step"])
        self.global_step = read + steps
        if self._measure_staleness:
            if self._last_read is not None:
                last_read, last_steps = self._last_read
                self._staleness.append((max(0, read - last_read - last_steps), last_steps))
            self._last_read = (read, steps)
        if "loss" in results:
            self.loss, self.accuracy = float(results["loss"]), float(results["accuracy"])
        if first_run:
            log_lines.log_first_step(self._task_name, self.global_step, self.loss)
        elif "loss" in results:
            self._log()

    def end(self, session):
        # The per-step read can predate other workers' updates: ask the variable itself.
        self.global_step = int(session.run(self._global_step_tensor))
        if self._writer:
            if self.own_steps > self._mark[1]:  # the last, partial interval: every worker gets a point
                self._write_rates(*self._rates(), self._take_staleness())
            self._writer.close()

    def _rates(self):
        """(seconds, examples/sec, global steps/sec) since the last mark; moves the mark to now."""
        now = time.monotonic()
        then, then_own, then_global = self._mark
        elapsed = max(now - then, 1e-9)
        self._mark = (now, self.own_steps, self.global_step)
        return ((self.own_steps - then_own) * self._batch_size / elapsed,
                (self.global_step - then_global) / elapsed)

    def _take_staleness(self) -> dict[str, float]:
        """{'mean', 'max'} staleness per step over the interval (empty if not measured); resets it."""
        runs, self._staleness = self._staleness, []
        if not runs:
            return {}
        return {"mean": sum(foreign for foreign, _ in runs) / sum(steps for _, steps in runs),
                "max": max(foreign / steps for foreign, steps in runs)}

    def _write_rates(self, examples_per_sec, global_rate, staleness=None):
        if self._writer:
            rates = {"global_step/sec": global_rate, "examples/sec": examples_per_sec}
            rates.update({f"staleness/{name}": value for name, value in (staleness or {}).items()})
            self._writer.add_summary(v1.Summary(value=[v1.Summary.Value(tag=tag, simple_value=value)
                                                       for tag, value in rates.items()]), self.global_step)

    def _log(self):
        examples_per_sec, global_rate = self._rates()
        left = (self._train_steps - self.global_step) / global_rate if global_rate > 0 else 0
        staleness = self._take_staleness()
        limited = self._train_steps < NO_STEP_LIMIT
        log_lines.log_progress(self._task_name, self.global_step, self._train_steps if limited else None, self.loss,
                               self.accuracy, examples_per_sec, left if limited else None, staleness)
        self._write_rates(examples_per_sec, global_rate, staleness)
        if self._metrics:
            self._metrics.progress(self.global_step, self.own_steps, examples_per_sec, self.loss, self.accuracy,
                                   staleness)


class ProfileHook(v1.train.SessionRunHook):
    """Traces local steps first..last with TensorFlow's profiler into logdir, which TensorBoard's
    Profile tab opens (plugins/profile/<run>/<host>.xplane.pb)."""

    def __init__(self, task_name, first, last, logdir):
        self._task_name, self._first, self._last, self._logdir = task_name, first, last, logdir
        self._step = 0
        self._tracing = False

    def before_run(self, run_context):
        self._step += 1
        if self._step == self._first:
            tf.profiler.experimental.start(self._logdir)
            self._tracing = True

    def after_run(self, run_context, run_values):
        if self._tracing and self._step >= self._last:
            self._stop()

    def end(self, session):
        if self._tracing:
            self._stop()

    def _stop(self):
        tf.profiler.experimental.stop()
        self._tracing = False
        logging.info("%s: traced local steps %d-%d into %s", self._task_name, self._first,
                     min(self._step, self._last), self._logdir)


class TableUpkeepHook(v1.train.SessionRunHook):
    """Every `every_n`-th training run also reads whether each dynamic table's shard needs room
    (model/dynamic/upkeep.Upkeep: a bool per shard, read on its ps), and the shards that do are grown in a
    run of their own."""

    def __init__(self, upkeep, every_n):
        self._upkeep, self._every_n, self._runs = upkeep, every_n, 0

    def before_run(self, run_context):
        self._runs += 1
        return v1.train.SessionRunArgs(list(self._upkeep.needs)) if self._runs % self._every_n == 0 else None

    def after_run(self, run_context, run_values):
        if run_values.results:
            self._upkeep.grow_as_needed(run_context.session, run_values.results)


class LiveRowsHook(v1.train.SessionRunHook):
    """Logs the live rows of each dynamic embedding table, per shard, and of each ps, every `every_n`
    runs and at the end: the chief's view of the tables growing (model/dynamic/). Fetched only on
    those runs, so other runs pay nothing."""

    def __init__(self, task_name, live_rows, every_n):
        self._task_name, self._every_n = task_name, every_n
        self._live_rows = {tensor.op.name: tensor for tensor in live_rows}
        self._devices = {tensor.op.name: tensor.device for tensor in live_rows}
        self._runs = 0

    def before_run(self, run_context):
        self._runs += 1
        if self._runs % self._every_n == 0:
            return v1.train.SessionRunArgs(self._live_rows)
        return None

    def after_run(self, run_context, run_values):
        if run_values.results:
            logging.info("%s: %s", self._task_name, describe_live_rows(run_values.results, self._devices))

    def end(self, session):
        try:
            logging.info("%s: at the end, %s", self._task_name,
                         describe_live_rows(session.run(self._live_rows), self._devices))
        except tf.errors.OpError as err:  # a ps gone at the end: the counts are only informative
            logging.warning("%s: live rows not read at the end: %s", self._task_name,
                            log_lines.error_cause(err.message))


def describe_live_rows(counts: dict, devices: dict | None = None) -> str:
    """'live rows: wide_deep/user 4997 (2490 + 2507), ...; per ps: ps 0 2490, ps 1 2507' from
    {'<table>/shard<N>/live_rows': count} and, for the per-ps part, each count's device."""
    tables, per_ps = {}, {}
    for name in sorted(counts):
        table, _, _ = name.rsplit("/", 2)
        tables.setdefault(table, []).append(int(counts[name]))
        device = tf.DeviceSpec.from_string((devices or {}).get(name) or "")
        if device.job == spec.PS:
            per_ps[device.task] = per_ps.get(device.task, 0) + int(counts[name])
    line = "live rows: " + ", ".join(
        f"{table} {sum(shards)}" + (f" ({' + '.join(map(str, shards))})" if len(shards) > 1 else "")
        for table, shards in tables.items())
    if per_ps:
        line += "; per ps: " + ", ".join(f"ps {task} {rows}" for task, rows in sorted(per_ps.items()))
    return line


class DeltaSaverHook(v1.train.SessionRunHook):
    """The chief's delta checkpoints (training/incremental.py): one every `every_secs` seconds, between
    the full ones that MonitoredTrainingSession's saver writes; a delta at a step already saved is skipped.
    The delta's failures count with the full saves' (checkpoints.LiveStateSaver)."""

    def __init__(self, saver, model_dir: str, every_secs: int):
        self._saver, self._model_dir = saver, model_dir
        self._timer = v1.train.SecondOrStepTimer(every_secs=every_secs)
        self._global_step = None

    def begin(self):
        self._global_step = v1.train.get_global_step()

    def after_create_session(self, session, coord):
        del coord
        self._timer.update_last_triggered_step(int(session.run(self._global_step)))  # a full save begins a session

    def before_run(self, run_context):
        return v1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        step = int(run_values.results)
        if self._timer.should_trigger_for_step(step):
            self._timer.update_last_triggered_step(step)
            self._saver.save_delta(run_context.session, self._model_dir)
