"""The chief's checkpoints: never a bad one named the newest, a bad one never restored, and the
live training state kept when the ps tasks still hold it.

A save writes each ps's shard under <prefix>_temp/, merges them into <prefix>.index and
<prefix>.data-*, and only then registers <prefix> in the 'checkpoint' state file (written to a
temporary name and renamed). A chief killed part-way leaves files that no state file lists: they
can never be restored, and the Saver would never delete them, so --keep_checkpoint_max would stop
holding. Only the chief saves, so before it starts no save can be in progress.

LiveStateSaver checks each save before registering it (its index reads back, its data files hold
the bytes its variables need): a save that fails for space or permissions, or that does not check,
is removed, logged in one line, and the previous checkpoint stays the newest. Training goes on and
the next save tries again; MAX_FAILED_SAVES in a row end the run with a transient code, and so does
a final save that failed (worker.run: never exit 0 without a final checkpoint). A restore that
cannot read the newest checkpoint (a truncated or corrupt shard, a missing index) names it and
restores the newest one it can read, saying how many steps that went back.
"""

import os
import re
import shutil
import time
from typing import NamedTuple

import numpy as np
import tensorflow as tf
from absl import logging
from tensorflow.python.checkpoint import checkpoint_management  # the Saver's own state-file writer
from tensorflow.python.lib.io import file_io  # the atomic write TensorFlow writes a .meta with

from ps_trainer.cluster import model_dir as layout
from ps_trainer.model import touched_rows
from ps_trainer.training import exit_codes, incremental, log_lines

CHECKPOINT_FILE = re.compile(rf"^({re.escape(layout.CHECKPOINT_PREFIX)}-\d+)(?:_temp.*|\.index|\.data-.*|\.meta)$")
STATE_TEMP_FILE = re.compile(rf"^{re.escape(layout.CHECKPOINT_STATE)}\.tmp[0-9a-f]*$")
# A graph collection: functions of the session that the chief calls just before it restores a
# checkpoint over the ps tasks, to reset state that is no checkpoint's and that a restore makes wrong
# (the sync round each worker last pushed a gradient for, the sync accumulators). Before, not after:
# the other workers start stepping as soon as the restore has initialized every variable, and would
# meet that state before a reset run after it.
RESET_BEFORE_RESTORE = "ps_trainer_reset_before_restore"
# A graph collection: variables that no checkpoint holds, for state that means nothing at another time
# (the input queue's heartbeat of each worker, a wall-clock time). The chief's savers leave them out,
# and a restore initializes them.
NOT_SAVED = "ps_trainer_not_saved"
# Saves in a row that may fail (disk full, storage unwritable) before the run stops with a transient
# code: a full disk that a cleanup frees within a few save intervals costs nothing, one that stays
# full does not train on for hours with nothing saved.
MAX_FAILED_SAVES = 3
# Storage failures of a save: TensorFlow reports ENOSPC as ResourceExhausted, EACCES as
# PermissionDenied, EROFS and EDQUOT under other codes.
STORAGE_ERRORS = (tf.errors.ResourceExhaustedError, tf.errors.PermissionDeniedError)
STORAGE_MESSAGES = ("No space left on device", "Read-only file system", "Disk quota exceeded", "Permission denied")
# What a checkpoint that cannot be read raises on restore: a missing index (NotFound, or the Saver's
# ValueError), a shard cut short (OutOfRange, DataLoss), a bit flip (DataLoss), another model's
# variables (NotFound, InvalidArgument).
UNREADABLE = (tf.errors.DataLossError, tf.errors.NotFoundError, tf.errors.OutOfRangeError,
              tf.errors.InvalidArgumentError, ValueError)


def registered_prefixes(model_dir: str) -> set[str]:
    """The checkpoints model_dir's state file registers; none without a state file. One that cannot be
    read or names no checkpoint ends the task (CHECKPOINT_UNREADABLE) before anything is removed:
    TensorFlow takes such a file for "no checkpoint", so every checkpoint beside it would look like an
    unfinished save, be removed, and training would start again from step 0, exiting 0."""
    path = layout.checkpoint_state(model_dir)
    if not tf.io.gfile.exists(path):
        return set()
    try:
        state = tf.train.get_checkpoint_state(model_dir)  # None (TensorFlow logs why) if unparsable or unreadable
    except ValueError:  # parsed, but names no checkpoint
        state = None
    if state is None:
        raise exit_codes.Failure(
            f"{path}, the state file that names the checkpoints, cannot be read or names none: nothing in "
            f"{model_dir} removed or restored; write one naming the newest checkpoint (model_checkpoint_path: "
            '"model.ckpt-<step>") or move the directory aside to start anew', exit_codes.CHECKPOINT_UNREADABLE)
    paths = {state.model_checkpoint_path, *state.all_model_checkpoint_paths}
    return {os.path.basename(path) for path in paths if path}


