"""<model_dir>/run.json: what a run trains, for the other readers of model_dir.

The chief writes it each time training starts (a rerun with more steps rewrites it): the global step
the run trains to, the model, and the data settings that shape the model or name the held-out
examples. The evaluator follows it, so that one started with only --job_name=evaluator and
--model_dir builds the run's model and stops at the run's last step, whatever its own flags say.
Paths (--data_dir, --eval_data_dir) and reading choices (--cache, --skip_bad_records) stay each
reader's own.
"""

import dataclasses
import json

import tensorflow as tf

from ps_trainer import model
from ps_trainer.model import tables
from ps_trainer.cluster import model_dir as layout
from ps_trainer.input import storage
from ps_trainer.training import exit_codes

_DATA_OWN = ("data_dir", "eval_data_dir", "cache", "skip_bad_records")
# What only the training graph of this run does (mark the rows it changes for its delta checkpoints):
# no reader's graph takes it.
_MODEL_OWN = ("mark_touched_rows",)


def write(cfg) -> None:
    data = {k: v for k, v in dataclasses.asdict(cfg.data).items() if k not in _DATA_OWN}
    model_settings = {k: v for k, v in dataclasses.asdict(cfg.model).items() if k not in _MODEL_OWN}
    record = {"train_steps": cfg.train.train_steps, "model": model_settings, "data": data,
              "num_ps": cfg.cluster.num_ps}
    storage.write_whole(layout.run_record(cfg.train.model_dir), json.dumps(record, indent=1))


def read(model_dir: str) -> dict | None:
    """The record, or None if the run wrote none (yet). A file there that is no record (not JSON, or no
    model settings in it: edited by hand, or a disk's fault) ends the task naming it: the chief would
    resume by it and the evaluator follow it."""
    path = layout.run_record(model_dir)
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            text = f.read()
    except tf.errors.NotFoundError:
        return None
    try:
        record = json.loads(text)
        problem = None if isinstance(record, dict) and isinstance(record.get("model"), dict) else "no model settings"
    except ValueError as err:  # JSONDecodeError, or bytes that are not UTF-8
        problem = str(err)
    if problem:
        raise exit_codes.Failure(f"{path} is not the run record this trainer writes ({problem}): move it aside and "
                                 "start the chief again, which writes it anew from its flags",
                                 exit_codes.RUN_RECORD_UNREADABLE)
    return record


def resumed_shards(model_dir: str, embedding: str) -> int | None:
    """The shards of `embedding` tables that a resume of model_dir's checkpoints keeps unless
    --embedding_partitions says otherwise (model/tables.py's TableKind.resumed_shards), or None (no
    checkpoint, another kind of table, or a kind that takes this run's cut)."""
    record = read(model_dir) if tf.train.latest_checkpoint(model_dir) else None
    if record is None or record["model"].get("embedding", "hashed") != embedding:
        return None
    return tables.KINDS[embedding].resumed_shards(record["model"])


def layout_change(record: dict | None, cfg) -> str | None:
    """A line saying so when this run cuts the partitioned tables into another number of shards than
    the run that wrote `record` (the ps count changed, or --embedding_partitions), else None.
    TensorFlow's Saver restores a partitioned variable, and its optimizer slots, into any cut: each
    is saved whole, as slices."""
    if record is None:
        return None
    before, now = record["model"].get("embedding_partitions"), cfg.model.embedding_partitions
    if before is None or before == now:
        return None
    ps = (f"; the ps tasks went from {record['num_ps']} to {cfg.cluster.num_ps}"
          if record.get("num_ps") not in (None, cfg.cluster.num_ps) else "")
    return (f"the checkpoint's tables are cut into {before} piece(s) each, this run's into {now}{ps}: they and "
            "their optimizer slots are restored into the new pieces, every value as saved")


# The model settings that give its variables their shapes (the model's flag is --model): what a resume
# refused for shapes (checkpoints.shape_refusal) is told to look at.
SHAPE_SETTINGS = ("name", "hidden_units", "embedding_dim", "hash_buckets")


