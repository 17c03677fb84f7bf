"""A run's settings as plain values: what flags/config.py reads from the flags and the environment,
and everything in training/ takes. The defaults here are the flags' defaults (flags/definitions.py)."""

import dataclasses

from ps_trainer import input as inputs
from ps_trainer import model
from ps_trainer.cluster import spec
from ps_trainer.training import momentum as momentum_rule
from ps_trainer.training import plan


# --train_steps with --num_epochs and no --train_steps given: the epochs alone end the run.
NO_STEP_LIMIT = 2**62


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    train_steps: int = 2000
    num_epochs: int = 0  # with --input_queue: the run ends when this many epochs are trained (0: no limit)
    batch_size: int = 64
    learning_rate: float = 0.05
    lr_schedule: str = "constant"  # training/schedules.py
    decay_steps: int | None = None  # default: train_steps
    decay_rate: float = 0.94
    staircase: bool = False
    end_learning_rate: float = 0.0
    lr_boundaries: tuple[int, ...] = ()
    lr_factors: tuple[float, ...] = ()  # piecewise: learning_rate times each, one more than the boundaries
    warmup_steps: int = 0
    clip_gradient_norm: float | None = None
    optimizer: str = "momentum"
    momentum: float = 0.9
    momentum_choice: momentum_rule.MomentumChoice | None = None  # why this momentum (training/momentum.py)
    not_learning: str = "stop"  # stop, warn or off: see training/learning.py
    sync_replicas: bool = False
    replicas_to_aggregate: int = 1
    model_dir: str | None = None
    save_checkpoint_steps: int | None = None
    save_checkpoint_secs: int | None = 600
    keep_checkpoint_max: int = 5
    save_graph_def: bool = True  # graph.pbtxt in model_dir and a .meta beside each checkpoint
    incremental_save_secs: int = 0  # deltas between full checkpoints (training/incremental.py); 0: none
    # A fresh run's variables from this model_dir or checkpoint (training/warm_start.py).
    warm_start_from: str | None = None
    warm_start_map: tuple[tuple[str, str], ...] = ()  # (the checkpoint's name prefix, this model's)
    warm_start_slots: bool = False  # the optimizer's slots of the variables loaded are loaded too
    save_summaries_steps: int = 100
    log_every_n_steps: int = 100
    seed: int = 42
    startup_timeout_secs: int = 600
    eval_timeout_secs: int = 3600
    stall_warning_secs: int = 60
    stall_timeout_secs: int = 900
    # Once the chief has finished: how long a ps waits for a training replica whose address refuses
    # connections (it left the job for good, or its host is gone) before it exits without it.
    worker_gone_secs: int = 60
    export_saved_model: bool = True
    export_copy_dir: str | None = None  # the chief also writes the export here (SageMaker's SM_MODEL_DIR)
    wire_dtype: str = "float32"
    # What one session.run does, decided once (training/plan.py: flags/config.py asks it) and read by every
    # part: the lever that builds the step, the training steps a run may take, the batches it reads at once.
    step_path: plan.StepPath = plan.StepPath(plan.SINGLE)
    accumulate_batches: int = 1  # synchronous: micro-batches per gradient sent (training/step/accumulate.py)
    local_steps: int = 1  # asynchronous: steps on worker-side copies between pushes (training/step/local_steps.py)
    profile_steps: tuple[int, int] | None = None  # [first, last] local steps to trace
    metrics_port: int = 0  # serve Prometheus metrics on this port of the task's own host (0: off)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    cluster: spec.ClusterConfig
    train: TrainConfig
    model: model.ModelConfig
    data: inputs.DataConfig
    cluster_source: str = "flags"  # flags, defaults, or the environment that described the cluster
    # The flags the task was given, of those a rule at start reads (training/start.py): a default gives way
    # to what model_dir holds, a given flag does not.
    given: frozenset[str] = frozenset()
