"""RunConfig: TF1's settings of a run, and the cluster this task is in, read from TF_CONFIG as TF1 read it
(cluster/resolve.py: chief or master, worker, ps, and an evaluator outside the training cluster)."""

import dataclasses
import json
import os

import tensorflow as tf

from ps_trainer import input as inputs
from ps_trainer import model
from ps_trainer.cluster import resolve, spec
from ps_trainer.estimator import settings
from ps_trainer.model import dynamic
from ps_trainer.model.dynamic.ids import TableOptions
from ps_trainer.training import config as runtime
from ps_trainer.training import plan, roles
from ps_trainer.training.config import TrainConfig

_USE_DEFAULT = object()
NUM_PS_VARIABLE, PORT_VARIABLE = "PS_TRAINER_NUM_PS", "PS_TRAINER_PORT"
DEFAULT_CHECKPOINT_SECS = 600  # TF1's, when neither save_checkpoints_steps nor _secs is given
_NOT_COVERED = ("train_distribute", "eval_distribute", "experimental_distribute", "device_fn", "protocol")


class RunConfig:
    """TF1's tf.estimator.RunConfig. The cluster fields (task_type, task_id, is_chief, num_ps_replicas,
    num_worker_replicas, cluster_spec, master) come from TF_CONFIG, or without it from the environments
    trainer.py reads (a JobSet's pods, SageMaker, Slurm); without any, this is one process."""

    _REPLACEABLE = ("model_dir", "tf_random_seed", "save_summary_steps", "save_checkpoints_steps",
                    "save_checkpoints_secs", "session_config", "keep_checkpoint_max", "keep_checkpoint_every_n_hours",
                    "log_step_count_steps", "session_creation_timeout_secs", "checkpoint_save_graph_def",
                    "experimental_max_worker_delay_secs")

    def __init__(self, model_dir=None, tf_random_seed=None, save_summary_steps=100,
                 save_checkpoints_steps=_USE_DEFAULT, save_checkpoints_secs=_USE_DEFAULT, session_config=None,
                 keep_checkpoint_max=5, keep_checkpoint_every_n_hours=10000, log_step_count_steps=100,
                 session_creation_timeout_secs=None, checkpoint_save_graph_def=True,
                 experimental_max_worker_delay_secs=None, **others):
        for name, value in others.items():
            if name not in _NOT_COVERED:
                raise TypeError(f"RunConfig() got an unexpected keyword argument {name!r}")
            if value is not None:
                raise NotImplementedError(f"RunConfig({name}=...) is not covered by ps_trainer.estimator: the ps "
                                          "cluster comes from TF_CONFIG, and placement is the runtime's")
        steps_given, secs_given = save_checkpoints_steps is not _USE_DEFAULT, save_checkpoints_secs is not _USE_DEFAULT
        if steps_given and secs_given and save_checkpoints_steps is not None and save_checkpoints_secs is not None:
            raise ValueError("RunConfig: save_checkpoints_steps and save_checkpoints_secs cannot both be set")
        self._model_dir = model_dir
        self._tf_random_seed = tf_random_seed
        self._save_summary_steps = save_summary_steps
        self._save_checkpoints_steps = save_checkpoints_steps if steps_given else None
        self._save_checkpoints_secs = (save_checkpoints_secs if secs_given else
                                       None if steps_given and save_checkpoints_steps else DEFAULT_CHECKPOINT_SECS)
        self._session_config = session_config
        self._keep_checkpoint_max = keep_checkpoint_max
        self._keep_checkpoint_every_n_hours = keep_checkpoint_every_n_hours
        self._log_step_count_steps = log_step_count_steps
        if session_creation_timeout_secs is not None and session_creation_timeout_secs <= 0:
            raise ValueError(f"RunConfig: session_creation_timeout_secs must be positive, not "
                             f"{session_creation_timeout_secs}")
        self._session_creation_timeout_secs = session_creation_timeout_secs
        # False: no graph.pbtxt in model_dir and no .meta beside each checkpoint (training/session_loop.py).
        self._checkpoint_save_graph_def = bool(checkpoint_save_graph_def)
        if experimental_max_worker_delay_secs is not None and not isinstance(experimental_max_worker_delay_secs, int):
            raise ValueError("RunConfig: experimental_max_worker_delay_secs must be an integer if set")
        # TF's cap on the delay it started each worker with (5 s a worker, up to 60 s): the runtime starts every
        # worker at once, so any cap holds; kept for the property.
        self._experimental_max_worker_delay_secs = experimental_max_worker_delay_secs
        self._cluster, self._task_type, self._task_id = _cluster_of(os.environ)
        self._settings = settings.read(os.environ)

    def replace(self, **kwargs) -> "RunConfig":
        """A copy with the named settings changed (TF1's replace)."""
        unknown = set(kwargs) - set(self._REPLACEABLE)
        if unknown:
            raise ValueError(f"RunConfig.replace: {sorted(unknown)} cannot be replaced; these can: "
                             f"{', '.join(self._REPLACEABLE)}")
        copy = RunConfig.__new__(RunConfig)
        copy.__dict__.update(self.__dict__)
        for name, value in kwargs.items():
            setattr(copy, f"_{name}", value)
        if "save_checkpoints_steps" in kwargs and kwargs["save_checkpoints_steps"] and "save_checkpoints_secs" \
                not in kwargs:
            copy._save_checkpoints_secs = None  # noqa: SLF001  (the copy's own field)
        return copy

    # The run's settings.
    model_dir = property(lambda self: self._model_dir)
    tf_random_seed = property(lambda self: self._tf_random_seed)
    save_summary_steps = property(lambda self: self._save_summary_steps)
    save_checkpoints_steps = property(lambda self: self._save_checkpoints_steps)
    save_checkpoints_secs = property(lambda self: self._save_checkpoints_secs)
    session_config = property(lambda self: self._session_config)
    keep_checkpoint_max = property(lambda self: self._keep_checkpoint_max)
    keep_checkpoint_every_n_hours = property(lambda self: self._keep_checkpoint_every_n_hours)
    log_step_count_steps = property(lambda self: self._log_step_count_steps)
    session_creation_timeout_secs = property(lambda self: self._session_creation_timeout_secs)
    checkpoint_save_graph_def = property(lambda self: self._checkpoint_save_graph_def)
    experimental_max_worker_delay_secs = property(lambda self: self._experimental_max_worker_delay_secs)

    @property
    def startup_timeout_secs(self) -> int:
        """How long a task waits for its peers (the ps tasks; a worker, for the chief's variables) before it
        exits 138: PS_TRAINER_FLAGS's --startup_timeout_secs where given (ps_trainer/estimator/settings.py),
        else session_creation_timeout_secs where the program gives it, else trainer.py's default."""
        return (self._settings.startup_timeout_secs or self._session_creation_timeout_secs
                or TrainConfig.startup_timeout_secs)

    @property
    def startup_timeout_setting(self) -> str:
        """Where startup_timeout_secs comes from, as a message names it."""
        if self._settings.startup_timeout_secs:
            return f"{settings.VARIABLE} --startup_timeout_secs"
        return "RunConfig.session_creation_timeout_secs"

    @property
    def runtime_flags(self) -> settings.Settings:
        """The trainer's settings PS_TRAINER_FLAGS gives this program (ps_trainer/estimator/settings.py)."""
        return self._settings

    @property
    def serving_checks(self) -> roles.ServingChecks:
        return roles.ServingChecks(self._settings.allow_public_addresses, self._settings.skip_own_address_check)

    # The cluster, from TF_CONFIG.
    @property
    def cluster(self) -> spec.ClusterConfig:
        """This task in the trainer's own terms (cluster/spec.py)."""
        return self._cluster

    task_type = property(lambda self: self._task_type)
    task_id = property(lambda self: self._task_id)

    @property
    def is_chief(self) -> bool:
        return self._cluster.is_chief  # the evaluator, outside the cluster, is no chief

    @property
    def num_ps_replicas(self) -> int:
        return self._cluster.num_ps

    @property
    def num_worker_replicas(self) -> int:
        return self._cluster.num_replicas if self._cluster.job_name else 1

    @property
    def cluster_spec(self) -> tf.train.ClusterSpec:
        return self._cluster.cluster_spec() if self._cluster.is_distributed else tf.train.ClusterSpec({})

    @property
    def master(self) -> str:
        return f"grpc://{self._cluster.own_address()}" if self._cluster.is_distributed else ""

    @property
    def evaluation_master(self) -> str:
        return ""