def unfinished_save_files(model_dir: str) -> list[str]:
    """Names of checkpoint files and temporaries in model_dir that the state file does not list."""
    if not tf.io.gfile.isdir(model_dir):
        return []
    keep = registered_prefixes(model_dir)
    names = [name.rstrip("/") for name in tf.io.gfile.listdir(model_dir)]
    return sorted([name for name in names if STATE_TEMP_FILE.match(name) or (
        CHECKPOINT_FILE.match(name) and CHECKPOINT_FILE.match(name).group(1) not in keep)]
        + incremental.unfinished_or_orphaned(names, keep))


def remove_interrupted_saves(model_dir: str, task_name: str, quiet: bool = False) -> list[str]:
    """Removes checkpoint files and temporaries that the state file does not list; returns their names."""
    removed = unfinished_save_files(model_dir)
    for name in removed:
        path = os.path.join(model_dir, name)
        if tf.io.gfile.isdir(path):
            tf.io.gfile.rmtree(path)
        else:
            tf.io.gfile.remove(path)
    if removed and not quiet:
        logging.warning("%s: removed %d file(s) of checkpoint saves that never completed (none was "
                        "registered in %s/checkpoint): %s", task_name, len(removed), model_dir,
                        ", ".join(removed))
    return removed


def shape_refusal(prefix: str | None, variables) -> str | None:
    """Why the graph's `variables` cannot resume checkpoint `prefix`, or None: the first whose saved
    value has another shape, named with both. TensorFlow's Saver restores a resource variable whatever
    its shape (AssignVariableOp does not check): a model resumed with layers of other sizes would train
    the checkpoint's shapes under flags that say otherwise. A partitioned variable is saved whole, under
    its full name; a growing table's variables take any length. A checkpoint that cannot be read is the
    restore's to name (LiveStateSaver falls back past it)."""
    if prefix is None:
        return None
    try:
        saved = tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
    except (tf.errors.OpError, ValueError):
        return None
    for variable in variables:
        shard = getattr(variable, "_save_slice_info", None)
        name, shape = (shard.full_name, shard.full_shape) if shard else (variable.op.name, variable.shape)
        if name in saved and not tf.TensorShape(shape).is_compatible_with(saved[name]):
            return (f"{name} is {tf.TensorShape(shape).as_list()} in this run's model and {saved[name]} in "
                    f"{os.path.basename(prefix)}: resume with the model flags it was trained with, or train this "
                    "model in a new --model_dir")
    return None


def report_uninitialized() -> tf.Tensor:
    """The names of the global variables not initialized yet (on the ps): what a restarted ps lacks."""
    uninitialized = tf.compat.v1.report_uninitialized_variables(tf.compat.v1.global_variables())
    uninitialized.mark_used()  # a non-chief's wait for the chief runs it, and a chief's restore; not both
    return uninitialized


def program_scaffold(scaffold, uninitialized, model_dir: str | None, keep_checkpoint_max: int,
                     keep_checkpoint_every_n_hours: float, before_save=None, after_restore=None, slots_of=None,
                     graph_tables=None):
    """A program's Scaffold (an Estimator model_fn's) with the chief's LiveStateSaver (sharded: each ps writes
    its own part) where the program names no saver of its own, in the scaffold or, where TensorFlow's Scaffold
    also looks, the graph's SAVERS collection; the saver goes into that collection too, as TF's Estimator put its
    default saver there, for a program's own CheckpointSaverHook made without one. It also restores a checkpoint
    TensorFlow 2.x's V1 canned estimators wrote in model_dir (tf2_slot_layout; model_dir None: a task that
    restores nothing).
    before_save, after_restore: (session) -> None, the dynamic tables' eviction and reconciliation; slots_of: the
    update's slots of a variable, where the chief saves deltas of the changed rows of the tables of
    `graph_tables` (LiveStateSaver's)."""
    if (scaffold is not None and scaffold.saver is not None) or tf.compat.v1.get_collection(
            tf.compat.v1.GraphKeys.SAVERS):
        return scaffold or tf.compat.v1.train.Scaffold()
    saver = LiveStateSaver(uninitialized, sharded=True, max_to_keep=keep_checkpoint_max, save_relative_paths=True,
                           keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
                           renamed=tf2_slot_layout(model_dir, sharded=True),
                           fresh_state=optimizer_state_layout(model_dir, sharded=True), before_save=before_save,
                           after_restore=after_restore, slots_of=slots_of, graph_tables=graph_tables)
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVERS, saver)
    return tf.compat.v1.train.Scaffold(saver=saver, copy_from_scaffold=scaffold)


