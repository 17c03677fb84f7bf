"""Estimator: TF1's tf.estimator.Estimator on this project's runtime. A model_fn builds the graph, placed by
the runtime (placement.device_setter on a ps cluster); training runs in the trainer's session loop
(training/session_loop.py: a non-chief waits for the chief's variables, sessions are made again after a ps
restarts) with the chief's saver (training/checkpoints.LiveStateSaver: each save checked, an unreadable
newest checkpoint passed over) and, on a cluster, the stall watchdog. A session.run is the model_fn's train_op,
or with a lever from PS_TRAINER_FLAGS the lever's step, updating with the optimizer the model_fn built
(training/step/taken.py). With PS_TRAINER_FLAGS --embedding=dynamic the model_fn's dynamic_embedding_columns
are the runtime's dynamic tables, with trainer.py's upkeep (training/graph.tables_of), saver and deltas."""

import contextlib
import os
import tempfile
from typing import NamedTuple

import numpy as np
import tensorflow as tf
from tensorflow.python.platform import tf_logging as logging  # tf.compat.v1.logging: where a program looks
from tensorflow.python.training import sync_replicas_optimizer  # the type of its hook, which a model_fn returns

from ps_trainer.cluster import model_dir as layout
from ps_trainer.cluster import placement, spec as cluster_spec
from ps_trainer.estimator import export, input_fn_result, inputs, run_config
from ps_trainer.estimator.run_config import RunConfig
from ps_trainer.model import needs, spec
from ps_trainer.model.dynamic import column, storage as table_storage, upkeep as table_upkeep
from ps_trainer.model.graph_tables import GraphTables
from ps_trainer.model.spec import EstimatorSpec, ModeKeys
from ps_trainer.training import checkpoints, plan, preemption, session_loop, watchdog
from ps_trainer.training import graph as graph_lib, hooks as training_hooks, log_lines
from ps_trainer.training.step import taken

v1 = tf.compat.v1
_TABLES_NEED_THE_RUNTIMES_UPDATE = (
    "PS_TRAINER_FLAGS --embedding=dynamic: the dynamic tables evict and reconcile rows of the runtime optimizer's "
    "slots, so the runtime makes the update: give PS_TRAINER_FLAGS --optimizer (and --learning_rate), with a "
    "model_fn that returns the loss alone")
_SYNC_REPLICAS_HOOK = sync_replicas_optimizer._SyncReplicasOptimizerHook  # noqa: SLF001  (the type of the hook a SyncReplicasOptimizer returns)


class WarmStartSettings(NamedTuple):
    """TF1's WarmStartSettings: which variables training starts from `ckpt_to_initialize_from` (a checkpoint,
    or a directory of them: its latest) instead of their initializers; the arguments of
    tf.compat.v1.train.warm_start, which applies them. vars_to_warm_start: a regular expression over the
    trainable variables (the default, '.*': all of them), a list of names or variables, or None (only those
    of var_name_to_vocab_info)."""
    ckpt_to_initialize_from: str
    vars_to_warm_start: object = ".*"
    var_name_to_vocab_info: dict | None = None
    var_name_to_prev_var_name: dict | None = None


def _warm_start_settings(warm_start_from) -> WarmStartSettings | None:
    """Estimator's warm_start_from as TF1 read it: a path (a checkpoint, a directory of them, or a SavedModel,
    whose variables are a checkpoint) or WarmStartSettings."""
    if warm_start_from is None or isinstance(warm_start_from, WarmStartSettings):
        return warm_start_from
    if not isinstance(warm_start_from, (str, bytes, os.PathLike)):
        raise ValueError(f"warm_start_from must be a path or a WarmStartSettings, not {type(warm_start_from).__name__}")
    path = os.fsdecode(warm_start_from)
    saved_variables = os.path.join(path, tf.saved_model.VARIABLES_DIRECTORY, tf.saved_model.VARIABLES_FILENAME)
    if tf.io.gfile.exists(saved_variables + ".index"):
        logging.info("Warm-starting from a SavedModel")
        return WarmStartSettings(saved_variables)
    return WarmStartSettings(path)


