"""--warm_start_from: a fresh run's model starts from another run's checkpoint.

Every trainable variable of the model whose name (after --warm_start_map's renames) and shape match a
tensor of the checkpoint is initialized from it; the rest start as the model initializes them. The global
step and the input queue start fresh; the optimizer's slots too, unless --warm_start_slots: with
fresh slots (Adagrad's, FTRL's accumulators at their start) the first steps move the loaded weights as
far as a new run's first steps do. Only a run that starts: once model_dir holds a
checkpoint, that checkpoint is what the run resumes. The values are read by the ps tasks that hold the
variables (TensorFlow's init_from_checkpoint puts each read beside its variable), so the checkpoint must be
at a path they can read, as model_dir is. A model_dir's latest full checkpoint is read without the deltas
after it (--incremental_save_secs; the chief says so): a finished run's last checkpoint is a full one.

A dynamic table loads by ID: each shard's ID -> row map, counters and rows (slots with --warm_start_slots),
restored by the chief once the variables are initialized (DynamicLoad), then reconciled as after a restore;
the other workers wait for it. Its IDs load only into as many shards as the source had.

A variable whose shape differs is refused by name, with both shapes: a hashed table of another size cannot be
remapped, since its rows are hash buckets, not IDs. So is a dynamic table cut otherwise, a warm start that would
load nothing, and a rename that names nothing of the model.
"""

from typing import Callable, NamedTuple

import tensorflow as tf
from absl import logging
from tensorflow.python.ops import resources  # the shared resources Scaffold's default init_op initializes

from ps_trainer.model import registry
from ps_trainer.model.dynamic import storage
from ps_trainer.training import checkpoints, exit_codes, incremental

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
    shards = tuple(scope + "/" for scope in _dynamic_shards())
    found = {name: value for name, value in _by_full_name(v1.trainable_variables()).items()
             if not name.startswith(shards)}
    if with_slots:
        trained = tuple(name + "/" for name in found)
        found.update({name: value for name, value in _by_full_name(v1.global_variables()).items()
                      if name not in found and name.startswith(trained)})
    return found


def _dynamic_shards() -> dict:
    """The dynamic tables' shards trained in the default graph, by scope."""
    return {shard.scope: shard for _, shard in registry.of().trained_shards}


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


def plan(checkpoint: str, variables: dict, renames, tables: tuple = (), loads_tables: bool = False) -> Loaded:
    """What to load from `checkpoint` into `variables` (model_variables()), beside the dynamic `tables` (their
    shards' scopes; `loads_tables`: some load); Failure (bad flags) naming the first variable whose shape
    differs, a rename that names nothing, or a load of nothing."""
    saved = dict(tf.train.list_variables(checkpoint))
    for old, new in renames:
        if not any(source_name(name, [(old, new)])[1] for name in (*variables, *tables)):
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
    if not assignment and not loads_tables:
        raise exit_codes.Failure(f"--warm_start_from={checkpoint}: none of this model's variables is in it (it holds "
                                 f"{', '.join(sorted(saved)[:5])}...); is it this model's? --warm_start_map renames",
                                 exit_codes.BAD_FLAGS)
    return Loaded(assignment, renamed, fresh)


class DynamicLoad(NamedTuple):
    """The load of the dynamic tables' shards (each ID -> row map, its counters and rows; the rows' slots with
    --warm_start_slots): the chief's, once the run's variables are initialized and before any worker steps.
    The workers wait for `done` with the other variables; the run's init_op (the graph's INIT_OP) leaves it to
    init_fn, which sets it last."""
    checkpoint: str
    saver: object  # tf.compat.v1.train.Saver of the shards' state under the checkpoint's names
    after_restore: Callable  # (session): the tables' reconciliation after a restore (model/dynamic/upkeep.py)
    done: tf.Variable

    def init_fn(self, scaffold, session):
        del scaffold
        self.saver.restore(session, self.checkpoint)
        self.after_restore(session)
        session.run(self.done.initializer)


