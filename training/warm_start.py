"""--warm_start_from: a fresh run's model variables start from another run's checkpoint.

Every trainable variable of the model whose name (after --warm_start_map's renames) and shape match a
tensor of the checkpoint is initialized from it; the rest start as the model initializes them. The global
step and the input queue start fresh; the optimizer's slots too, unless --warm_start_slots: with
fresh slots (Adagrad's, FTRL's accumulators at their start) the first steps move the loaded weights as
far as a new run's first steps do. Only a run that starts: once model_dir holds a
checkpoint, that checkpoint is what the run resumes. The values are read by the ps tasks that hold the
variables (TensorFlow's init_from_checkpoint puts each read beside its variable), so the checkpoint must be
at a path they can read, as model_dir is. A model_dir's latest full checkpoint is read without the deltas
after it (--incremental_save_secs; the chief says so): a finished run's last checkpoint is a full one.

A variable whose shape differs is refused by name, with both shapes: a hashed table of another size cannot be
remapped, since its rows are hash buckets, not IDs. So is a warm start that would load nothing, and a rename
that names no variable of the model.
"""

from typing import NamedTuple

import tensorflow as tf
from absl import logging

from ps_trainer.training import exit_codes, incremental

v1 = tf.compat.v1


class Loaded(NamedTuple):
    """What a warm start loads: (name in the checkpoint, the variable or a partitioned one's parts) of each
    (a tensor can load two variables: a rename and the name itself), (this model's name, the checkpoint's)
    of each renamed one, and the names left fresh."""
    assignment: list
    renamed: list
    fresh: list


def checkpoint_of(path: str) -> str | None:
    """The checkpoint --warm_start_from names: a model_dir's latest, or a checkpoint prefix; None if neither."""
    if tf.io.gfile.isdir(path):
        return tf.train.latest_checkpoint(path)
    return path if tf.io.gfile.exists(path + ".index") else None


def model_variables(with_slots: bool = False) -> dict:
    """The graph's trainable variables by full name: {name: (shape, variable or its parts)}; `with_slots`:
    also the global variables kept under one of their names (the optimizer's slots, "<variable>/Adagrad")."""
    found = _by_full_name(v1.trainable_variables())
    if with_slots:
        trained = tuple(name + "/" for name in found)
        found.update({name: value for name, value in _by_full_name(v1.global_variables()).items()
                      if name not in found and name.startswith(trained)})
    return found


def _by_full_name(variables) -> dict:
    found = {}
    for variable in variables:
        sliced = getattr(variable, "_save_slice_info", None)
        if sliced is None:
            found[variable.op.name] = (list(variable.shape), variable)
        else:  # a part of a partitioned variable: the checkpoint holds the whole
            _, parts = found.setdefault(sliced.full_name, (list(sliced.full_shape), []))
            parts.append(variable)
    return found


def source_name(name: str, renames) -> tuple[str, bool]:
    """(the checkpoint's name for this model's variable `name`, whether a rename gave it): renames are
    (old, new) pairs of name prefixes, the checkpoint's old for this model's new, whole path parts only."""
    for old, new in renames:
        if name == new or name.startswith(new + "/"):
            return old + name[len(new):], True
    return name, False


def plan(checkpoint: str, variables: dict, renames) -> Loaded:
    """What to load from `checkpoint` into `variables` (model_variables()); Failure (bad flags) naming the
    first variable whose shape differs, a rename that names no variable, or a load of nothing."""
    saved = dict(tf.train.list_variables(checkpoint))
    for old, new in renames:
        if not any(source_name(name, [(old, new)])[1] for name in variables):
            raise exit_codes.Failure(f"--warm_start_map={old}={new}: no variable of this model is named {new} or "
                                     f"under {new}/", exit_codes.BAD_FLAGS)
    assignment, renamed, fresh = [], [], []
    for name, (shape, variable) in sorted(variables.items()):
        source, was_renamed = source_name(name, renames)
        if source not in saved:
            fresh.append(name)
            continue
        if list(saved[source]) != shape:
            raise exit_codes.Failure(
                f"--warm_start_from={checkpoint}: {name} is {shape} here and {list(saved[source])} there"
                + (f" (as {source})" if was_renamed else "") + "; a hashed table of another size cannot be "
                "remapped (its rows are hash buckets, not IDs): give both runs the same size, or rename the "
                "variable away with --warm_start_map", exit_codes.BAD_FLAGS)
        assignment.append((source, variable))
        if was_renamed:
            renamed.append((name, source))
    if not assignment:
        raise exit_codes.Failure(f"--warm_start_from={checkpoint}: none of this model's variables is in it (it holds "
                                 f"{', '.join(sorted(saved)[:5])}...); is it this model's? --warm_start_map renames",
                                 exit_codes.BAD_FLAGS)
    return Loaded(assignment, renamed, fresh)


def apply(train_cfg, task_name: str, is_chief: bool) -> None:
    """Before the saver is built, in the graph of the model and its optimizer: sets the initializers of the
    variables --warm_start_from loads (every worker checks; the chief's initialize them), unless model_dir
    holds a checkpoint to resume."""
    if not train_cfg.warm_start_from:
        return
    resumed = train_cfg.model_dir and tf.train.latest_checkpoint(train_cfg.model_dir)
    if resumed:
        if is_chief:
            logging.info("%s: --warm_start_from=%s not read: this run resumes %s", task_name,
                         train_cfg.warm_start_from, resumed)
        return
    checkpoint = checkpoint_of(train_cfg.warm_start_from)
    if checkpoint is None:
        raise exit_codes.Failure(f"--warm_start_from={train_cfg.warm_start_from}: no checkpoint there",
                                 exit_codes.BAD_FLAGS)
    loaded = plan(checkpoint, model_variables(train_cfg.warm_start_slots), train_cfg.warm_start_map)
    for source, variable in loaded.assignment:
        v1.train.init_from_checkpoint(checkpoint, {source: variable})
    if is_chief:
        deltas = incremental.deltas_of(checkpoint)
        if deltas:
            logging.warning("%s: --warm_start_from: %s has %d delta checkpoint(s) after it, which a warm start does "
                            "not read: its tables load as of that full checkpoint", task_name, checkpoint, len(deltas))
        logging.info("%s: warm start from %s: %d variable(s) loaded%s; %d left fresh%s; the global step and the "
                     "input start fresh%s", task_name, checkpoint, len(loaded.assignment),
                     "".join(f", {name} from {source}" for name, source in loaded.renamed),
                     len(loaded.fresh), f" ({', '.join(loaded.fresh)})" if loaded.fresh else "",
                     "" if train_cfg.warm_start_slots else ", and so do the optimizer's slots (--warm_start_slots loads them)")
