"""--local_steps=K with embedding tables (hashed or dynamic): the rows a round of K batches names, held on
the worker.

Without this, a step with tables on the ps reads its batch's rows there and sends their gradients
back: a round trip to each ps every step, and the ps runs every sparse update (docs/speed.md). Here a
session.run reads K batches at once (the step path training/plan.py calls ROUNDS) and:
1. sends each ps the distinct (table shard, row) pairs that the K batches name, for all the tables
   together, and gets back one tensor: those rows with their optimizer slots' rows (Adagrad's and
   FTRL's accumulators, FTRL's linear term), a row per pair;
2. trains K steps on worker-side copies of them (a local variable per family of tables, with the
   optimizer's own slots, loaded with the fetched rows), each step gathering its batch's rows from the
   copies, while the dense variables train on theirs (training/step/local_steps.py);
3. sends each ps one tensor of what the round changed, row by row (the copies and their slots minus
   what was fetched), which the ps adds to its rows (a scatter-add, so the other workers' changes
   made meanwhile stay), marking them for incremental checkpoints.
A round costs two exchanges with each ps, whatever K; the ps only gathers and adds rows, and a row
that K batches name crosses once each way.

Dynamic tables (model/dynamic/) find a row by its ID on the ps: the round's batches are built once as
a plain step would be, and each ps admits the round's distinct IDs at its start (one tensor of IDs to
each ps, one of their (shard, row) pairs back: model/dynamic/table.pairs_of_columns), the IDs' pairs
then going through 1-3 as a hashed table's do; a step of the round reads its own examples' part of the
pairs (step_examples). An ID that has no row yet (--embedding_min_count, or a storage waiting to grow)
reads and trains the default row, as a step would. Rows of a table that grows or evicts (Guard) are
pushed inside its shard's lock: a growth copies its row variables there, an eviction resets rows there.
With eviction (--embedding_steps_to_live), a push adds only into rows that still belong to the IDs the
round read them for, and sets each row's last-read step to the step of the round that last read it, as
a step at a time would.

The push rule is Downpour's sum, not local_steps' mean: a round's rows are mostly its own (a row a
worker's batches touch is one few others touch in the same round, Zipf's tail), and a row trained by
two workers in one round gets both changes, as plain asynchronous training would apply both
gradients. A round reads the rows fresh from the ps: a change arrives at most one round late.

Slots are pushed as changes too, which is exact for slots that only add (Adagrad's and FTRL's
accumulators; FTRL's linear term adds its own updates): ADDITIVE_SLOTS names the optimizers whose
tables take rounds. Others (momentum, Adam, RMSProp: decaying averages, and Adam's global powers of
beta) keep the tables on the ps, a step at a time.

FTRL's weights are not pushed: they are a function of its two slots (the optimizer's
weights_from_slots), and the ps sets them from its slots once the round's changes are added. Summed,
N rounds that overlap set a row to the sum of their weights less N - 1 times the weights they
fetched; each round's weights come from the slots alone, so an error in the fetched weights came
back multiplied by -(N - 1): with 4 workers the wide part's hot rows grew without bound (held-out
loss 43 against 0.44: tests/test_wide_deep.py). Adagrad's and SGD's changes to a row do not depend on
its value: they add.

Tested: one worker's rounds are plain training's steps (tables, slots and dense variables at a
checkpoint, for sgd, adagrad and ftrl_adagrad; dynamic tables ID by ID, with evictions every 5 steps and
IDs readmitted, and a multi-valued column: tests/test_levers.py), a round makes one exchange each way
per ps, marks what it changed, a push skips the rows an eviction took, and four workers learn what
plain steps learn.
"""

import types
from typing import NamedTuple

import tensorflow as tf

from ps_trainer.model import grouped_lookup, multi_valued, needs, touched_rows
from ps_trainer.model.dynamic.storage import DEFAULT_ROW

v1 = tf.compat.v1