class Estimator:
    """TF1's Estimator(model_fn, model_dir, config, params, warm_start_from). model_fn takes `features` and any
    of labels, mode, params, config, and returns an EstimatorSpec."""

    def __init__(self, model_fn, model_dir=None, config=None, params=None, warm_start_from=None):
        self._warm_start = _warm_start_settings(warm_start_from)
        if not callable(model_fn):
            raise TypeError(f"Estimator: model_fn must be a function, not {type(model_fn).__name__}")
        if not spec.takes(model_fn, "features"):
            raise ValueError("Estimator: model_fn must take an argument named 'features'")
        config = config or RunConfig()
        if model_dir and config.model_dir and os.path.abspath(model_dir) != os.path.abspath(config.model_dir):
            raise ValueError(f"Estimator: model_dir={model_dir} and RunConfig.model_dir={config.model_dir} differ")
        model_dir = model_dir or config.model_dir
        if not model_dir:
            model_dir = tempfile.mkdtemp()
            logging.warning("Using temporary folder as model directory: %s", model_dir)
        # TF's Estimator: without a session_config of the program's, its sessions take the default one (soft
        # placement, the graph optimizer's passes as cluster/spec.graph_rewrites says), which `config` shows.
        default = config.session_config or cluster_spec.session_config(cluster_spec.ClusterConfig())
        self._config = config.replace(model_dir=model_dir, session_config=default)
        self._model_fn, self._params = model_fn, dict(params or {})

    model_dir = property(lambda self: self._config.model_dir)
    config = property(lambda self: self._config)
    params = property(lambda self: dict(self._params))
    model_fn = property(lambda self: self._model_fn)

    def latest_checkpoint(self) -> str | None:
        return tf.train.latest_checkpoint(self.model_dir)

    def get_variable_names(self) -> list[str]:
        return [name for name, _ in tf.train.list_variables(self._checkpoint_or_raise())]

    def get_variable_value(self, name: str) -> np.ndarray:
        return tf.train.load_variable(self._checkpoint_or_raise(), name)

    def _checkpoint_or_raise(self) -> str:
        checkpoint = self.latest_checkpoint()
        if checkpoint is None:
            raise ValueError(f"no checkpoint in {self.model_dir}: train first")
        return checkpoint

    # ---------------------------------------------------------------- train
    def train(self, input_fn, hooks=None, steps=None, max_steps=None, saving_listeners=None):
        """Trains `steps` more steps, or to global step `max_steps`, or until input_fn's data ends."""
        self._train(input_fn, hooks, steps, max_steps, saving_listeners)
        return self

    def _train(self, input_fn, hooks=None, steps=None, max_steps=None, saving_listeners=None, target="",
               stop=None) -> int:
        """Trains in this process, or (target: this task's server) as a replica of config.cluster, until its end or
        until `stop` (a training/preemption.Preemption) is requested; returns the global step when this replica's
        training ended."""
        if steps is not None and max_steps is not None:
            raise ValueError("Estimator.train: give steps or max_steps, not both")
        for name, value in (("steps", steps), ("max_steps", max_steps)):
            if value is not None and value <= 0:
                raise ValueError(f"Estimator.train: {name} must be positive, not {value}")
        for listener in saving_listeners or ():
            if not isinstance(listener, v1.train.CheckpointSaverListener):
                raise TypeError(f"saving_listeners must be a list of CheckpointSaverListener, given: {listener}")
        start_step = checkpoints.checkpoint_step(self.latest_checkpoint()) or 0
        if max_steps is not None and start_step >= max_steps:
            logging.info("Skipping training since max_steps has already saved.")
            return max_steps
        # With neither steps nor max_steps, training ends with input_fn's data, as TF1's did.
        last = max_steps if max_steps is not None else (start_step + steps if steps is not None else None)
        with tf.Graph().as_default():
            self._seed()
            cluster = self._config.cluster if target else cluster_spec.ClusterConfig()
            # --local_steps keeps a program's tables (its partitioned variables, a V2 class's linear model) on the ps:
            # a run is then one step.
            own_tables = (self._config.runtime_flags.local_steps > 1 and run_config.table_options(self._config) is None
                          and self._makes_tables(input_fn))
            path = run_config.step_path(self._config, cluster, own_tables)
            placed = v1.device(placement.device_setter(cluster)) if cluster.is_distributed else contextlib.nullcontext()
            tables = run_config.table_options(self._config) is not None
            table_devices = cluster.ps_devices() if cluster.is_distributed else ()
            graph_tables = GraphTables()  # the model_fn's dynamic tables, however many times a lever calls it
            runtime_optimizer = self._config.runtime_flags.optimizer is not None
            if tables and not runtime_optimizer:
                raise ValueError(_TABLES_NEED_THE_RUNTIMES_UPDATE)
            if tables and self._warm_start:
                raise ValueError("warm_start_from with PS_TRAINER_FLAGS --embedding=dynamic: a dynamic table's rows "
                                 "load by ID, which Estimator's warm start does not do: train without one of the two "
                                 "(trainer.py --warm_start_from loads dynamic tables by ID)")
            with placed:
                global_step = v1.train.get_or_create_global_step()
                runtime_sync = self._config.runtime_flags.sync_replicas
                as_written = path.name == plan.SINGLE and not runtime_optimizer and not runtime_sync
                source = self._training_source(input_fn, as_dataset=not as_written)
                if as_written:  # its train_op, as written
                    model = self._call_model_fn(*source.next_batch(), ModeKeys.TRAIN, graph_tables)
                    if model.train_op is None:
                        raise ValueError(spec.TRAIN_NEEDS)
                    # A SyncReplicasOptimizer's chief thread stays blocked on gradients that never come once
                    # training is over: the session's close cancels that wait after the runtime's grace period.
                    syncing = any(isinstance(hook, _SYNC_REPLICAS_HOOK)
                                  for hook in (*model.training_hooks, *(hooks or ())))
                    runtime = run_config.runtime_settings(self._config, cluster, last, syncing)
                    trained = _Trained(model, model.train_op, model.loss)
                else:  # a lever's step, or the runtime's update (training/step/taken.py)
                    runtime = run_config.runtime_settings(self._config, cluster, last, runtime_sync, path=path)
                    lever = taken.build(
                        lambda features, labels: self._call_model_fn(features, labels, ModeKeys.TRAIN, graph_tables,
                                                                     table_devices),
                        source.next_batch, source.dataset, global_step, cluster, runtime.train, runtime_optimizer,
                        graph_tables)
                    logging.info("%s: %s", runtime.cluster.task_name, lever.said)
                    model, built = lever.spec, lever.step
                    trained = _Trained(model, built.train_op, built.metrics.loss, built.hooks, built.chief_only_hooks)
                    if tables:
                        trained = trained._replace(tables=graph_lib.tables_of(
                            graph_tables, lever.optimizer, cluster.is_chief, runtime.model.embedding_steps_to_live))
                if self._warm_start:  # the initializers of the variables it names: a checkpoint in model_dir wins
                    logging.info("Warm-starting with WarmStartSettings: %s", self._warm_start)
                    v1.train.warm_start(*self._warm_start)
                own_saver = session_loop.own_saver_hook([*model.training_hooks, *(hooks or ()),
                                                         *model.training_chief_hooks])
                if saving_listeners and own_saver is None and not (self._config.save_checkpoints_secs
                                                                   or self._config.save_checkpoints_steps):
                    raise ValueError("There should be a CheckpointSaverHook to use saving_listeners. Please set one "
                                     "of the RunConfig.save_checkpoints_steps or RunConfig.save_checkpoints_secs.")
                # The program's hooks begin here, under the device setter, before the saver is made.
                chief_only = len(model.training_chief_hooks) if cluster.is_chief else 0
                begun = session_loop.begin_once([*model.training_hooks, *(hooks or ()),
                                                 *model.training_chief_hooks[:chief_only]], saving_listeners or ())
                program_hooks, program_chief_hooks = begun[:len(begun) - chief_only], begun[len(begun) - chief_only:]
            graph_lib.forget_critical_section_executions()
            uninitialized = checkpoints.report_uninitialized()
            upkeep = trained.tables.upkeep if trained.tables else None
            deltas_every = runtime.train.incremental_save_secs if trained.tables and cluster.is_chief else 0
            scaffold = checkpoints.program_scaffold(model.scaffold, uninitialized,
                                                    self.model_dir if cluster.is_chief else None,
                                                    self._config.keep_checkpoint_max,
                                                    self._config.keep_checkpoint_every_n_hours,
                                                    before_save=trained.tables.evict if trained.tables else None,
                                                    after_restore=upkeep.after_restore if upkeep else None,
                                                    slots_of=trained.tables.slots_of if deltas_every else None,
                                                    graph_tables=graph_tables)
            every = self._config.log_step_count_steps
            progress = session_loop.GlobalStepAtEnds(runtime.cluster.task_name, trained.loss, logging.info)
            all_hooks = [*source.hooks, progress, *([v1.train.StopAtStepHook(last_step=last)] if last else []),
                         v1.train.NanTensorHook(trained.loss), *trained.hooks, *program_hooks,
                         *([preemption.PreemptionHook(stop)] if stop else [])]
            if every:
                all_hooks.append(v1.train.LoggingTensorHook({"loss": trained.loss, "step": global_step},
                                                            every_n_iter=every))
            if upkeep and upkeep.needs:
                all_hooks.append(training_hooks.TableUpkeepHook(upkeep, table_upkeep.UPKEEP_EVERY_N_RUNS))
            stall = watchdog.for_task(runtime.cluster, runtime.train) if cluster.is_distributed else None
            chief_hooks = [*trained.chief_hooks, *program_chief_hooks]
            if deltas_every and getattr(scaffold.saver, "deltas", None) is not None:
                chief_hooks.append(training_hooks.DeltaSaverHook(scaffold.saver, self.model_dir, deltas_every))
            live_rows = v1.get_collection(table_storage.LIVE_ROWS)
            if live_rows:
                chief_hooks.append(training_hooks.LiveRowsHook(runtime.cluster.task_name, live_rows, every or 100))
            sessions = session_loop.Sessions(
                train_op=(trained.train_op, trained.loss),  # as TF1's loop: the update and the loss, nothing else
                scaffold=scaffold, hooks=[*all_hooks, *([stall] if stall else [])], chief_only_hooks=chief_hooks,
                uninitialized=uninitialized, config=self._session_config(cluster), progress=progress,
                ends_with_session=True, log_step_count_steps=every, saving_listeners=tuple(saving_listeners or ()))
            try:
                ended = session_loop.train_to_the_end(runtime, target, sessions, stop)
            finally:
                if stall:
                    stall.stop()
        return ended.global_step

    # ---------------------------------------------------------------- evaluate
    def evaluate(self, input_fn, steps=None, hooks=None, checkpoint_path=None, name=None) -> dict:
        """Evaluates a checkpoint (the latest by default) over `steps` batches or all of input_fn's data;
        returns the metrics (model_fn's eval_metric_ops, the mean loss as 'loss') and 'global_step', and
        writes them as summaries to model_dir/eval (or eval_<name>)."""
        if steps is not None and steps <= 0:
            raise ValueError(f"Estimator.evaluate: steps must be positive, not {steps}")
        with self._model_of_checkpoint(input_fn, ModeKeys.EVAL, checkpoint_path) as (global_step, model, creator,
                                                                                     input_hooks):
            return self._evaluated(Evaluation.of(global_step, model, input_hooks, hooks or (), steps), creator, name)

    def _evaluated(self, evaluation: "Evaluation", creator, name) -> dict:
        """Runs an evaluation built in the default graph, in a session from `creator`, to its end; writes
        its metrics as summaries to eval_dir(name), logs them, and returns them."""
        with v1.train.MonitoredSession(creator, hooks=evaluation.hooks) as session:
            while not session.should_stop():
                session.run(evaluation.updates)
        results = dict(evaluation.final.final_ops_values)
        results["global_step"] = int(results["global_step"])
        self._write_eval_summary(results, name)
        log_lines.log_evaluation(results, logging.info)
        return results

    def eval_dir(self, name=None) -> str:
        return layout.eval_dir(self.model_dir, name)

    def _write_eval_summary(self, results, name):
        writer = v1.summary.FileWriterCache.get(self.eval_dir(name))
        values = [v1.Summary.Value(tag=key, simple_value=float(value)) for key, value in results.items()
                  if key != "global_step" and np.ndim(value) == 0]
        writer.add_summary(v1.Summary(value=values), results["global_step"])
        writer.flush()

    # ---------------------------------------------------------------- predict
    def predict(self, input_fn, predict_keys=None, hooks=None, checkpoint_path=None, yield_single_examples=True):
        """Yields model_fn's predictions for input_fn's features, one example at a time (a dict where
        predictions is one), from a checkpoint (the latest by default)."""
        with self._model_of_checkpoint(input_fn, ModeKeys.PREDICT, checkpoint_path) as (_, model, creator,
                                                                                        input_hooks):
            predictions = model.predictions
            if predict_keys is not None:
                if not isinstance(predictions, dict):
                    raise ValueError("Estimator.predict: predict_keys needs model_fn's predictions to be a dict")
                missing = set(predict_keys) - set(predictions)
                if missing:
                    raise ValueError(f"Estimator.predict: predict_keys {sorted(missing)} are not among the "
                                     f"predictions {sorted(predictions)}")
                predictions = {key: predictions[key] for key in predict_keys}
            with v1.train.MonitoredSession(creator, hooks=[*input_hooks, *model.prediction_hooks,
                                                           *(hooks or ())]) as session:
                while not session.should_stop():
                    batch = session.run(predictions)
                    if not yield_single_examples:
                        yield batch
                    elif isinstance(batch, dict):
                        for i in range(len(next(iter(batch.values())))):
                            yield {key: value[i] for key, value in batch.items()}
                    else:
                        yield from batch

    @contextlib.contextmanager
    def _model_of_checkpoint(self, input_fn, mode, checkpoint_path):
        """In a graph of its own: (the global step, model_fn's EstimatorSpec for `mode` over input_fn's data,
        a session creator that restores the checkpoint, the hooks: the input's, and the restore of the
        checkpoint's deltas where it has any). The checkpoint is the latest by default; with none, the model is
        initialized, as TF 1.15 did, saying so."""
        checkpoint_path = checkpoint_path or self.latest_checkpoint()
        if checkpoint_path is None:
            logging.info("Could not find trained model in model_dir: %s, running initialization to %s.",
                         self.model_dir, "evaluate" if mode == ModeKeys.EVAL else "predict")
        with tf.Graph().as_default():
            global_step, model, hooks, graph_tables = self._model_graph(input_fn, mode)
            deltas = checkpoints.delta_restorer(graph_tables, checkpoint_path) if checkpoint_path else None
            if deltas is not None:  # restored with its deltas once the session is made, as the trainer's evaluator does
                hooks.append(_RestoredWithDeltas(checkpoints.saver_for_restore(model.scaffold), deltas,
                                                 checkpoint_path))
            creator = v1.train.ChiefSessionCreator(scaffold=model.scaffold or v1.train.Scaffold(),
                                                   checkpoint_filename_with_path=None if deltas else checkpoint_path,
                                                   config=self._config.session_config)
            yield global_step, model, creator, hooks

    def _model_graph(self, input_fn, mode):
        """In the default graph: (the global step, model_fn's EstimatorSpec for `mode` over input_fn's data, the
        input's hooks, the model's tables)."""
        self._seed()
        global_step = v1.train.get_or_create_global_step()
        source = input_fn_result.of(self._call_input_fn(input_fn, mode))
        features, labels = source.next_batch()
        graph_tables = GraphTables()
        model = self._call_model_fn(features, labels if mode == ModeKeys.EVAL else None, mode, graph_tables)
        return global_step, model, list(source.hooks), graph_tables

    # ---------------------------------------------------------------- export
    def export_saved_model(self, export_dir_base, serving_input_receiver_fn, assets_extra=None, as_text=False,
                           checkpoint_path=None, experimental_mode=ModeKeys.PREDICT) -> bytes:
        """A SavedModel of the model_fn's PREDICT graph and a checkpoint (the latest by default) in a new
        timestamped directory under export_dir_base; returns its path as bytes, as TF1 did."""
        if experimental_mode != ModeKeys.PREDICT:
            raise NotImplementedError("export_saved_model(experimental_mode=...) other than PREDICT is not covered "
                                      "by ps_trainer.estimator")
        return export.save(self, export_dir_base, serving_input_receiver_fn, assets_extra, as_text, checkpoint_path)

    def export_savedmodel(self, export_dir_base, serving_input_receiver_fn, assets_extra=None, as_text=False,
                          checkpoint_path=None, strip_default_attrs=False) -> bytes:
        """TF1's older name of export_saved_model."""
        del strip_default_attrs  # always stripped, as export_saved_model does
        return self.export_saved_model(export_dir_base, serving_input_receiver_fn, assets_extra, as_text,
                                       checkpoint_path)

    # ---------------------------------------------------------------- the model_fn contract
    def _makes_tables(self, input_fn) -> bool:
        """Whether the model_fn makes tables: partitioned trainable variables (TF1's canned classes partition their
        input layer's and linear model's) or trainable variables made in model.needs.table_part() (TF 2.x's canned
        classes' linear model). It is called once for this, in a graph of its own, its update recorded rather than
        built."""
        partitioned = []

        def noting(getter, name, *args, **kwargs):  # TensorFlow passes the next getter as `getter`
            if kwargs.get("partitioner") is not None and kwargs.get("trainable", True) is not False:
                partitioned.append(name)
            return getter(name, *args, **kwargs)

        with tf.Graph().as_default() as graph, taken.recording(), v1.variable_scope(v1.get_variable_scope(),
                                                                                   custom_getter=noting):
            v1.train.get_or_create_global_step()
            source = self._training_source(input_fn, as_dataset=True)
            self._call_model_fn(*source.next_batch(), ModeKeys.TRAIN, GraphTables())
            tables = [variable for variable in v1.trainable_variables() if needs.is_table(variable, graph)]
        return bool(partitioned or tables)

    def _training_source(self, input_fn, as_dataset: bool):
        """The input_fn's training batches. as_dataset: for a lever, which reads several batches a run, of
        numpy_input_fn's data as the tf.data.Dataset it is."""
        dataset = getattr(input_fn, inputs.AS_DATASET, None) if as_dataset else None
        return input_fn_result.of(dataset() if dataset else self._call_input_fn(input_fn, ModeKeys.TRAIN))

    def _call_input_fn(self, input_fn, mode):
        kwargs = {key: value for key, value in (("mode", mode), ("params", self.params), ("config", self.config))
                  if spec.takes(input_fn, key)}
        return input_fn(**kwargs)

    def _call_model_fn(self, features, labels, mode, graph_tables: GraphTables, table_devices=()) -> EstimatorSpec:
        """The model_fn's EstimatorSpec; its dynamic_embedding_columns' tables are PS_TRAINER_FLAGS's, recorded in
        `graph_tables`, on table_devices (a training graph's ps tasks), admitting IDs in TRAIN mode only."""
        if labels is not None and not spec.takes(self._model_fn, "labels"):
            raise ValueError("model_fn does not take labels, but input_fn returns labels")
        with column.building(graph_tables, run_config.table_options(self._config, table_devices),
                             mode == ModeKeys.TRAIN):
            model = spec.call_model_fn(self._model_fn, features, labels, mode, self.params, self.config)
        if not isinstance(model, EstimatorSpec):
            raise ValueError(f"model_fn must return an EstimatorSpec, not {type(model).__name__}")
        return model

    def _seed(self):
        if self._config.tf_random_seed is not None:
            v1.set_random_seed(self._config.tf_random_seed)

    def _session_config(self, cluster) -> v1.ConfigProto:
        """The runtime's session options (device filters, so that no worker waits for another) with the
        program's own on top; soft placement stays on: placement is the runtime's (a summary colocated
        with a ps variable would otherwise fail the first step)."""
        config = cluster_spec.session_config(cluster) if cluster.is_distributed else v1.ConfigProto()
        if self._config.session_config is not None:
            config.MergeFrom(self._config.session_config)
        config.allow_soft_placement = True
        return config


