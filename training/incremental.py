"""Incremental (delta) checkpoints: with --incremental_save_secs, between full checkpoints, the chief
saves the embedding table rows changed since the last save (model/touched_rows.py) and every other
variable whole: a few percent of a full checkpoint's bytes when a few percent of the rows changed.

In model_dir a delta of the full checkpoint model.ckpt-F at global step S is the checkpoint
model.ckpt-F-delta-S (.index, .data-*), written as a full one is (each ps writes its own shard, the
chief merges them and checks the result before it counts) but never named in the 'checkpoint' state
file: TensorFlow's tools and a plain Saver see the full checkpoints alone. Its keys: every variable
outside the tables under its own name, whole; for each group of table rows "<group>/delta_rows" (the
changed rows) and "<variable>/delta_values" (their values, for each of the group's variables); for a
dynamic table's shard also "<map>/delta_keys" and "<map>/delta_key_rows", the IDs whose rows changed.

A restore point is a full checkpoint and its deltas in order of step (training/checkpoints.py restores
them, for the chief, the evaluator and the export alike). A delta applied over the full checkpoint
scatters its rows in (a growing table's variables grown first to hold them), and replaces the IDs of
those rows in the shard's map: an ID admitted since, or evicted, is right whether its row was reused or
not. The deltas go with their full checkpoint when --keep_checkpoint_max removes it.
"""

import functools
import os
import re

import numpy as np
import tensorflow as tf
from tensorflow.python.training.saving import saveable_object  # the Saver's interface for a table

from ps_trainer.cluster import model_dir as layout
from ps_trainer.model import layers, touched_rows

v1 = tf.compat.v1

# A delta's files: <full checkpoint's name>-delta-<step> and a suffix (a save in progress: _temp...).
DELTA_FILE = re.compile(rf"^({re.escape(layout.CHECKPOINT_PREFIX)}-\d+)-delta-(\d+)(_temp.*|\.index|\.data-.*)$")


def delta_prefix(base_prefix: str, step: int) -> str:
    """The prefix of the delta at global step `step` of the full checkpoint `base_prefix`."""
    return f"{base_prefix}-delta-{step}"


def deltas_of(base_prefix: str) -> list[str]:
    """The finished deltas (their index written) of the full checkpoint base_prefix, oldest first."""
    model_dir, base = os.path.split(base_prefix)
    if not tf.io.gfile.isdir(model_dir or "."):
        return []
    steps = sorted(int(found.group(2)) for name in tf.io.gfile.listdir(model_dir or ".")
                   if (found := DELTA_FILE.match(name.rstrip("/"))) and found.group(1) == base
                   and found.group(3) == ".index")
    return [delta_prefix(base_prefix, step) for step in steps]


def unfinished_or_orphaned(names: list[str], registered: set[str]) -> list[str]:
    """Of the file names in a model_dir, the deltas' that no restore can use: a save in progress or cut
    short (a temporary directory, data files without an index), or a delta of a full checkpoint no
    longer registered."""
    indexed = {m.group(1, 2) for name in names if (m := DELTA_FILE.match(name)) and m.group(3) == ".index"}
    return sorted(name for name in names if (m := DELTA_FILE.match(name)) and (
        m.group(1) not in registered or m.group(3).startswith("_temp") or m.group(1, 2) not in indexed))


def remove(prefix: str) -> None:
    for path in tf.io.gfile.glob(prefix + ".*") + tf.io.gfile.glob(prefix + "_temp*"):
        if tf.io.gfile.isdir(path):
            tf.io.gfile.rmtree(path)
        else:
            tf.io.gfile.remove(path)


def _isin(values, rows):
    """values[i] in rows, for each i (rows: distinct non-negative int64)."""
    ordered = tf.concat([tf.sort(rows), [np.iinfo(np.int64).max]], 0)
    return tf.equal(tf.gather(ordered, tf.searchsorted(ordered, values)), values)


