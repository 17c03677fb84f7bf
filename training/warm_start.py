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

A dynamic table loads by ID, by the chief once the variables are initialized (DynamicLoad), then reconciled
as after a restore; the other workers wait for it. Cut into as many shards as the source's, with row variables
of the same length, each shard's ID -> row map, counters and rows (slots with --warm_start_slots) are restored
as they were saved. Cut otherwise (another --embedding_partitions, or another count of ps tasks), or of another
--embedding_capacity, it is re-cut (recut()): each shard's ps reads every ID of the source's shards and keeps
its own, at new rows, with their rows' values, slots and admission counts.

A variable whose shape differs is refused by name, with both shapes: a hashed table of another size cannot be
remapped, since its rows are hash buckets, not IDs. So is a dynamic table whose rows are of another width, a
warm start that would load nothing, and a rename that names nothing of the model.
"""

from typing import Callable, NamedTuple

import tensorflow as tf
from absl import logging
from tensorflow.python.ops import resources  # the shared resources Scaffold's default init_op initializes

from ps_trainer.model.dynamic import ids as dynamic_ids
from ps_trainer.model.dynamic import storage, upkeep
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


def model_variables(graph_tables, with_slots: bool = False) -> dict:
    """The graph's trainable variables by full name but the dynamic tables' of `graph_tables`: {name: (shape,
    variable or its parts)}; `with_slots`: also the global variables kept under one of their names (the
    optimizer's slots, "<variable>/Adagrad")."""
    shards = tuple(scope + "/" for scope in _dynamic_shards(graph_tables))
    found = {name: value for name, value in _by_full_name(v1.trainable_variables()).items()
             if not name.startswith(shards)}
    if with_slots:
        trained = tuple(name + "/" for name in found)
        found.update({name: value for name, value in _by_full_name(v1.global_variables()).items()
                      if name not in found and name.startswith(trained)})
    return found


def _dynamic_shards(graph_tables) -> dict:
    """The shards of the dynamic tables of `graph_tables` (None: a model without tables) trained in the default
    graph, by scope."""
    if graph_tables is None:
        return {}
    return {shard.scope: shard for _, shard in graph_tables.of().trained_shards}


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
    saver: object  # tf.compat.v1.train.Saver of the shards' state under the checkpoint's names (None: none)
    recut: tuple  # the re-cut tables' loads by ID (recut())
    after_restore: Callable  # (session): the tables' reconciliation after a restore (model/dynamic/upkeep.py)
    done: tf.Variable

    def init_fn(self, scaffold, session):
        del scaffold
        if self.saver is not None:
            self.saver.restore(session, self.checkpoint)
        try:
            session.run(self.recut)
        except tf.errors.InvalidArgumentError as err:  # a shard given more IDs than it can hold
            raise exit_codes.Failure(storage.full_table_message(err.message) or err.message.splitlines()[0],
                                     exit_codes.BAD_FLAGS) from err
        self.after_restore(session)
        session.run(self.done.initializer)


class TableLoad(NamedTuple):
    """What the dynamic tables load: (the checkpoint's name, a variable or a map's saveable) pairs restored as
    saved, the re-cut tables' loads by ID, the tables loaded (re-cut or not), those re-cut, and those left
    fresh (not in the checkpoint)."""
    entries: list
    recut: list
    loaded: list
    recut_tables: list
    fresh: list


def dynamic_entries(graph_tables, checkpoint: str, renames, with_slots: bool, slots_of,
                    loads: bool = True) -> TableLoad:
    """What the dynamic tables load from `checkpoint` (`loads`: the re-cut tables' loads built too, for the
    chief, which loads them); Failure (bad flags) naming a variable whose rows are of another width."""
    reader = tf.train.load_checkpoint(checkpoint)
    saved, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    unsaved = {variable.op.name for variable in v1.get_collection(checkpoints.NOT_SAVED)}
    by_table = {}
    for scope, shard in sorted(_dynamic_shards(graph_tables).items(), key=lambda item: item[1].shard):
        by_table.setdefault(scope.rpartition("/shard")[0], []).append((scope, shard))
    load = TableLoad([], [], [], [], [])
    for table, shards in sorted(by_table.items()):
        source_table = source_name(table, renames)[0]
        count = len({name.rpartition("/rows_of_ids")[0] for name in saved
                     if name.startswith(source_table + "/shard") and name.endswith("/rows_of_ids-keys")})
        if not count:
            load.fresh.append(table)
            continue
        load.loaded.append(table)
        pairs = []  # (a variable of a shard here, its name in the checkpoint's shard of the same number), saved
        for scope, shard in shards:
            slots = {slot.op.name for variable, _ in shard.storages for slot, _ in slots_of(variable)}
            rows_variables = {id(variable) for variable, _ in shard.row_variables(slots_of)}
            for variable in v1.global_variables():
                name = variable.op.name
                if not name.startswith(scope + "/") or name in unsaved or (name in slots and not with_slots):
                    continue
                source = source_table + scope[len(table):] + name[len(scope):]
                if source not in saved:
                    continue  # a state the source had not (eviction's, admission counts): it starts fresh
                if id(variable) in rows_variables and variable.shape[1:] != saved[source][1:]:
                    raise exit_codes.Failure(f"--warm_start_from={checkpoint}: {name} is {variable.shape.as_list()} "
                                             f"here and {saved[source]} there: its rows are of another width",
                                             exit_codes.BAD_FLAGS)
                pairs.append((variable, source))
        as_saved = count == len(shards) and all(variable.shape.is_compatible_with(saved[source])
                                                for variable, source in pairs)
        if not as_saved:
            load.recut_tables.append(table)
            if loads:
                load.recut.extend(recut(checkpoint, table, source_table, count, shards, with_slots, slots_of,
                                        saved, dtypes))
            continue
        load.entries.extend((source, variable) for variable, source in pairs)
        for scope, shard in shards:
            source_scope = source_table + scope[len(table):]
            for table_map in (shard.map, shard.sightings):
                source = source_scope + table_map.full_name[len(scope):] if table_map is not None else None
                if source is not None and source + "-keys" in saved:
                    load.entries.append((source, storage.MapPairs(table_map, source)))
    return load


def recut(checkpoint: str, table: str, source_table: str, count: int, shards: list, with_slots: bool, slots_of,
          saved: dict, dtypes: dict) -> list:
    """The load by ID of dynamic table `table` from the checkpoint's `count` shards of `source_table`, one op
    per shard here, on its ps: it reads the source's shards one after another, keeping of each the IDs that
    shard_of() gives it (so it holds one source shard and its own rows at a time), and puts them at rows 1, 2, ...
    (growing a growing shard to hold them) with their rows of each trained variable (and optimizer slot, with
    `with_slots`) and their admission counts. Their last-read steps are this run's first. A shard given more
    IDs than it can hold fails its assertion with a full table's message."""

    def read(name):
        value = tf.raw_ops.RestoreV2(prefix=checkpoint, tensor_names=[name], shape_and_slices=[""],
                                     dtypes=[dtypes[name]])[0]
        value.set_shape(saved[name])
        return value

    sources = [f"{source_table}/shard{index}" for index in range(count)]
    counted = all(f"{source}/sightings-keys" in saved for source in sources)
    ops = []
    for scope, shard in shards:
        slots = {id(slot) for variable, _ in shard.storages for slot, _ in slots_of(variable)}
        variables = [variable for variable, _ in shard.row_variables(slots_of)
                     if variable.dtype.base_dtype.is_floating and (with_slots or id(variable) not in slots)
                     and variable.op.name.startswith(scope + "/")
                     and all(source + variable.op.name[len(scope):] in saved for source in sources)]

        def ours(ids, *values, shard=shard):
            mine = tf.equal(dynamic_ids.shard_of(ids, shard.options.shards), shard.shard)
            return [tf.boolean_mask(value, mine) for value in (ids, *values)]

        with v1.device(shard.map.resource_handle.device), v1.name_scope(f"warm_start/{scope}/"):
            kept = []  # of each source shard: [its IDs that are ours, their rows of each variable]
            for source in sources:
                with tf.control_dependencies(tf.nest.flatten(kept[-1:])):  # one source shard at a time
                    keys, rows = ours(read(f"{source}/rows_of_ids-keys"), read(f"{source}/rows_of_ids-values"))
                    kept.append([keys] + [tf.gather(read(source + variable.op.name[len(scope):]), rows)
                                          for variable in variables])
            keys, *values = (tf.concat(parts, 0) for parts in zip(*kept))
            needed = tf.size(keys, out_type=tf.int64) + storage.DEFAULT_ROW + 1  # the default row's and theirs
            full = tf.debugging.assert_less_equal(
                needed, tf.constant(shard.capacity, tf.int64),
                message=f"embedding table {table} is full: shard {shard.shard} holds {shard.capacity} rows "
                        f"(--embedding_capacity={shard.options.capacity} over {shard.options.shards} shards), fewer "
                        f"than --warm_start_from={checkpoint} gives it; raise --embedding_capacity")
            with tf.control_dependencies([full]):
                needed = tf.identity(needed)
            rows = tf.range(storage.DEFAULT_ROW + 1, needed)
            sightings = None
            if shard.sightings is not None and counted:
                sightings = [tf.concat(parts, 0) for parts in zip(*(
                    ours(read(f"{source}/sightings-keys"), read(f"{source}/sightings-values")) for source in sources))]

            def load(keys=keys, rows=rows, values=values, sightings=sightings, shard=shard, variables=variables):
                changes = [shard.map.insert(keys, rows)]
                changes += [v1.scatter_update(variable, rows, value) for variable, value in zip(variables, values)]
                if sightings is not None:
                    changes.append(shard.sightings.insert(*sightings))
                return tf.group(changes)

            ops.append(upkeep.holding(shard, needed, slots_of, load))
    return ops


def apply(train_cfg, task_name: str, is_chief: bool, graph_tables=None, slots_of=None,
          after_restore=None) -> DynamicLoad | None:
    """Before the saver is built, in the graph of the model and its optimizer: sets the initializers of the
    variables --warm_start_from loads (every worker checks; the chief's initialize them), unless model_dir
    holds a checkpoint to resume. With dynamic tables (those of `graph_tables`), the chief's graph gets their
    load, returned for its Scaffold, and every worker's the `done` variable it waits for."""
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
    variables = model_variables(graph_tables, train_cfg.warm_start_slots)
    shards = _dynamic_shards(graph_tables)
    tables = (dynamic_entries(graph_tables, checkpoint, train_cfg.warm_start_map, train_cfg.warm_start_slots, slots_of,
                              is_chief) if shards else TableLoad([], [], [], [], []))
    loaded = plan(checkpoint, variables, train_cfg.warm_start_map, tuple(shards), loads_tables=bool(tables.loaded))
    for source, variable in loaded.assignment:
        v1.train.init_from_checkpoint(checkpoint, {source: variable})
    load = None
    if tables.loaded:
        done = v1.get_variable("warm_start_done", [], tf.bool, initializer=v1.zeros_initializer(), trainable=False)
        v1.add_to_collection(checkpoints.NOT_SAVED, done)
    if tables.loaded and is_chief:  # another worker only waits for done
        # Every initializer but done's; the tables' state is loaded in init_fn. As MonitoredTrainingSession's
        # default init_op otherwise (the Scaffold takes the graph's INIT_OP).
        v1.add_to_collection(v1.GraphKeys.INIT_OP, tf.group(
            v1.variables_initializer([variable for variable in v1.global_variables() if variable is not done]),
            resources.initialize_resources(resources.shared_resources()),
            *v1.get_collection("saved_model_initializers")))
        saver = v1.train.Saver(dict(tables.entries), sharded=True) if tables.entries else None
        load = DynamicLoad(checkpoint, saver, tuple(tables.recut), after_restore or (lambda session: None), done)
    if is_chief:
        deltas = incremental.deltas_of(checkpoint)
        if deltas:
            logging.warning("%s: --warm_start_from: %s has %d delta checkpoint(s) after it, which a warm start does "
                            "not read: its tables load as of that full checkpoint", task_name, checkpoint, len(deltas))
        logging.info("%s: warm start from %s: %d variable(s) loaded%s%s; %d left fresh%s; the global step and the "
                     "input start fresh%s", task_name, checkpoint, len(loaded.assignment),
                     f", {len(tables.loaded)} dynamic table(s) by ID" if tables.loaded else "",
                     (f" ({len(tables.recut_tables)} re-cut into this run's shards and capacity: "
                      f"{', '.join(tables.recut_tables)})" if tables.recut_tables else "")
                     + "".join(f", {name} from {source}" for name, source in loaded.renamed),
                     len(loaded.fresh) + len(tables.fresh),
                     f" ({', '.join(loaded.fresh + tables.fresh)})" if loaded.fresh or tables.fresh else "",
                     "" if train_cfg.warm_start_slots else
                     ", and so do the optimizer's slots (--warm_start_slots loads them)")
    return load