def step_path(config: RunConfig, cluster: spec.ClusterConfig, own_tables: bool = False) -> plan.StepPath:
    """What one session.run of this task's training does (training/plan.py), from PS_TRAINER_FLAGS's levers:
    the model_fn's dense variables get the levers' worker-side copies, so a round is one loop; its tables, the
    runtime's dynamic ones (--embedding=dynamic) and its own (`own_tables`: partitioned variables, as TF1's canned
    classes partition their input layer's and linear model's, and a V2 class's linear model), are read and updated
    on the ps a step at a time."""
    given = config.runtime_flags
    try:
        return plan.step_path(plan.StepSettings(local_steps=given.local_steps, steps_per_run=given.steps_per_run,
                                                steps_per_run_given=given.steps_per_run > 1,
                                                accumulate_batches=given.accumulate_batches, sync=given.sync_replicas,
                                                has_tables=given.embedding == "dynamic" or own_tables,
                                                model="model_fn",
                                                distributed=cluster.is_distributed))
    except plan.Conflict as conflict:
        raise ValueError(f"{settings.VARIABLE}: {conflict}") from None


def runtime_settings(config: RunConfig, cluster: spec.ClusterConfig, train_steps: int | None,
                     sync_replicas: bool = False, path: plan.StepPath = TrainConfig.step_path) -> runtime.RunConfig:
    """The runtime's settings of this task (training/config.py) from a program's RunConfig: its cluster (or
    `cluster`: none for a training outside it), model_dir, the step training ends at (None: no limit), its
    saves, the startup timeout and the step path (step_path)."""
    given = config.runtime_flags
    train = TrainConfig(model_dir=config.model_dir, train_steps=train_steps or runtime.NO_STEP_LIMIT,
                        startup_timeout_secs=config.startup_timeout_secs, stall_warning_secs=given.stall_warning_secs,
                        stall_timeout_secs=given.stall_timeout_secs, worker_gone_secs=given.worker_gone_secs,
                        sync_replicas=sync_replicas,
                        replicas_to_aggregate=cluster.num_replicas if sync_replicas else 1,
                        save_checkpoint_steps=config.save_checkpoints_steps,
                        save_checkpoint_secs=config.save_checkpoints_secs,
                        save_summaries_steps=config.save_summary_steps, keep_checkpoint_max=config.keep_checkpoint_max,
                        save_graph_def=config.checkpoint_save_graph_def,
                        step_path=path, local_steps=given.local_steps, accumulate_batches=given.accumulate_batches,
                        optimizer=given.optimizer or TrainConfig.optimizer, learning_rate=given.learning_rate,
                        momentum=given.momentum, incremental_save_secs=given.incremental_save_secs)
    return runtime.RunConfig(cluster=cluster, model=model_settings(config), data=inputs.DataConfig(), train=train)