class _DeltaRows(saveable_object.SaveableObject):
    """A group's part of a delta: its changed rows, their values in each of its variables, and (a
    dynamic table's shard) the IDs its map gives them. Restoring it scatters them in."""

    def __init__(self, graph_tables, group: touched_rows.RowGroup, members: list):
        self._members, self._map = members, group.map
        marker = group.marker

        @functools.cache  # read once when the Saver builds its save ops, on the group's ps
        def rows():
            return touched_rows.changed_rows(graph_tables, marker) if marker is not None else tf.zeros([0], tf.int64)

        @functools.cache
        def pairs():
            keys, named_rows = group.map.pairs()
            mine = _isin(named_rows, rows())
            return layers.masked(keys, mine), layers.masked(named_rows, mine)

        device = group.device
        specs = [saveable_object.SaveSpec(rows, "", f"{group.name}/delta_rows", tf.int64, device)]
        for member in members:
            specs.append(saveable_object.SaveSpec(lambda m=member: tf.gather(m, rows()), "",
                                                  f"{member.op.name}/delta_values", member.dtype.base_dtype, device))
        if group.map is not None:
            name = group.map.full_name
            specs.append(saveable_object.SaveSpec(lambda: pairs()[0], "", f"{name}/delta_keys", group.map.key_dtype,
                                                  device))
            specs.append(saveable_object.SaveSpec(lambda: pairs()[1], "", f"{name}/delta_key_rows", tf.int64,
                                                  device))
        super().__init__(group, specs, group.name)

    def restore(self, restored_tensors, restored_shapes):
        del restored_shapes
        rows, *values = restored_tensors
        if self._map is not None:
            values, (keys, key_rows) = values[:-2], values[-2:]
        updates = []
        needed = tf.reduce_max(tf.concat([rows, [-1]], 0)) + 1
        for member, member_values in zip(self._members, values):
            with v1.colocate_with(member):
                grown = []
                if member.shape[0] is None:  # a growing table's variable: first as long as the delta's rows need
                    value = member.read_value()
                    more = tf.maximum(needed - tf.shape(value, out_type=tf.int64)[0], 0)
                    padding = tf.zeros(tf.concat([[more], tf.shape(value, out_type=tf.int64)[1:]], 0), value.dtype)
                    grown = [member.assign(tf.concat([value, padding], 0), read_value=False)]
                with tf.control_dependencies(grown):
                    updates.append(v1.scatter_update(member, rows, member_values).op)
        if self._map is not None:
            with v1.colocate_with(self._map.resource_handle):
                held_keys, held_rows = self._map.pairs()
                removed = self._map.remove(layers.masked(held_keys, _isin(held_rows, rows)))
                with tf.control_dependencies([removed]):
                    updates.append(self._map.insert(keys, key_rows))
        return tf.group(*updates)


class Deltas:
    """The default graph's delta checkpoints of the tables of `graph_tables` (model/graph_tables.py): a Saver of
    them (`saver`), the ops that open and close a save's generation on every ps (`bump`, `commit`), and the
    rows the tables hold in all (`rows`).

    saved: what a full checkpoint of this graph saves (checkpoints.saved_variables()); slots_of(variable):
    the optimizer's (slot, start) pairs, whose rows go with the variable's (none in a graph that only
    restores)."""

    def __init__(self, graph_tables, saved: list, slots_of=lambda variable: []):
        groups = touched_rows.groups(graph_tables)
        members = {group.name: group.members(slots_of) for group in groups}
        in_groups = {id(member) for group_members in members.values() for member in group_members}
        maps = [group.map for group in groups if group.map is not None]
        whole = [item for item in saved if id(item) not in in_groups
                 and not any(getattr(item, "op", None) is table_map for table_map in maps)]
        self.saver = v1.train.Saver(whole + [_DeltaRows(graph_tables, group, members[group.name]) for group in groups],
                                    sharded=True, save_relative_paths=True)
        self.bump, self.commit = touched_rows.bump(graph_tables), touched_rows.commit(graph_tables)
        sizes = [tf.shape(members[group.name][0], out_type=tf.int64)[0] for group in groups if members[group.name]]
        self.rows = tf.add_n(sizes) if sizes else tf.constant(0, tf.int64)


def rows_held(prefix: str) -> int:
    """The rows the delta checkpoint `prefix` holds, over every group."""
    reader = tf.train.load_checkpoint(prefix)
    return sum(shape[0] for name, shape in reader.get_variable_to_shape_map().items()
               if name.endswith("/delta_rows"))