def dynamic_entries(checkpoint: str, renames, with_slots: bool, slots_of) -> tuple[list, list, list]:
    """(what the dynamic tables' shards load: (the checkpoint's name, a variable or a map's saveable) pairs,
    the tables loaded, the tables left fresh: not in the checkpoint). Failure (bad flags) naming a table the
    checkpoint cuts into another number of shards, or a variable whose width differs."""
    saved = dict(tf.train.list_variables(checkpoint))
    unsaved = {variable.op.name for variable in v1.get_collection(checkpoints.NOT_SAVED)}
    by_table = {}
    for scope, shard in sorted(_dynamic_shards().items()):
        by_table.setdefault(scope.rpartition("/shard")[0], []).append((scope, shard))
    entries, loaded, fresh = [], [], []
    for table, shards in by_table.items():
        source_table = source_name(table, renames)[0]
        found = [f"{source_table}/shard{index}/rows_of_ids-keys" in saved for index in range(len(shards) + 1)]
        if not any(found):
            fresh.append(table)
            continue
        if not all(found[:-1]) or found[-1]:
            count = sum(1 for name in saved if name.startswith(source_table + "/shard") and name.endswith("/rows_of_ids-keys"))
            raise exit_codes.Failure(
                f"--warm_start_from={checkpoint}: the dynamic table {table} is cut into {len(shards)} shard(s) here and "
                f"{count} there: its IDs load only into as many shards; give --embedding_partitions={count}",
                exit_codes.BAD_FLAGS)
        loaded.append(table)
        for scope, shard in shards:
            source_scope = source_table + scope[len(table):]
            slots = {slot.op.name for variable, _ in shard.storages for slot, _ in slots_of(variable)}
            for variable in v1.global_variables():
                name = variable.op.name
                if not name.startswith(scope + "/") or name in unsaved or (name in slots and not with_slots):
                    continue
                source = source_scope + name[len(scope):]
                if source not in saved:
                    continue  # a state the source had not (eviction's, admission counts): it starts fresh
                if not variable.shape.is_compatible_with(saved[source]):
                    raise exit_codes.Failure(f"--warm_start_from={checkpoint}: {name} is {variable.shape.as_list()} "
                                             f"here and {saved[source]} there", exit_codes.BAD_FLAGS)
                entries.append((source, variable))
            for table_map in (shard.map, shard.sightings):
                source = source_scope + table_map.full_name[len(scope):] if table_map is not None else None
                if source is not None and source + "-keys" in saved:
                    entries.append((source, storage.MapPairs(table_map, source)))
    return entries, loaded, fresh


def apply(train_cfg, task_name: str, is_chief: bool, slots_of=None, after_restore=None) -> DynamicLoad | None:
    """Before the saver is built, in the graph of the model and its optimizer: sets the initializers of the
    variables --warm_start_from loads (every worker checks; the chief's initialize them), unless model_dir
    holds a checkpoint to resume. With dynamic tables, the chief's graph gets their load, returned for its
    Scaffold, and every worker's the `done` variable it waits for."""
    if not train_cfg.warm_start_from:
        return None
    resumed = train_cfg.model_dir and tf.train.latest_checkpoint(train_cfg.model_dir)
    if resumed:
        if is_chief:
            logging.info("%s: --warm_start_from=%s not read: this run resumes %s", task_name,
                         train_cfg.warm_start_from, resumed)
        return None
    checkpoint = checkpoint_of(train_cfg.warm_start_from)
    if checkpoint is None:
        raise exit_codes.Failure(f"--warm_start_from={train_cfg.warm_start_from}: no checkpoint there",
                                 exit_codes.BAD_FLAGS)
    variables = model_variables(train_cfg.warm_start_slots)
    shards = _dynamic_shards()
    tables, loaded_tables, fresh_tables = (
        dynamic_entries(checkpoint, train_cfg.warm_start_map, train_cfg.warm_start_slots, slots_of)
        if shards else ([], [], []))
    loaded = plan(checkpoint, variables, train_cfg.warm_start_map, tuple(shards), loads_tables=bool(tables))
    for source, variable in loaded.assignment:
        v1.train.init_from_checkpoint(checkpoint, {source: variable})
    load = None
    if tables:
        done = v1.get_variable("warm_start_done", [], tf.bool, initializer=v1.zeros_initializer(), trainable=False)
        v1.add_to_collection(checkpoints.NOT_SAVED, done)
    if tables and is_chief:  # another worker only waits for done
        # Every initializer but done's; the tables' state is loaded in init_fn. As MonitoredTrainingSession's
        # default init_op otherwise (the Scaffold takes the graph's INIT_OP).
        v1.add_to_collection(v1.GraphKeys.INIT_OP, tf.group(
            v1.variables_initializer([variable for variable in v1.global_variables() if variable is not done]),
            resources.initialize_resources(resources.shared_resources()),
            *v1.get_collection("saved_model_initializers")))
        saver = v1.train.Saver(dict(tables), sharded=True)
        load = DynamicLoad(checkpoint, saver, after_restore or (lambda session: None), done)
    if is_chief:
        deltas = incremental.deltas_of(checkpoint)
        if deltas:
            logging.warning("%s: --warm_start_from: %s has %d delta checkpoint(s) after it, which a warm start does "
                            "not read: its tables load as of that full checkpoint", task_name, checkpoint, len(deltas))
        logging.info("%s: warm start from %s: %d variable(s) loaded%s%s; %d left fresh%s; the global step and the "
                     "input start fresh%s", task_name, checkpoint, len(loaded.assignment),
                     f", {len(loaded_tables)} dynamic table(s) by ID" if loaded_tables else "",
                     "".join(f", {name} from {source}" for name, source in loaded.renamed),
                     len(loaded.fresh) + len(fresh_tables),
                     f" ({', '.join(loaded.fresh + fresh_tables)})" if loaded.fresh or fresh_tables else "",
                     "" if train_cfg.warm_start_slots else ", and so do the optimizer's slots (--warm_start_slots loads them)")
    return load
