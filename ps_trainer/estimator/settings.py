"""The trainer's settings for an Estimator program, given outside its code: the environment variable
PS_TRAINER_FLAGS holds trainer.py flags (`PS_TRAINER_FLAGS="--startup_timeout_secs=60 --stall_timeout_secs=300"`),
read with trainer.py's own definitions into a FlagValues of their own, so the program's flags stay its own.

A flag the Estimator's runtime does not take yet is refused, naming it: none is dropped without a word."""

import os
import shlex
from typing import NamedTuple

from absl import flags

from ps_trainer.flags import definitions
from ps_trainer.model import ModelConfig, dynamic
from ps_trainer.training.config import TrainConfig

VARIABLE = "PS_TRAINER_FLAGS"
# The dynamic tables of a model_fn's dynamic_embedding_columns (model/dynamic/column.py), as trainer.py's.
TABLE_FLAGS = ("embedding", "embedding_capacity", "embedding_growth", "embedding_min_count", "embedding_steps_to_live",
               "embedding_partitions", "incremental_save_secs")
TAKEN = ("startup_timeout_secs", "stall_warning_secs", "stall_timeout_secs", "worker_gone_secs",
         "allow_public_addresses", "skip_own_address_check", "local_steps", "steps_per_run", "accumulate_batches",
         "sync_replicas", "optimizer",
         "learning_rate", "momentum", *TABLE_FLAGS)


class Settings(NamedTuple):
    """What PS_TRAINER_FLAGS gives a program's tasks; each default is trainer.py's, but the startup timeout's:
    None, not given (the program's RunConfig(session_creation_timeout_secs=...) then holds)."""
    startup_timeout_secs: int | None = None
    stall_warning_secs: int = TrainConfig.stall_warning_secs
    stall_timeout_secs: int = TrainConfig.stall_timeout_secs
    worker_gone_secs: int = TrainConfig.worker_gone_secs
    allow_public_addresses: bool = False
    skip_own_address_check: bool = False
    # The levers (training/step/taken.py: the runtime makes the update with the optimizer the model_fn built).
    local_steps: int = TrainConfig.local_steps
    steps_per_run: int = TrainConfig.step_path.steps_per_run
    # Synchronous rounds the runtime makes (its SyncReplicasOptimizer over the model_fn's optimizer), each worker
    # sending one gradient per --accumulate_batches batches (one by default).
    accumulate_batches: int = TrainConfig.accumulate_batches
    sync_replicas: bool = False
    # The runtime's update, for a model_fn that leaves it to the runtime (no train_op); None: the model_fn's.
    optimizer: str | None = None
    learning_rate: float = TrainConfig.learning_rate
    momentum: float = TrainConfig.momentum
    # The dynamic tables (--embedding=dynamic); embedding_partitions None: a shard per ps task.
    embedding: str = ModelConfig.embedding
    embedding_capacity: int = ModelConfig.embedding_capacity
    embedding_growth: bool = ModelConfig.embedding_growth
    embedding_min_count: int = ModelConfig.embedding_min_count
    embedding_steps_to_live: int = ModelConfig.embedding_steps_to_live
    embedding_partitions: int | None = None
    incremental_save_secs: int = TrainConfig.incremental_save_secs  # the chief's deltas of the tables' changed rows


def read(env=os.environ) -> Settings:
    """The settings in env's PS_TRAINER_FLAGS; ValueError naming the variable and the flag at fault."""
    text = env.get(VARIABLE, "")
    if not text.strip():
        return Settings()
    values = flags.FlagValues()
    definitions.define(values)
    try:
        leftover = values(["program", *shlex.split(text)])
    except (flags.Error, ValueError) as err:
        raise ValueError(f"{VARIABLE}={text!r}: {err}") from None
    if len(leftover) > 1:
        raise ValueError(f"{VARIABLE}={text!r}: {leftover[1]!r} is not a flag (write --name=value)")
    not_taken = [name for name in values if values[name].present and name not in TAKEN]
    if not_taken:
        raise ValueError(f"{VARIABLE}: --{not_taken[0]} is not taken by an Estimator program's tasks; these are: "
                         + ", ".join(f"--{name}" for name in TAKEN))
    if values.accumulate_batches > 1 and not values.sync_replicas:
        raise ValueError(f"{VARIABLE}: --accumulate_batches={values.accumulate_batches} is for --sync_replicas (the "
                         "runtime's synchronous rounds); asynchronous workers send one update per several batches "
                         "with --local_steps")
    if values.embedding != "dynamic":  # a table setting for no table would be believed on
        for name in dynamic.OWN_FLAGS + ("embedding_partitions", "incremental_save_secs"):
            if values[name].present:
                raise ValueError(f"{VARIABLE}: --{name} is for --embedding=dynamic (the dynamic tables of the "
                                 "model_fn's dynamic_embedding_columns): add --embedding=dynamic or drop the flag")
    return Settings(**{name: values[name].value for name in TAKEN if values[name].present})