# --optimizer values whose slots of a table's rows only add: a round's change to them adds up.
ADDITIVE_SLOTS = ("sgd", "adagrad", "ftrl_adagrad")
SCOPE = "local_copy/rows"


class RowCopies:
    """The model's one grouped lookup (model/grouped_lookup.py), answered from worker-side copies of
    the rows of a round's batches. Used as grouped_lookup.rows_from(graph_tables, copies.naming()) on the round's
    batches (to learn their rows), then grouped_lookup.rows_from(graph_tables, copies) for each step's batch."""

    names_round = False  # a step's source (lookup), not the round's (naming())

    def __init__(self, device):
        self.device = device  # this worker's device: where the copies (and their slots) live
        self.family_shards = self.num_cells = None  # the lookup's tables, as grouped_lookup.cut_alike gives
        self.copies = []  # [family]: its rows' copy, [None, width]
        self.distinct = None  # the round's (shard, row) pairs, sorted, as grouped_lookup.pairs() gives
        # Dynamic tables: the round's pairs of its IDs (grouped_lookup.Resolved), for each step's part of them;
        # the examples of the step being built among the round's ([start, end)); each cell's Guard.
        self._round = None
        self.step_examples = None
        self._guards = {}
        self._steps = None  # (the global step at the round's start, batch size, the steps the round takes)

    def naming(self):
        """The source whose lookup records the distinct rows its batch names: the round's (its rows are
        zeros; only the IDs are run). Dynamic tables give it their IDs' pairs, found (and admitted) on the ps
        tasks, and their shards' guards (guard())."""
        return types.SimpleNamespace(lookup=lambda families, ids: self._rows(families, ids, naming=True),
                                     guard=self._guard, names_round=True)

    def lookup(self, families, ids) -> list:
        """The rows of ids, gathered from the copies: a step's batch, one of the round's. families=None: the
        round's, its IDs Resolved (a step's part of the round's pairs, by step_examples)."""
        return self._rows(families, ids, naming=False)

    def _guard(self, tables) -> None:
        """The guards of the cells of dynamic tables (the columns of one tensor of IDs, in order)."""
        for column, table in enumerate(tables):
            for shard, rows in enumerate(table.shards):
                if rows.options.grow or rows.options.steps_to_live:
                    keys = table.keys[shard] if rows.options.steps_to_live else None
                    self._guards[column * rows.options.shards + shard] = Guard(rows, keys, table.found_rows(shard))

    def _rows(self, families, ids, naming: bool) -> list:
        if families is None:
            family_shards, num_cells = self.family_shards, self.num_cells
        else:
            family_shards, num_cells = grouped_lookup.cut_alike(families)
        if self.family_shards is None:
            self._make_copies(family_shards, num_cells)
        elif _identities(family_shards) != _identities(self.family_shards):
            raise ValueError("--local_steps with tables: the model makes more than one grouped lookup")
        if isinstance(ids, grouped_lookup.Resolved):
            pairs, ids = ids
            self._round = (pairs, ids)
        elif families is None:
            pairs = self._step_pairs(ids)
        else:
            pairs = grouped_lookup.pairs(family_shards, ids)
        columns = len(family_shards[0])
        if naming:
            self.distinct = tf.sort(tf.unique(pairs).y)
            return [grouped_lookup.shaped(tf.zeros([tf.size(pairs), copy.shape[1]]), ids, columns)
                    for copy in self.copies]
        positions = tf.searchsorted(self.distinct, pairs, out_type=tf.int32)
        found = tf.gather(self.distinct, tf.minimum(positions, tf.size(self.distinct) - 1))
        checked = tf.debugging.assert_equal(found, pairs, message="a batch names a row its round did not read")
        with tf.control_dependencies([checked]):
            return [grouped_lookup.shaped(tf.gather(copy, positions), ids, columns) for copy in self.copies]

    def steps_read(self, start, batch_size: int, steps) -> None:
        """The round's steps, from global step `start`: `steps` batches of batch_size of the round's examples."""
        self._steps = (start, batch_size, steps)

    def _last_read(self) -> tf.Tensor:
        """For each of the round's distinct pairs, the global step of the last of its steps that read it (as
        a step at a time would mark the row, model/dynamic/storage.py); the round's start for a row that only
        batches past the round's last step name."""
        start, batch_size, steps = self._steps
        pairs, ids = self._round
        if isinstance(ids, multi_valued.ColumnIds):
            examples = tf.concat(list(ids.examples), 0)
        else:
            examples = tf.range(tf.size(pairs, out_type=tf.int64)) // ids.shape[1]
        offset = examples // batch_size
        offset = tf.where(offset < tf.cast(steps, tf.int64), offset, -1)
        latest = tf.math.unsorted_segment_max(offset, tf.searchsorted(self.distinct, pairs), tf.size(self.distinct))
        return start + tf.maximum(latest, 0)

    def _step_pairs(self, ids) -> tf.Tensor:
        """The pairs of the round's IDs that are the step's (ids): those of its examples, step_examples."""
        if self._round is None or self.step_examples is None:
            raise ValueError("--local_steps: a step's rows of resolved IDs asked for outside a round's step")
        pairs, round_ids = self._round
        start, end = self.step_examples
        if not isinstance(round_ids, multi_valued.ColumnIds):
            return tf.reshape(tf.reshape(pairs, [-1, ids.shape[1]])[start:end], [-1])
        found, offset = [], 0
        for c, examples in enumerate(round_ids.examples):  # each column's IDs, in the order of their examples
            first, last = tf.unstack(tf.searchsorted(examples, tf.cast(tf.stack([start, end]), examples.dtype)))
            found.append(pairs[offset + first:offset + last])
            offset += tf.size(round_ids.values[c])
        return tf.concat(found, 0)

    def slots_start_empty(self, next_creator, **kwargs):
        """A variable creator: the optimizer's slots of the copies start empty, [0, width], as the
        copies do (their own initializers would read the copies' length, before they are set). A round
        loads the copies and their slots before a step reads them."""
        name = str(kwargs.get("name", ""))
        copy = next((copy for copy in self.copies if name.startswith(copy.op.name + "/")), None)
        if copy is not None:
            kwargs["initial_value"] = lambda: tf.zeros([0, copy.shape[1]], copy.dtype)
        return next_creator(**kwargs)

    def _make_copies(self, family_shards, num_cells):
        self.family_shards, self.num_cells = family_shards, num_cells
        wide = {id(variable) for variable in v1.get_collection(needs.WIDE_VARIABLES)}
        for f in range(len(family_shards)):
            width = family_shards[f][0][0].shape[1]
            with v1.device(self.device), v1.name_scope(None):
                copy = v1.Variable(tf.zeros([0, width]), trainable=False, shape=tf.TensorShape([None, width]),
                                   collections=[v1.GraphKeys.LOCAL_VARIABLES], name=f"{SCOPE}/family{f}")
            if all(id(shard) in wide for column in family_shards[f] for shard in column):
                v1.add_to_collection(needs.WIDE_VARIABLES, copy)  # trained as its tables are (FTRL)
            self.copies.append(copy)

    def fetch_and_load(self, optimizer) -> tf.Operation:
        """Reads the round's rows and their slots' rows from the ps, one tensor from each, and loads them
        into the copies and the copies' slots. Call after the optimizer has made both's slots."""
        # The extended families: each family of tables, then each of its optimizer slots (cut alike, on
        # the same ps), with what each is: (family, slot name, or None for the tables themselves).
        self._members, extended = [], []
        for f, shards in enumerate(self.family_shards):
            self._members.append((f, None))
            extended.append(shards)
            for name in optimizer.get_slot_names():
                if optimizer.get_slot(shards[0][0], name) is not None:
                    self._members.append((f, name))
                    extended.append([[optimizer.get_slot(shard, name) for shard in column] for column in shards])
        self._locals = [self.copies[f] if name is None else optimizer.get_slot(self.copies[f], name)
                        for f, name in self._members]
        self._extended = extended
        self._widths = [shards[0][0].shape[1] for shards in extended]
        # Rows whose values follow from their slots (FTRL's): set from the summed slots, never summed.
        weights_from_slots = getattr(optimizer, "weights_from_slots", None)
        self._derived = {e: derived for e, (f, name) in enumerate(self._members) if name is None and weights_from_slots
                         and (derived := weights_from_slots(self.family_shards[f][0][0])) is not None}
        self._placements, self.fetched = [], [None] * len(extended)
        for placed in grouped_lookup.gather(extended, self.num_cells, self.distinct):
            joined = []
            for device_rows in placed.rows:
                with v1.colocate_with(device_rows[0]):  # one tensor from each ps
                    joined.append(tf.concat(device_rows, axis=1))
            with v1.device(self.device):
                rows = tf.dynamic_stitch(placed.positions, joined)
                for e, part in zip(placed.families, tf.split(rows, [self._widths[e] for e in placed.families],
                                                             axis=1)):
                    self.fetched[e] = part
            self._placements.append(placed)
        with v1.device(self.device):
            return tf.group(*(local.assign(value, read_value=False)
                              for local, value in zip(self._locals, self.fetched)), name="load_round_rows")

    def push(self, graph_tables) -> tf.Operation:
        """Adds what the round changed, row by row, to the ps's rows and slots (one tensor to each ps);
        sets the rows whose values follow from their slots (FTRL's) from the slots that result; marks
        the rows for incremental checkpoints (the markers of the tables of `graph_tables`)."""
        ops = []
        for placed in self._placements:
            sent = [e for e in placed.families if e not in self._derived]  # what crosses: all but derived rows
            with v1.device(self.device):
                change = tf.concat([self._locals[e].read_value() - self.fetched[e] for e in sent], axis=1)
            for index, here in enumerate(placed.cells):
                with v1.device(self.device):
                    part = tf.gather(change, placed.positions[index])
                if any(cell in self._guards for cell in here):
                    ops += self._push_guarded(graph_tables, placed, index, here, sent, part)
                    continue
                with v1.colocate_with(self._extended_shards(placed.families[0], here)[0]):
                    rows, adds = grouped_lookup.scatter_add_here(
                        [self._extended_shards(e, here) for e in sent], here, self.num_cells, placed.packed[index],
                        tf.split(part, [self._widths[e] for e in sent], axis=1))
                    written = sum(adds, [])
                    for e in placed.families:
                        if e in self._derived:
                            written += self._set_derived(e, here, rows, {sent[i]: adds[i] for i in range(len(sent))})
                    with tf.control_dependencies(written):  # marked once written, slots included
                        marks = [touched_rows.mark(graph_tables, marker, shard_rows)
                                 for e in placed.families if self._members[e][1] is None
                                 for shard, shard_rows in zip(self._extended_shards(e, here), rows)
                                 if (marker := touched_rows.marker_of(graph_tables, shard)) is not None]
                    ops += written + marks
        return tf.group(*ops, name="push_round_rows")

    def _push_guarded(self, graph_tables, placed, index, here, sent, part) -> list:
        """push() on one device whose cells include guarded ones (dynamic tables that grow or evict): each
        cell's adds, derived rows and marks run inside its shard's lock, and with eviction only into rows
        that still belong to the IDs the round read them for, whose last-read steps it sets."""
        evicting = any(self._guards.get(cell) is not None and self._guards[cell].keys is not None for cell in here)
        if evicting:
            with v1.device(self.device):
                read_at = tf.gather(self._last_read(), placed.positions[index])
        with v1.colocate_with(self._extended_shards(placed.families[0], here)[0]):
            which, rows, _ = grouped_lookup.by_shard(here, self.num_cells, placed.packed[index])
            values = [tf.dynamic_partition(v, which, len(here))
                      for v in tf.split(part, [self._widths[e] for e in sent], axis=1)]
            reads = tf.dynamic_partition(read_at, which, len(here)) if evicting else None
            ops = []
            for k, cell in enumerate(here):
                guard = self._guards.get(cell)

                def apply(k=k, cell=cell, guard=guard):
                    cell_rows, cell_values = rows[k], [family[k] for family in values]
                    written = []
                    if guard is not None and guard.keys is not None:
                        kept = guard.kept(cell_rows)
                        cell_rows = tf.boolean_mask(cell_rows, kept)
                        cell_values = [tf.boolean_mask(v, kept) for v in cell_values]
                        written.append(v1.scatter_update(guard.shard.last_seen, cell_rows,
                                                         tf.boolean_mask(reads[k], kept)).op)
                    adds = {e: [tf.raw_ops.ResourceScatterAdd(resource=self._extended_shards(e, [cell])[0].handle,
                                                              indices=cell_rows, updates=v)]
                            for e, v in zip(sent, cell_values)}
                    written += sum(adds.values(), [])
                    for e in placed.families:
                        if e in self._derived:
                            written += self._set_derived(e, [cell], [cell_rows], adds)
                    with tf.control_dependencies(written):
                        markers = [touched_rows.marker_of(graph_tables, self._extended_shards(e, [cell])[0])
                                   for e in placed.families if self._members[e][1] is None]
                        marks = [touched_rows.mark(graph_tables, marker, cell_rows)
                                 for marker in markers if marker is not None]
                    with tf.control_dependencies(written + marks):
                        return tf.constant(True)

                if guard is None:
                    ops.append(apply())
                else:
                    ops.append(guard.shard.lock.execute(apply, exclusive_resource_access=False))
            return ops

    def _set_derived(self, e, cells, rows, adds) -> list:
        """Sets the rows of extended family e's shards of `cells` (grouped_lookup's (column, shard) indexes)
        from its optimizer slots' rows there, once the slots' changes are added (`adds`: by extended family,
        each shard's add)."""
        f, _ = self._members[e]
        slot_families = {self._members[s][1]: s for s in adds if self._members[s][0] == f}
        updates = []
        for i, (shard, shard_rows) in enumerate(zip(self._extended_shards(e, cells), rows)):
            with tf.control_dependencies([adds[s][i] for s in slot_families.values()]):
                values = self._derived[e]({name: tf.gather(self._extended_shards(s, cells)[i], shard_rows)
                                           for name, s in slot_families.items()})
                updates.append(tf.raw_ops.ResourceScatterUpdate(resource=shard.handle, indices=shard_rows,
                                                                updates=values))
        return updates

    def _extended_shards(self, e, cells) -> list:
        """Extended family e's shards of `cells`."""
        shards = [shard for column in self._extended[e] for shard in column]
        return [shards[cell] for cell in cells]


class Guard(NamedTuple):
    """What a dynamic table's shard needs of a round's push (RowCopies._push_guarded): `shard`, its
    model/dynamic/storage.Shard, whose lock the push takes (a growth copies its row variables inside it,
    an eviction resets rows inside it); with eviction, `keys`, the round's IDs of the shard, and `found`,
    the rows the round read for them."""
    shard: object
    keys: tf.Tensor | None
    found: tf.Tensor

    def kept(self, rows) -> tf.Tensor:
        """Which of `rows` (the round's, of this shard) still belong to the IDs the round read them for: an
        eviction since may have reset a row, or handed it to another ID. The default row always does."""
        still = tf.logical_or(tf.equal(self.shard.map.lookup(self.keys), self.found),
                              tf.equal(self.found, DEFAULT_ROW))
        gone = tf.boolean_mask(self.found, tf.logical_not(still))
        return tf.logical_not(tf.reduce_any(tf.equal(rows[:, None], gone[None, :]), axis=1))


def _identities(family_shards) -> list:
    return [[[id(shard) for shard in column] for column in family] for family in family_shards]