def saver_for_restore(scaffold) -> tf.compat.v1.train.Saver:
    """The saver that restores a program's graph, where TensorFlow's Scaffold finds it: the scaffold's own, the
    graph's SAVERS collection's, else one over every saveable object, sharded."""
    if scaffold is not None and scaffold.saver is not None:
        return scaffold.saver
    savers = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVERS)
    return savers[0] if savers else tf.compat.v1.train.Saver(sharded=True, allow_empty=True)


def checkpoint_problem(prefix: str) -> str | None:
    """What is wrong with a written checkpoint, found cheaply (its index read back; its data files'
    count and total size against its variables' bytes), or None."""
    try:
        reader = tf.train.load_checkpoint(prefix)
    except (tf.errors.OpError, ValueError) as err:
        return f"its index cannot be read ({log_lines.error_cause(str(err))})"
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    needed = sum(_num_elements(shapes[name]) * dtypes[name].size for name in shapes if dtypes[name] != tf.string)
    data_files = tf.io.gfile.glob(prefix + ".data-*")
    expected_files = int(data_files[0].rsplit("-of-", 1)[1]) if data_files else 1
    written = sum(tf.io.gfile.stat(path).length for path in data_files)
    if len(data_files) != expected_files or written < needed:
        return (f"its {len(data_files)} of {expected_files} data file(s) hold {written} bytes of the {needed} its "
                "variables need")
    return None


def _num_elements(shape) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


# TensorFlow's wait for a new checkpoint (wait_for_new_checkpoint) looks once a second and returns before a sleep
# that would end past its timeout: at a timeout of one second it returns at once, and a loop around it spins on a
# core. Two seconds at least: a look, a second's sleep, a look.
MIN_CHECKPOINT_WAIT_SECS = 2.0


def new_checkpoints(model_dir: str, wait_secs: float, between_waits):
    """TensorFlow's checkpoints_iterator over model_dir: each new checkpoint as it appears (at most one a
    second). After each wait of wait_secs (MIN_CHECKPOINT_WAIT_SECS at least) that found none, between_waits()
    is called: it ends the iteration by returning True, or raises."""
    return tf.compat.v1.train.checkpoints_iterator(model_dir, min_interval_secs=1,
                                                   timeout=max(wait_secs, MIN_CHECKPOINT_WAIT_SECS),
                                                   timeout_fn=between_waits)


def checkpoint_step(prefix: str | None) -> int | None:
    """The global step in a checkpoint's name (model.ckpt-<step>), or None."""
    match = prefix and re.search(r"-(\d+)$", prefix)
    return int(match.group(1)) if match else None


def bytes_on_disk(prefix: str) -> int:
    """The bytes of a written checkpoint's files (full or delta)."""
    return sum(tf.io.gfile.stat(path).length for path in tf.io.gfile.glob(prefix + ".*"))


def _disk_figures(model_dir: str, previous: str | None) -> str:
    """'needs about N bytes, M free' from the previous checkpoint's size and the filesystem, as far
    as they can be had (object stores have no free space to ask)."""
    needed = bytes_on_disk(previous) if previous else None
    try:
        free = shutil.disk_usage(model_dir).free
    except OSError:
        free = None
    return (f"needs about {needed:,} bytes" if needed else "needs an unknown number of bytes") + (
        f", {free:,} free" if free is not None else "")


def restore_with_deltas(sess, restore_full, deltas: incremental.Deltas | None, path: str,
                        remove_unreadable: bool = False) -> list[str]:
    """Restores the full checkpoint `path` (restore_full(sess, path)) and then, with `deltas`, its deltas in
    order of step. A delta that cannot be read ends the chain: the full checkpoint and the deltas before
    it are restored anew (a delta that failed part-way may have changed some variables), and, with
    remove_unreadable (the chief), that delta and the later ones, which build on it, are removed. Returns
    the deltas restored."""
    chain = incremental.deltas_of(path) if deltas is not None else []
    restore_full(sess, path)
    for index, delta in enumerate(chain):
        try:
            deltas.saver.restore(sess, delta)
        except UNREADABLE as err:
            logging.error("delta checkpoint %s cannot be read (%s): restoring %s and its %d delta(s) before it%s",
                          os.path.basename(delta), log_lines.error_cause(str(err)), os.path.basename(path), index,
                          f"; removed it and the {len(chain) - index - 1} after it" if remove_unreadable else "")
            if remove_unreadable:
                for unusable in chain[index:]:
                    incremental.remove(unusable)
            restore_full(sess, path)
            for good in chain[:index]:
                deltas.saver.restore(sess, good)
            return chain[:index]
    return chain


