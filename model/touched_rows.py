"""Which rows of the embedding tables changed since the last checkpoint: what an incremental (delta)
checkpoint saves (training/incremental.py).

A table's rows come in groups that share row numbers: a hashed table's shard with its optimizer
slots; a dynamic table's shard (its trained variables, their slots, its last-read steps and its
ID -> row map). The model records each group (`group()`) in its GraphTables, in every graph it builds, so
that a graph that only restores (the evaluator's, the export's) can apply a delta too. When the run saves
deltas, each group of the training graph also has a marker on its ps: per row, the generation in
which the row last changed (int32, 4 bytes a row).

Each ps holds a generation counter. A save (full or delta) bumps it first and then reads the rows
marked at or after `since`, the generation of the last save that succeeded; once the save is on disk,
`since` becomes the bumped value. A row is marked after it is written, with the generation read after
the write: a write that a save's read missed was marked with the bumped generation or a later one, so
the next delta has it. A failed save leaves `since` alone, so the next one saves its rows too. Everything
a marker needs is on the ps of its rows: marking costs a step no round trip.

The markers and generations are no checkpoint's: a restore starts them anew (every row unmarked, each
equal to what is on disk).
"""

import dataclasses

import tensorflow as tf

from ps_trainer.model.graph_tables import GraphTables

v1 = tf.compat.v1

# The markers and the generation counters: variables no checkpoint holds (training/graph.py adds them
# to checkpoints.NOT_SAVED).
MARKS = "ps_trainer_touched_rows_marks"
MARK_DTYPE = tf.int32


@dataclasses.dataclass
class RowGroup:
    """Variables whose rows share row numbers, with the marker of their rows (None in a graph that does
    not save deltas) and, for a dynamic table's shard, its ID -> row map."""

    name: str
    device: str
    # (variable, fresh(n): n new rows) of the group's row variables; given the optimizer's
    # slots_of(variable), its slots too: what a growth extends and what a delta saves.
    row_variables: object
    marker: tf.Variable | None = None
    map: object = None

    def members(self, slots_of) -> list[tf.Variable]:
        return [variable for variable, _ in self.row_variables(slots_of) if variable is not self.marker]


@dataclasses.dataclass
class Generation:
    """A ps's generation counter: the current one, the one bumped to before the save in progress, and
    the one of the last save that succeeded."""

    current: tf.Variable
    bumped: tf.Variable
    since: tf.Variable


def group(graph_tables: GraphTables, name: str, device: str, row_variables, rows: int, mark: bool, grow: bool = False,
          table_map=None):
    """Records a group of the default graph in `graph_tables` (once by name); with `mark`, gives it a marker of
    `rows` rows on `device` (its length unknown to the graph if the group's rows `grow`). Returns its marker,
    or None."""
    graph = _root(v1.get_default_graph())
    groups = graph_tables.of(graph).row_groups
    if name in groups:
        return groups[name].marker
    marker = None
    if mark:
        with v1.device(device), v1.name_scope(None), v1.name_scope(f"{name}/"):
            marker = v1.Variable(tf.zeros([rows], MARK_DTYPE), trainable=False, use_resource=True, name="touched",
                                 shape=tf.TensorShape([None]) if grow else tf.TensorShape([rows]),
                                 collections=[v1.GraphKeys.GLOBAL_VARIABLES, MARKS])
        generation_of(graph_tables, marker.device)  # where current() and changed_rows() look for it
    groups[name] = RowGroup(name, device, row_variables, marker, table_map)
    return marker


def _root(graph):
    """The graph a loop body's graph is built in (its outer graphs'), or the graph itself: a model built
    in a loop (--local_steps' rounds) finds the groups and counters its first build recorded."""
    while getattr(graph, "outer_graph", None) is not None:
        graph = graph.outer_graph
    return graph


def marks_rows_of(graph_tables: GraphTables, variable, marker) -> None:
    """Says that `marker` marks the rows of `variable`: the optimizers mark the rows they update
    (model/tables.RowUpdate)."""
    if marker is not None:
        graph_tables.of(variable.graph).markers[variable.ref()] = marker


def groups(graph_tables: GraphTables, graph=None) -> list[RowGroup]:
    return list(graph_tables.of(_root(graph or v1.get_default_graph())).row_groups.values())


def marker_of(graph_tables: GraphTables, variable) -> tf.Variable | None:
    """The marker of the rows of `variable` (a table's row variable), or None."""
    return graph_tables.of(variable.graph).markers.get(variable.ref())


def generation_of(graph_tables: GraphTables, device: str) -> Generation:
    """The default graph's generation counters on `device`, made the first time."""
    graph = _root(v1.get_default_graph())
    found = graph_tables.of(graph).generations
    if device not in found:
        with v1.device(device), v1.name_scope(None), v1.name_scope(f"touched_rows/generation{len(found)}/"):
            found[device] = Generation(*(
                v1.Variable(1, dtype=MARK_DTYPE, trainable=False, use_resource=True, name=name,
                            collections=[v1.GraphKeys.GLOBAL_VARIABLES, MARKS])
                for name in ("current", "bumped", "since")))
    return found[device]


def generations(graph_tables: GraphTables, graph=None) -> dict[str, Generation]:
    return dict(graph_tables.of(_root(graph or v1.get_default_graph())).generations)


def current(graph_tables: GraphTables, marker) -> tf.Tensor:
    """The generation to mark rows of `marker` with, read on its ps (after what the caller made it wait for)."""
    return generation_of(graph_tables, marker.device).current.read_value()


def mark(graph_tables: GraphTables, marker, rows) -> tf.Operation:
    """Marks `rows` of `marker` as changed in the current generation."""
    with v1.colocate_with(marker):
        rows = tf.reshape(rows, [-1])
        return v1.scatter_update(marker, rows, tf.fill(tf.shape(rows), current(graph_tables, marker))).op


def mark_all(graph_tables: GraphTables, marker) -> tf.Operation:
    """Marks every row of `marker` (a dense update of the whole table)."""
    with v1.colocate_with(marker):
        return marker.assign(tf.fill(tf.shape(marker), current(graph_tables, marker)), read_value=False)


def changed_rows(graph_tables: GraphTables, marker) -> tf.Tensor:
    """The rows marked since the last save that succeeded: int64, in order."""
    with v1.colocate_with(marker):
        since = generation_of(graph_tables, marker.device).since.read_value()
        return tf.reshape(tf.where(marker >= since), [-1])


def bump(graph_tables: GraphTables) -> list:
    """Ops that start a save: each ps's generation moves on (rows changed from here on go in the next save)."""
    return [g.bumped.assign(g.current.assign_add(1)).op for g in generations(graph_tables).values()]


def commit(graph_tables: GraphTables) -> list:
    """Ops that end a save that succeeded: each ps's `since` becomes the generation it bumped to."""
    return [g.since.assign(g.bumped).op for g in generations(graph_tables).values()]