def model_settings(config: RunConfig) -> model.ModelConfig:
    """The runtime's model settings of a program: its dynamic tables' (PS_TRAINER_FLAGS's --embedding=dynamic and
    the rest; a shard per ps task of the program's cluster unless --embedding_partitions says), the same in
    every task of the cluster, the evaluator's included."""
    given = config.runtime_flags
    return model.ModelConfig(embedding=given.embedding, embedding_capacity=given.embedding_capacity,
                             embedding_growth=given.embedding_growth, embedding_min_count=given.embedding_min_count,
                             embedding_steps_to_live=given.embedding_steps_to_live,
                             embedding_partitions=given.embedding_partitions or max(1, config.cluster.num_ps),
                             mark_touched_rows=given.incremental_save_secs > 0)


def table_options(config: RunConfig, devices: tuple[str, ...] = ()) -> TableOptions | None:
    """The options of the program's dynamic tables, on `devices` (a training graph's ps tasks; none: a graph of
    one process), or None where PS_TRAINER_FLAGS gives none (model/dynamic/column.py then refuses the column)."""
    settings_of_model = model_settings(config)
    if settings_of_model.embedding != "dynamic":
        return None
    return dynamic.options_of(dataclasses.replace(settings_of_model, table_devices=devices))


def _cluster_of(env) -> tuple[spec.ClusterConfig, str, int]:
    """(the cluster, TF1's task_type, task_id): TF_CONFIG's task; without a TF_CONFIG, the task that the
    environments trainer.py reads name (cluster/resolve.py: JobSet's pods, SageMaker, Slurm, PS_HOSTS and
    WORKER_HOSTS), so that the launchers and manifests start a program as they start trainer.py; else one
    local 'worker' 0."""
    tf_config = json.loads(env["TF_CONFIG"]) if env.get("TF_CONFIG") else None
    if tf_config is not None and not tf_config.get("cluster"):
        return spec.ClusterConfig(), spec.WORKER, 0
    # What trainer.py's --num_ps and --port say where only hosts are listed (Slurm): a program takes no such
    # flags, so scripts/slurm/train.sbatch sets them in the environment.
    options = resolve.ResolveOptions(num_ps=_number(env, NUM_PS_VARIABLE, 1), port=_number(env, PORT_VARIABLE, 2222))
    try:
        cluster = resolve.resolve(None, env, options).cluster
    except resolve.ClusterError as err:
        raise ValueError(str(err)) from None
    if cluster.job_name is None:
        return spec.ClusterConfig(), spec.WORKER, 0
    if tf_config is not None:  # its own word for the task ("master" stays "master", as in TF1)
        return cluster, tf_config["task"]["type"], int(tf_config["task"].get("index", 0))
    return cluster, cluster.job_name, cluster.task_index


def _number(env, name: str, default: int) -> int:
    try:
        return int(env.get(name, default))
    except ValueError:
        raise ValueError(f"{name}={env[name]!r} is not a number") from None