def delta_restorer(graph_tables, checkpoint: str) -> incremental.Deltas | None:
    """For a graph that only restores (the evaluator's, the export's), whose model recorded its tables in
    `graph_tables`: what restores the deltas of the full checkpoint `checkpoint`, or None when it has none
    (built only then: a Saver of every table takes seconds to build)."""
    return incremental.Deltas(graph_tables, saved_variables()) if touched_rows.groups(
        graph_tables) and incremental.deltas_of(checkpoint) else None


class OlderLayout(NamedTuple):
    """How to restore a checkpoint that lacks some of this graph's variables that a restore can start
    afresh (the input queue's trained prefixes): a Saver of every other variable, and the added ones'
    initializer."""
    added: frozenset[str]  # the added variables' names in the checkpoints
    saver: tf.compat.v1.train.Saver
    initializer: tf.Operation


def saved_variables(leave_out: frozenset[str] = frozenset()) -> list:
    """What the chief's savers save: what a Saver saves by default (every global variable, and the
    saveable objects: the dynamic tables' ID -> row maps) but the NOT_SAVED variables (and those named
    in leave_out)."""
    unsaved = {variable.op.name for variable in tf.compat.v1.get_collection(NOT_SAVED)} | leave_out
    kept = [variable for variable in tf.compat.v1.global_variables() if variable.op.name not in unsaved]
    return kept + tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS)


def older_layout(model_dir: str, added: list, **saver_kwargs) -> OlderLayout | None:
    """An OlderLayout when a checkpoint registered in model_dir lacks any of the `added` variables,
    else None (no second Saver in the graph)."""
    names = frozenset(variable.op.name for variable in added)
    state = tf.train.get_checkpoint_state(model_dir) if names else None
    registered = state.all_model_checkpoint_paths if state else []
    if not any(_lacks(os.path.join(model_dir, os.path.basename(path)), names) for path in registered):
        return None
    return OlderLayout(names, tf.compat.v1.train.Saver(saved_variables(names), **saver_kwargs),
                       tf.compat.v1.variables_initializer(list(added)))


class FreshStateLayout(NamedTuple):
    """How to restore a checkpoint that lacks this graph's optimizer state: a Saver of every other variable, the
    lacking ones' initializer, and what the deltas of that checkpoint leave out."""
    added: frozenset[str]  # the lacking variables' names in the checkpoints
    saver: tf.compat.v1.train.Saver
    initializer: tf.Operation
    leave_out: frozenset[str]  # the op names of the lacking variables (a partitioned one's parts)


def optimizer_state_layout(model_dir: str | None, **saver_kwargs) -> FreshStateLayout | None:
    """A FreshStateLayout when the newest checkpoint in model_dir lacks only optimizer state of this graph (the slots
    of its trainable variables, an optimizer's own counters) and holds no optimizer state this graph lacks, else
    None (no second Saver). Such a checkpoint was written under --local_steps (the trainer's flag, or a program's
    PS_TRAINER_FLAGS), whose workers keep the dense variables' slots as their own: a run without the lever restores
    every variable it holds, and the optimizer's missing state starts from its initial values. A checkpoint of
    another optimizer holds slots this graph lacks, and its restore stays refused (resume with its flags).
    model_dir None: this task restores nothing (only the chief does), so nothing is read."""
    try:
        newest = tf.train.latest_checkpoint(model_dir) if model_dir else None
        held = set(tf.train.load_checkpoint(newest).get_variable_to_shape_map()) if newest else set()
    except (tf.errors.OpError, ValueError):  # unreadable, or its state file: the restore names it
        return None
    saved = _variables_by_saved_name()
    trainable = {variable.op.name for variable in tf.compat.v1.trainable_variables()}
    weights = {name for name, parts in saved.items() if any(part.op.name in trainable for part in parts)}
    lacking = set(saved) - held
    if not held or not lacking or not weights <= held:
        return None
    state = [_is_optimizer_state(name, weights) for name in lacking]
    foreign = [name for name in held - set(saved) if _is_optimizer_state(name, weights)]
    if not all(state) or foreign:
        return None
    added = [part for name in lacking for part in saved[name]]
    leave_out = frozenset(part.op.name for part in added)
    return FreshStateLayout(frozenset(lacking), tf.compat.v1.train.Saver(saved_variables(leave_out), **saver_kwargs),
                            tf.compat.v1.variables_initializer(added), leave_out)


# Variables of an optimizer that are no slot of one variable: TF1 Adam's powers of its decay rates, a Keras
# optimizer's iteration count and hyperparameters (under its `training/<Optimizer>/` scope in an Estimator's graph).
OPTIMIZER_COUNTERS = re.compile(r"(^|/)beta[12]_power(_\d+)?$|^training/[^/]+/[^/]+$")