class Evaluation(NamedTuple):
    """An evaluation built in a graph: the metrics' update ops a run runs, and the hooks of its session, the last
    of them `final`, which reads the metrics (and the global step) at its end."""
    updates: list
    hooks: list
    final: v1.train.FinalOpsHook

    @classmethod
    def of(cls, global_step, model: EstimatorSpec, input_hooks, hooks=(), steps=None) -> "Evaluation":
        """Of an EVAL EstimatorSpec: its eval_metric_ops and the mean loss as 'loss'; the input's hooks, the model's
        evaluation_hooks, then the caller's; over `steps` batches, or all of the input."""
        metrics = dict(model.eval_metric_ops)
        metrics.setdefault("loss", v1.metrics.mean(model.loss))
        final = v1.train.FinalOpsHook({**{key: value for key, (value, _) in metrics.items()},
                                       "global_step": global_step})
        all_hooks = [*input_hooks, *model.evaluation_hooks, *hooks, final]
        if steps is not None:
            all_hooks.append(_StopAfterRuns(steps))
        return cls([update for _, update in metrics.values()], all_hooks, final)


class _StopAfterRuns(v1.train.SessionRunHook):
    def __init__(self, runs: int):
        self._runs, self._done = runs, 0

    def after_run(self, run_context, run_values):
        self._done += 1
        if self._done >= self._runs:
            run_context.request_stop()


class _RestoredWithDeltas(v1.train.SessionRunHook):
    """Restores a full checkpoint and then its deltas (the dynamic tables' changed rows) in each new session."""

    def __init__(self, saver, deltas, path: str):
        self._saver, self._deltas, self._path = saver, deltas, path

    def after_create_session(self, session, coord):
        checkpoints.restore_with_deltas(session, self._saver.restore, self._deltas, self._path)


class _Trained(NamedTuple):
    """What a training session runs: the model_fn's spec (its hooks, scaffold), the update, the loss the logs
    read, and the step's own hooks (a lever's)."""
    model: EstimatorSpec
    train_op: object
    loss: tf.Tensor
    hooks: tuple = ()
    chief_hooks: tuple = ()
    tables: graph_lib.Tables | None = None  # the dynamic tables' upkeep, where PS_TRAINER_FLAGS gives tables