def shape_flags(record: dict | None, cfg) -> list[str]:
    """'--flag=value' as the run that wrote `record` had it, for each SHAPE_SETTINGS this run has otherwise
    (a table kind's own flag only for that kind's tables: --hash_buckets for hashed ones)."""
    others = {flag for kind, module in tables.KINDS.items() if kind != cfg.model.embedding for flag in module.OWN_FLAGS}
    changed = []
    for setting in SHAPE_SETTINGS:
        saved = (record or {}).get("model", {}).get(setting)
        if saved is None or setting in others:
            continue
        if (tuple(saved) if isinstance(saved, list) else saved) != getattr(cfg.model, setting):  # JSON: a list
            changed.append(f"--{'model' if setting == 'name' else setting}={_flag_value(saved)}")
    return changed


def layout_refusal(record: dict | None, cfg) -> str | None:
    """Why this run cannot resume the run that wrote `record`, or None: a checkpoint's tables restore into
    the same kind of table only, and each kind says what else it needs (model/tables.py)."""
    if record is None:
        return None
    before = record["model"].get("embedding", "hashed")
    if before != cfg.model.embedding:
        return (f"--embedding={cfg.model.embedding}: the checkpoints in this --model_dir hold {before} tables; "
                f"resume with --embedding={before}, or train the other kind in a new --model_dir")
    return tables.KINDS[before].restore_refusal(record["model"], cfg.model)


# The data settings a worker must share with the chief, besides the model's: what it reads and how it
# parses it. Paths, caching, shuffling and the queue's own knobs are each task's.
SHARED_DATA = ("name", "label_column", "numeric_columns", "categorical_columns", "multi_valued_columns", "num_classes",
               "numeric_default", "input_queue")
_NOT_SHARED_MODEL = ("table_devices",)  # set for each graph as it is built


def peer_refusal(record: dict | None, cfg) -> str | None:
    """Why this worker cannot train beside the chief that wrote `record`, or None: a model or data flag of
    its own differs from the chief's. Its steps would update the chief's variables through another graph: other
    hash buckets, columns or admission rules train rows the chief's model never reads."""
    if record is None:
        return None
    differ = []
    for section, own, names in (("model", cfg.model, [n for n in record["model"] if n not in _NOT_SHARED_MODEL]),
                                ("data", cfg.data, SHARED_DATA)):
        for name in names:
            if name not in record[section] or not hasattr(own, name):
                continue
            saved, mine = record[section][name], getattr(own, name)
            if (tuple(saved) if isinstance(saved, list) else saved) != mine:
                flag = {"model": "model", "data": "dataset"}[section] if name == "name" else name
                differ.append((flag, _flag_value(mine), _flag_value(saved)))
    if not differ:
        return None
    return (" ".join(f"--{flag}={mine}" for flag, mine, _ in differ) + ": the chief trains with "
            + " ".join(f"--{flag}={saved}" for flag, _, saved in differ)
            + f" ({layout.RUN_RECORD} in --model_dir): every worker needs the chief's model and data flags; start this "
            "one with them")


def follow(cfg, record: dict):
    """cfg with the run's train_steps, model and data settings; and 'flag=value' for each the run
    changed, for the log."""
    model_cfg = model.ModelConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in record["model"].items()})
    data_cfg = dataclasses.replace(cfg.data, **{k: tuple(v) if isinstance(v, list) else v
                                                for k, v in record["data"].items()})
    train_cfg = dataclasses.replace(cfg.train, train_steps=record["train_steps"])
    changed = [f"--train_steps={train_cfg.train_steps}"] if train_cfg.train_steps != cfg.train.train_steps else []
    for own, run, name_flag in ((cfg.model, model_cfg, "model"), (cfg.data, data_cfg, "dataset")):
        changed += [f"--{name_flag if name == 'name' else name}={_flag_value(value)}"
                    for name, value in dataclasses.asdict(run).items() if getattr(own, name) != value]
    return dataclasses.replace(cfg, train=train_cfg, model=model_cfg, data=data_cfg), changed


def _flag_value(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)
