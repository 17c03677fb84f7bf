"""What a task reads and checks on disk when it starts: after its flags are read (flags/config.py opens no
file of the run) and before its server, so that a refusal here is a usage error like a flag's.

- --model_dir can be reached, made and written (a ps given none keeps none);
- --cache, when a directory, is not a file (a ps reads no data: not checked);
- --model_fn's file runs and holds the function (each task that builds the model loads it there);
- a run that resumes keeps the number of shards its checkpoints' tables are cut into (run.json) where their
  kind says so (dynamic tables: their IDs restore only into as many shards), unless --embedding_partitions
  says otherwise.
"""

import dataclasses
import os

import tensorflow as tf
from absl import app

from ps_trainer import input as inputs
from ps_trainer import model
from ps_trainer.cluster import spec
from ps_trainer.model import user_fn
from ps_trainer.input import storage
from ps_trainer.training import run_record
from ps_trainer.training.config import RunConfig


def settle(cfg: RunConfig) -> RunConfig:
    """cfg checked against the disk, with what model_dir holds in place of the defaults it overrides;
    UsageError naming the flag at fault."""
    _check_model_dir(cfg)
    if cfg.cluster.job_name == spec.PS:  # a ps reads no data, and its host may have none
        return cfg
    _check_cache(cfg.data)
    if cfg.model.model_fn:
        try:
            user_fn.load(cfg.model.model_fn)
        except user_fn.ModelFnError as err:
            raise app.UsageError(str(err)) from None
    if "embedding_partitions" in cfg.given or not model.has_tables(cfg.model.name, cfg.model.embedding):
        return cfg
    shards = run_record.resumed_shards(cfg.train.model_dir, cfg.model.embedding)
    if not shards:
        return cfg
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, embedding_partitions=shards))


def _check_model_dir(cfg: RunConfig) -> None:
    model_dir = cfg.train.model_dir
    problem = storage.problem("model_dir", model_dir) if cfg.cluster.job_name != spec.PS else None
    if problem:
        raise app.UsageError(problem)
    if model_dir and "://" not in model_dir:
        unwritable = unwritable_directory(model_dir)
        if unwritable:
            raise app.UsageError(f"--model_dir={model_dir} cannot be created or written: {unwritable}")


def _check_cache(data: inputs.DataConfig) -> None:
    cache = data.cache
    if cache not in (None, inputs.NO_CACHE, inputs.MEMORY) and tf.io.gfile.exists(cache) \
            and not tf.io.gfile.isdir(cache):
        raise app.UsageError(f"--cache={cache} is a file: give 'none', 'memory' or a directory.")


def unwritable_directory(path: str) -> str | None:
    """Why a local directory cannot be made or written (looked at, not made), or None."""
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"{existing} is a file"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable by this user"
    return None