def _is_optimizer_state(name: str, weights: set[str]) -> bool:
    """Whether a checkpoint name is an optimizer's: a slot of one of `weights` (<weight>/<slot>, or a Keras
    optimizer's training/<Optimizer>/<weight>/<slot>), or one of its counters."""
    if OPTIMIZER_COUNTERS.search(name):
        return True
    keras = re.match(r"^training/[^/]+/(.+)/[^/]+$", name)
    owner = name.rpartition("/")[0]
    return owner in weights or bool(keras and keras.group(1) in weights) or any(
        owner.startswith(weight + "/") for weight in weights)


class RenamedLayout(NamedTuple):
    """How to restore a checkpoint that holds some of this graph's variables under other names: a Saver of
    every variable, each read under its name there."""
    names: frozenset[str]  # the other names, as the checkpoint holds them
    saver: tf.compat.v1.train.Saver


# Where TensorFlow 2.x's V1 canned estimators (tf.compat.v1.estimator.DNN*, Linear*) put an optimizer's slot of
# a variable: <variable>/t_0/<slot> (a DNN's), <variable>/part_0/<slot> (a linear model's). TF1, and this
# runtime, name it <variable>/<slot>.
TF2_SLOT_INFIXES = ("t_0", "part_0")


def tf2_slot_layout(model_dir: str | None, **saver_kwargs) -> RenamedLayout | None:
    """A RenamedLayout when the newest checkpoint in model_dir holds optimizer slots of this graph's variables
    where TensorFlow 2.x's V1 canned estimators put them (TF2_SLOT_INFIXES), else None (no second Saver).
    model_dir None: this task restores nothing (only the chief does), so nothing is read."""
    newest = tf.train.latest_checkpoint(model_dir) if model_dir else None
    variables = _by_saved_name() if newest else {}
    try:
        held = set(tf.train.load_checkpoint(newest).get_variable_to_shape_map()) if variables else set()
    except (tf.errors.OpError, ValueError):  # unreadable: the restore names it
        return None
    renames = {}
    for name in set(variables) - held:
        head, _, slot = name.rpartition("/")
        there = next((f"{head}/{infix}/{slot}" for infix in TF2_SLOT_INFIXES if f"{head}/{infix}/{slot}" in held),
                     None)
        if there is None:
            return None  # lacks a variable for another reason: its restore says which
        renames[name] = there
    if not renames:
        return None
    return RenamedLayout(frozenset(renames.values()), tf.compat.v1.train.Saver(
        {renames.get(name, name): variable for name, variable in variables.items()}, **saver_kwargs))


def _by_saved_name() -> dict:
    """What saved_variables() saves, by the name a checkpoint holds it under: a variable, or the list of a
    partitioned variable's parts; {} where it saves more than variables (a dynamic table's map)."""
    if not all(isinstance(variable, tf.Variable) for variable in saved_variables()):
        return {}
    return {name: parts[0] if len(parts) == 1 and getattr(parts[0], "_save_slice_info", None) is None else parts
            for name, parts in _variables_by_saved_name().items()}


def _variables_by_saved_name() -> dict[str, list]:
    """The variables saved_variables() saves (not a table's map), by the name a checkpoint holds each under: its
    variables (one, or a partitioned variable's parts)."""
    named = {}
    for variable in saved_variables():
        if isinstance(variable, tf.Variable):
            info = getattr(variable, "_save_slice_info", None)
            named.setdefault(info.full_name if info else variable.op.name, []).append(variable)
    return named


def _holds(path: str, names: frozenset[str]) -> bool:
    try:
        return names <= set(tf.train.load_checkpoint(path).get_variable_to_shape_map())
    except (tf.errors.OpError, ValueError):  # unreadable: the restore names it
        return False


def _lacks(path: str, names: frozenset[str]) -> bool:
    try:
        return not names <= set(tf.train.load_checkpoint(path).get_variable_to_shape_map())
    except (tf.errors.OpError, ValueError):  # unreadable: the restore names it
        return False


class LiveStateSaver(tf.compat.v1.train.Saver):
    """The chief's saver: checks each save before registering it, restores the newest checkpoint it
    can read, and restores only when a ps task lacks its variables.

    A chief that restarts while every ps task kept running finds the training state there, newer
    than any checkpoint. TensorFlow's SessionManager would restore the checkpoint over it, moving
    the global step back: the steps trained since are lost and trained again, and in sync mode the
    rounds are numbered anew under workers that hold tokens and accumulators of the later rounds
    (the accumulators keep gradients of rounds that no longer exist). Keeping the live state loses
    nothing and leaves the global step, the accumulators and the token queue consistent. When any
    variable is uninitialized (a ps task restarted) everything is restored from the checkpoint, so
    every variable comes from one step.
    """

    def __init__(self, uninitialized, *args, before_save=None, after_restore=None, older: OlderLayout | None = None,
                 slots_of=None, graph_tables=None, renamed: RenamedLayout | None = None,
                 fresh_state: FreshStateLayout | None = None, **kwargs):
        """uninitialized: report_uninitialized() of this graph; before_save(session), if given, runs
        before each save (the eviction of embedding rows, which the checkpoint then leaves out);
        after_restore(session), if given, runs after each restore, once the NOT_SAVED variables are
        initialized (the dynamic tables' reconciliation); older: how to restore a checkpoint that lacks variables added
        since (older_layout()); renamed: how to restore a checkpoint that names variables otherwise
        (tf2_slot_layout()); fresh_state: how to restore a checkpoint that lacks the optimizer's state, written
        under a lever (optimizer_state_layout()); slots_of, given when training marks the table rows it changes: the
        optimizer's slots of a variable, for the delta checkpoints (save_delta()). Saves
        saved_variables(); a restore initializes the NOT_SAVED ones."""
        super().__init__(saved_variables(), *args, **kwargs)
        not_saved = tf.compat.v1.get_collection(NOT_SAVED)
        self._init_not_saved = tf.compat.v1.variables_initializer(not_saved) if not_saved else None
        self._uninitialized = uninitialized
        self._before_save = before_save
        self._after_restore = after_restore
        self._older = older
        self._renamed = renamed
        self._fresh_state = fresh_state
        self._global_step = tf.compat.v1.train.get_global_step()
        self.deltas = incremental.Deltas(graph_tables, saved_variables(), slots_of) if slots_of else None
        # The deltas of a checkpoint without the optimizer's state lack it too.
        self._fresh_deltas = incremental.Deltas(graph_tables, saved_variables(fresh_state.leave_out), slots_of) if (
            slots_of and fresh_state) else None
        # The full checkpoint that this run's deltas build on: the last saved or restored (None: the
        # newest registered, which a chief restarted over live ps tasks continues).
        self._base = None
        self.failed_saves = 0
        self._meta = None  # (graph, strip_default_attrs, MetaGraphDef, its bytes): export_meta_graph's last

    def export_meta_graph(self, filename=None, collection_list=None, as_text=False, export_scope=None,
                          clear_devices=False, clear_extraneous_savers=False, strip_default_attrs=False,
                          save_debug_info=False):
        """Saver.export_meta_graph. The .meta each save writes beside its checkpoint is built once from a
        finalized graph and its bytes written again for each later save: nothing it holds (the graph, its
        collections, this saver) changes during training, and building it takes a model with dynamic tables
        about 0.2 s a save."""
        graph = tf.compat.v1.get_default_graph()
        if not (filename and graph.finalized and collection_list is None and not as_text and export_scope is None
                and not clear_devices and not clear_extraneous_savers and not save_debug_info):
            return super().export_meta_graph(filename, collection_list, as_text, export_scope, clear_devices,
                                             clear_extraneous_savers, strip_default_attrs, save_debug_info)
        if self._meta is None or self._meta[0] is not graph or self._meta[1] != strip_default_attrs:
            meta_graph_def = super().export_meta_graph(filename, strip_default_attrs=strip_default_attrs)
            serialized = meta_graph_def.SerializeToString(deterministic=True)
            self._meta = (graph, strip_default_attrs, meta_graph_def, serialized)
            return meta_graph_def
        tf.io.gfile.makedirs(os.path.dirname(filename) or ".")
        file_io.atomic_write_string_to_file(filename, self._meta[3])
        return self._meta[2]

    def save(self, sess, save_path, global_step=None, latest_filename=None, meta_graph_suffix="meta",
             write_meta_graph=True, write_state=True, strip_default_attrs=False, save_debug_info=False):
        """Saver.save, registering the checkpoint only once it checks. Returns its prefix, or None for
        a save that failed for storage (the previous checkpoint stays the newest)."""
        model_dir = os.path.dirname(save_path)
        step = global_step if global_step is None or isinstance(global_step, (int, np.integer)) else (
            tf.compat.v1.train.global_step(sess, global_step))

        def write():
            return super(LiveStateSaver, self).save(
                sess, save_path, global_step=step, latest_filename=latest_filename,
                meta_graph_suffix=meta_graph_suffix, write_meta_graph=write_meta_graph, write_state=False,
                strip_default_attrs=strip_default_attrs, save_debug_info=save_debug_info)

        prefix = self._checked_save(sess, write, model_dir, step, "checkpoint")
        if prefix is not None:
            if write_state:
                self._register(prefix, model_dir, latest_filename, meta_graph_suffix)
            self._base = prefix
        return prefix

    def save_delta(self, sess, model_dir: str) -> str | None:
        """Saves a delta of the newest full checkpoint: the table rows changed since the last save, every
        other variable whole (training/incremental.py). Returns its prefix, or None if nothing was saved
        (no full checkpoint yet, no step since the last save, or a save that failed for storage)."""
        base = self._base or tf.train.latest_checkpoint(model_dir)
        step = int(sess.run(self._global_step))
        if base is None or step <= max([checkpoint_step(base) or 0] + [
                checkpoint_step(delta) or 0 for delta in incremental.deltas_of(base)]):
            return None
        prefix = incremental.delta_prefix(base, step)
        start = time.monotonic()

        def write():
            return self.deltas.saver.save(sess, prefix, write_meta_graph=False, write_state=False)

        saved = self._checked_save(sess, write, model_dir, step, "delta checkpoint", remove_on_failure=prefix)
        if saved is not None:
            rows, written, full = incremental.rows_held(prefix), bytes_on_disk(prefix), bytes_on_disk(base)
            held = int(sess.run(self.deltas.rows))
            logging.info("saved delta checkpoint %s in %.2f s: %d of the tables' %d rows changed (%.2f%%), %s bytes, "
                         "%.1f%% of the full checkpoint's %s", os.path.basename(prefix), time.monotonic() - start,
                         rows, held, 100 * rows / max(held, 1), f"{written:,}", 100 * written / max(full, 1),
                         f"{full:,}")
        return saved

    def _checked_save(self, sess, write, model_dir, step, what, remove_on_failure=None):
        """Runs write() (a save returning its prefix) between the generations of the marked table rows
        (model/touched_rows.py), and checks what it wrote. Returns the prefix, or None for a save that
        failed for storage or does not check: removed, logged in one line, counted toward MAX_FAILED_SAVES."""
        previous = tf.train.latest_checkpoint(model_dir)
        if self._before_save is not None:
            self._before_save(sess)
        if self.deltas is not None:
            sess.run(self.deltas.bump)
        try:
            prefix = write()
            problem = checkpoint_problem(prefix)
        except tf.errors.OpError as err:
            if not (isinstance(err, STORAGE_ERRORS) or any(text in err.message for text in STORAGE_MESSAGES)):
                raise
            problem = next((text for text in STORAGE_MESSAGES if text in err.message), None) or (
                log_lines.error_cause(err.message))
        if problem is None:
            if self.deltas is not None:
                sess.run(self.deltas.commit)
            self.failed_saves = 0
            return prefix
        self.failed_saves += 1
        if remove_on_failure:
            incremental.remove(remove_on_failure)
        remove_interrupted_saves(model_dir, "chief", quiet=True)
        newest = os.path.basename(previous) if previous else "no checkpoint"
        logging.error("%s of global step %s not saved in %s: %s (%s); %s stays the newest; save %d of %d "
                      "allowed to fail in a row", what, step, model_dir, problem, _disk_figures(model_dir, previous),
                      newest, self.failed_saves, MAX_FAILED_SAVES)
        if self.failed_saves >= MAX_FAILED_SAVES:
            raise exit_codes.Failure(
                f"{self.failed_saves} checkpoint saves in a row failed in {model_dir} (the last: {problem}); "
                f"stopping with {newest} the newest: free space or fix the storage, then restart",
                exit_codes.CHECKPOINT_NOT_SAVED)
        return None

    def _register(self, prefix, model_dir, latest_filename, meta_graph_suffix):
        """What Saver.save does with write_state: the state file names it, old ones past max_to_keep go."""
        self._RecordLastCheckpoint(prefix)
        checkpoint_management.update_checkpoint_state_internal(
            save_dir=model_dir, model_checkpoint_path=prefix, all_model_checkpoint_paths=self.last_checkpoints,
            latest_filename=latest_filename, save_relative_paths=self._save_relative_paths)
        self._MaybeDeleteOldCheckpoints(meta_graph_suffix=meta_graph_suffix)
        if self.deltas is not None:  # the deltas of the full checkpoints just deleted
            remove_interrupted_saves(model_dir, "chief", quiet=True)

    def restore(self, sess, save_path):
        if save_path is not None and not len(sess.run(self._uninitialized)):
            logging.info("the ps tasks hold every variable already, at global step %d: training goes on from "
                         "there (not restoring %s, which is no newer)", sess.run(self._global_step), save_path)
            return None
        for reset in tf.compat.v1.get_collection(RESET_BEFORE_RESTORE):
            reset(sess)
        restored = self._restore_newest_readable(sess, save_path)
        if self._init_not_saved is not None:
            sess.run(self._init_not_saved)
        if self._after_restore is not None:
            self._after_restore(sess)
        return restored

    def _refuse_to_leave_deltas_out(self, path):
        """A run without --incremental_save_secs restores no delta: resumed from a checkpoint that has some, it would
        train again the steps they hold, and lose the table rows they saved."""
        chain = incremental.deltas_of(path) if self.deltas is None else []
        if chain:
            raise exit_codes.Failure(
                f"{os.path.basename(path)} has {len(chain)} delta checkpoint(s), to global step "
                f"{chain[-1].rpartition('-')[2]}, which a run without --incremental_save_secs does not restore: resume "
                "with --incremental_save_secs above 0 (a program: in PS_TRAINER_FLAGS)", exit_codes.BAD_FLAGS)

    def _restore_without_optimizer_state(self, sess, path):
        self._fresh_state.saver.restore(sess, path)
        sess.run(self._fresh_state.initializer)

    def _restore_newest_readable(self, sess, save_path):
        """Restores save_path or, if it cannot be read, the newest older registered checkpoint that can."""
        if save_path is None:
            return super().restore(sess, save_path)
        model_dir = os.path.dirname(save_path)
        state = tf.train.get_checkpoint_state(model_dir)
        older = [path for path in reversed(state.all_model_checkpoint_paths if state else [])
                 if os.path.basename(path) != os.path.basename(save_path)]
        unreadable = []
        absent = []  # for each, the variable of this run's model it lacks, if that is why it could not be read
        for path in [save_path, *older]:
            path = path if os.path.isabs(path) or "://" in path else os.path.join(model_dir, path)
            self._refuse_to_leave_deltas_out(path)
            try:
                if self._older and _lacks(path, self._older.added):
                    self._older.saver.restore(sess, path)
                    sess.run(self._older.initializer)
                    logging.info("restored %s, saved without %s: %s start(s) from its initial value",
                                 os.path.basename(path), ", ".join(sorted(self._older.added)),
                                 "that" if len(self._older.added) == 1 else "they")
                elif self._renamed and _holds(path, self._renamed.names):
                    self._renamed.saver.restore(sess, path)
                    logging.info("restored %s, written by TensorFlow 2.x's V1 canned estimators: %d optimizer slots "
                                 "read where it put them (%s); saved under TF1's names from now on",
                                 os.path.basename(path), len(self._renamed.names), sorted(self._renamed.names)[0])
                elif self._fresh_state and _lacks(path, self._fresh_state.added):
                    deltas = restore_with_deltas(sess, self._restore_without_optimizer_state, self._fresh_deltas,
                                                 path, remove_unreadable=True)
                    logging.info("restored %s and its %d delta checkpoint(s), which hold no optimizer state of %d "
                                 "variable(s) (%s; written under a lever, whose workers keep it): it starts from its "
                                 "initial values", os.path.basename(path), len(deltas), len(self._fresh_state.added),
                                 sorted(self._fresh_state.added)[0])
                    self._base = path
                else:
                    deltas = restore_with_deltas(sess, super().restore, self.deltas, path, remove_unreadable=True)
                    if deltas:
                        logging.info("restored %s and its %d delta checkpoint(s), to global step %d",
                                     os.path.basename(path), len(deltas), sess.run(self._global_step))
                    self._base = path
            except UNREADABLE as err:
                logging.error("checkpoint %s cannot be read (%s): trying the next older one", path,
                              log_lines.error_cause(str(err)))
                unreadable.append(path)
                absent.append(re.search(r"Key (\S+) not found in checkpoint", str(err)))
                continue
            if unreadable:
                back = (checkpoint_step(save_path) or 0) - (checkpoint_step(path) or 0)
                logging.warning("restored %s: %d global steps before the newest checkpoint, %s, which cannot be read",
                                os.path.basename(path), back, os.path.basename(save_path))
            return None
        if all(absent):  # every one was written, whole, by another model: the flags are the ones to change
            raise exit_codes.Failure(
                f"no checkpoint in {model_dir} holds this run's model: {absent[0].group(1)} is not in "
                f"{os.path.basename(unreadable[0])} (saved by another model, optimizer or release); resume with the "
                "flags it was trained with, or train this model in a new --model_dir", exit_codes.BAD_FLAGS)
        raise exit_codes.Failure(
            f"no checkpoint in {model_dir} can be read ({', '.join(os.path.basename(p) for p in unreadable)}); "
            "not starting from scratch over them: move them aside to start anew", exit_codes.CHECKPOINT_UNREADABLE)
