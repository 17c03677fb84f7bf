"""--local_steps=K: asynchronous workers push and fetch once per K steps (Downpour SGD's n_push = n_fetch = K).

Each worker trains its own copy of the dense variables, held on the worker (local variables, never
checkpointed), for K steps in one session.run, with no round trip to the ps. It then adds what those
steps changed (its copy minus the values it last fetched), divided by the number of workers, to the
ps's variables, reads them back with the other workers' pushes in, and continues from there.

The push rule: the ps moves by the mean of the workers' rounds. Workers in step make this local SGD's
model averaging; out of step, each round still counts 1/N (asynchronous model averaging), and no worker
waits for a peer, so a slow or restarted worker holds nobody up. Downpour's plain sum learned less
(docs/speed.md has the measurement and its command). A round reads no stale values, so a worker keeps
one worker's momentum at any worker count (training/momentum.py). With one worker this is plain
SGD to the digit.

A global step counts one worker's batch, as in plain asynchronous training: a round adds the steps
it took, and --train_steps cuts the round that reaches it (read at the round's start). The learning
rate schedule is read once per round; the optimizer's slots (momentum) are the worker's own.

A model whose tables take rounds (hashed or dynamic ones, read through grouped lookups, with an
optimizer whose slots add: the step path training/plan.py calls ROUNDS) gets copies of their rows too: a
session.run reads the round's K batches at once and trains them on copies of the rows they name,
fetched and pushed once (build_rounds; training/step/row_copies.py).

Other tables (model/needs.table_part: trained by an optimizer whose slots decay, or a model_fn's
dynamic columns), and a program's partitioned variables (TF1's tables: the canned classes partition their
input layer's and linear model's weights), stay on the ps: a step reads and updates only the rows its batch
names, there, every step, as without the lever. The model's dense variables (the deep
part's layers, the wide part's numeric weights: most of the bytes a step moves) get worker-side copies
as above, pushed and fetched every K steps. A session.run is then one step, not a round. The push
rides on every Kth step's run (PushEveryK), and the last, partial round is pushed when the session
ends; on the chief that comes before the final checkpoint.
"""

import re

import tensorflow as tf
from absl import logging

from ps_trainer.model import grouped_lookup, needs
from ps_trainer.training import plan
from ps_trainer.training.step import row_copies, update
from ps_trainer.training.step.base import Step, StepContext
from ps_trainer.training.step.loop import Iteration, Metrics, training_loop

v1 = tf.compat.v1

SCOPE = "local_copy"
# The variables an optimizer keeps beside its slots (tf.compat.v1.train.AdamOptimizer's, and LazyAdam's).
OPTIMIZER_COUNTERS = re.compile(r"beta[12]_power(_\d+)?$")


class LocalCopies:
    """A variable_scope custom_getter that gives the model a worker-side copy of each dense trainable
    variable; the global variable (on the ps) is created as usual, under its own name, so checkpoints
    and the export see no difference. A table, or a program's partitioned variable, is read as it is."""

    def __init__(self, device, num_workers: int, rows: row_copies.RowCopies | None = None):
        self.device = device  # this worker's device: where the copies (and their slots) live
        self.rows = rows  # with hashed tables in rounds: the copies of a round's rows (training/step/row_copies.py)
        self.push_scale = 1.0 / num_workers  # the ps moves by the mean of the workers' rounds
        self.copies = {}  # global variable's name: (global variable, copy, anchor: its value at the last fetch)
        self.tables = {}  # name: a table's variable, or a program's partitioned one (each read as it is)

    def getter(self, getter, name, *args, **kwargs):  # TensorFlow passes the next getter as `getter`
        variable = getter(name, *args, **kwargs)
        if not kwargs.get("trainable", True):
            return variable
        if needs.is_table(variable) or kwargs.get("partitioner") is not None:
            self.tables[name] = variable
            return variable
        if name not in self.copies:
            with v1.device(self.device), v1.name_scope(None):
                initial = variable.read_value()  # the ps's value, once the chief has set it
                copy, anchor = (v1.Variable(initial, trainable=False, collections=[v1.GraphKeys.LOCAL_VARIABLES],
                                            name=f"{SCOPE}/{name}/{role}") for role in ("copy", "anchor"))
            if any(variable is wide for wide in v1.get_collection(needs.WIDE_VARIABLES)):
                v1.add_to_collection(needs.WIDE_VARIABLES, copy)  # trained as its variable is (FTRL)
            self.copies[name] = (variable, copy, anchor)
        return self.copies[name][1]

    def origin(self, variable):
        """The global variable that `variable` is the copy of, or `variable` itself."""
        return next((global_variable for global_variable, copy, _ in self.copies.values() if copy is variable),
                    variable)

    @property
    def table_variables(self) -> list:
        """The tables' trainable variables (each shard of a partitioned one)."""
        return [shard for table in self.tables.values() for shard in grouped_lookup.shards(table)]

    @property
    def local_variables(self) -> list:
        return [copy for _, copy, _ in self.copies.values()]

    def push_and_fetch(self):
        """Adds each copy's change since the last fetch to its global variable, then sets the copy
        (and its anchor) to the global value that results, the other workers' pushes included.

        Packed: one tensor per ps each way, whatever the number of variables there: fewer round trips
        and less CPU per global step on worker and ps (docs/speed.md).
        """
        on_ps = {}
        for variable, copy, anchor in self.copies.values():
            on_ps.setdefault(variable.device, []).append((variable, copy, anchor))
        updates = []
        for ps_device, group in on_ps.items():
            sizes = [variable.shape.num_elements() for variable, _, _ in group]
            with v1.device(self.device):
                deltas = tf.concat([tf.reshape((copy.read_value() - anchor.read_value()) * self.push_scale, [-1])
                                    for _, copy, anchor in group], 0)
            with v1.device(ps_device):
                added = [variable.assign_add(tf.reshape(delta, variable.shape), read_value=False)
                         for (variable, _, _), delta in zip(group, tf.split(deltas, sizes))]
                with tf.control_dependencies(added):
                    fresh = tf.concat([tf.reshape(variable.read_value(), [-1]) for variable, _, _ in group], 0)
            with v1.device(self.device):
                for (variable, copy, anchor), value in zip(group, tf.split(fresh, sizes)):
                    value = tf.reshape(value, variable.shape)
                    updates += [copy.assign(value, read_value=False), anchor.assign(value, read_value=False)]
        return tf.group(*updates, name="push_and_fetch")


def slots_stay_local(next_creator, **kwargs):
    """A variable creator: the optimizer's slots of a local copy are local variables too (each
    worker's own, initialized by its own session, never saved), and so are the variables an optimizer keeps
    beside its slots (Adam's beta powers), which it puts beside the first local copy: the worker's own
    count of its local updates. A global variable on a worker would wait for the chief to initialize it,
    and no chief reaches another worker's device."""
    name = str(kwargs.get("name", ""))
    if name.startswith(SCOPE + "/") or OPTIMIZER_COUNTERS.match(name):
        kwargs["collections"] = [v1.GraphKeys.LOCAL_VARIABLES]
    return next_creator(**kwargs)


def reader(cluster, train) -> LocalCopies:
    device = cluster.compute_device() if cluster.is_distributed else None
    rows = row_copies.RowCopies(device) if train.step_path.name == plan.ROUNDS else None
    return LocalCopies(device, cluster.num_replicas, rows)


class PushEveryK(v1.train.SessionRunHook):
    """Runs the push and fetch with every Kth step (`after_step`: the push that waits for the step's
    update), and alone at the end for the steps since the last (`alone`)."""

    def __init__(self, every: int, after_step, alone):
        self._every, self._after_step, self._alone = every, after_step, alone
        self._since_push = 0

    def after_create_session(self, session, coord):
        self._since_push = 0  # a new session fetched the copies afresh (their local init)

    def before_run(self, run_context):
        return v1.train.SessionRunArgs(self._after_step if self._since_push + 1 == self._every else None)

    def after_run(self, run_context, run_values):
        self._since_push = (self._since_push + 1) % self._every

    def end(self, session):
        if self._since_push:
            session.run(self._alone)


def build_with_tables(ctx: StepContext) -> Step:
    """One step a session.run: the tables' rows updated on the ps, the dense copies here; every Kth
    step's run pushes and fetches the copies."""
    copies, train = ctx.reader, ctx.train
    if train.step_path.steps_per_run != 1:  # training/plan.py makes a run one step for a model with tables
        raise ValueError("--local_steps with embedding tables: a session.run is one step")
    with v1.variable_creator_scope(slots_stay_local):
        train_op = update.apply_update(ctx.first.loss, ctx.optimizer, ctx.global_step, train.clip_gradient_norm,
                                       var_list=copies.local_variables + copies.table_variables)
    with tf.control_dependencies([train_op]):
        after_step = copies.push_and_fetch()
    push = PushEveryK(train.local_steps, after_step, copies.push_and_fetch())
    stop = v1.train.StopAtStepHook(last_step=train.train_steps)
    # MonitoredTrainingSession puts the chief-only hooks before its CheckpointSaverHook: there, the end's
    # push lands before the final checkpoint is written.
    hooks, chief_only = ((stop,), (push,)) if ctx.cluster.is_chief else ((push, stop), ())
    return Step(train_op, Metrics.of(ctx.first), ctx.first_labels, None, hooks, chief_only, counted=train_op)


def build_rounds(ctx: StepContext) -> Step:
    """A model with tables read through grouped lookups, trained by rounds (training/step/row_copies.py): a
    session.run reads --local_steps batches at once, fetches their rows, trains up to that many steps on copies of the
    rows and of the dense variables (cut at --train_steps as read at the round's start, and at the
    batches read: the input's last read can be short), pushes both, and counts the steps taken."""
    copies, rows, train = ctx.reader, ctx.reader.rows, ctx.train
    size, graph_tables = train.batch_size, ctx.first.graph_tables
    with v1.variable_creator_scope(slots_stay_local), v1.variable_creator_scope(rows.slots_start_empty):
        # Never run: it makes the optimizer's slots of the tables (on the ps) and of the dense copies.
        update.apply_update(ctx.first.loss, ctx.optimizer, None, train.clip_gradient_norm, summaries=False,
                            var_list=copies.local_variables + copies.table_variables)
        features, labels = ctx.next_batch()
        with grouped_lookup.rows_from(graph_tables, rows.naming()):
            ctx.forward((features, labels))  # builds the model on the round's batches: it names their rows
        if rows.family_shards is None:
            raise ValueError("--local_steps: the model declares grouped lookups of its tables (model/needs.py) "
                             "but made none")

        def batch(i):
            # The step's examples among the round's: where a step finds its part of IDs the ps resolved.
            rows.step_examples = (i * size, (i + 1) * size)
            return tf.nest.map_structure(lambda column: column[i * size:(i + 1) * size], (features, labels))

        variables = copies.local_variables + rows.copies
        with grouped_lookup.rows_from(graph_tables, rows):
            # Never run either: it makes the slots of the rows' copies, which a loop body cannot.
            output, _ = ctx.forward(batch(0))
            update.apply_update(output.loss, ctx.optimizer, None, train.clip_gradient_norm, summaries=False,
                                var_list=variables)
            loaded = rows.fetch_and_load(ctx.optimizer)
            budget = tf.minimum(_budget(ctx), (tf.size(labels) + size - 1) // size)  # and the batches read
            rows.steps_read(ctx.global_step.read_value(), size, budget)

            def local_step(carried):
                i, = carried
                output, labels = ctx.forward(batch(i))
                applied = update.apply_update(output.loss, ctx.optimizer, None, train.clip_gradient_norm,
                                              summaries=False, var_list=variables)
                return Iteration([i + 1], Metrics.of(output), labels, applied)

            with tf.control_dependencies([loaded]):
                result = training_loop("local_steps", lambda done, _: done < budget, local_step, ctx.figures,
                                       carried=[tf.constant(0)], carried_shapes=[tf.TensorShape([])])
    return _pushed_and_counted(ctx, result, [copies.push_and_fetch, lambda: rows.push(graph_tables)])


def _budget(ctx: StepContext) -> tf.Tensor:
    """The round's steps: --local_steps, cut at --train_steps as the global step reads at its start."""
    start = ctx.global_step.read_value()
    return tf.cast(tf.clip_by_value(ctx.train.train_steps - start, 0, ctx.train.local_steps), tf.int32)


def _pushed_and_counted(ctx: StepContext, result, pushes) -> Step:
    """The round's step: after its loop, its pushes (callables that build them), then global step + the
    steps the loop took."""
    with tf.control_dependencies([result.done]):
        pushed = [push() for push in pushes]
    with tf.control_dependencies(pushed), v1.colocate_with(ctx.global_step):
        counted = ctx.global_step.assign_add(tf.cast(result.done, ctx.global_step.dtype), read_value=False)
    with tf.control_dependencies([counted]):
        done = tf.identity(result.done, name="local_steps_taken")
    return Step(done.op, result.metrics, result.labels, done,
                (v1.train.StopAtStepHook(last_step=ctx.train.train_steps),), counted=counted)


def build(ctx: StepContext) -> Step:
    """A model with tables: build_with_tables. Otherwise one round: up to --local_steps steps on the
    copies (cut at --train_steps as read at the round's start), then one push and fetch, then global
    step + the steps taken. The single step's update built first makes the optimizer's slots of the
    copies (a loop body cannot), as local variables."""
    copies, train = ctx.reader, ctx.train
    if copies.tables:
        if copies.rows:
            logging.info("--local_steps=%d: rounds of %d batches, each fetching and pushing the rows of the tables "
                         "once (training/step/row_copies.py)", train.local_steps, train.local_steps)
            return build_rounds(ctx)
        logging.info("--local_steps=%d: the tables stay on the ps, read and updated every step (rounds of rows "
                     "take wide_deep's tables and an optimizer of %s); the dense variables are pushed every %d steps",
                     train.local_steps, ", ".join(row_copies.ADDITIVE_SLOTS), train.local_steps)
        return build_with_tables(ctx)
    size = sum(copy.shape.num_elements() * copy.dtype.base_dtype.size for copy in copies.local_variables)
    logging.info("--local_steps=%d: worker-side copies of %d variable(s), %.1f MB, each pushed whole every %d steps",
                 train.local_steps, len(copies.local_variables), size / 2**20, train.local_steps)
    with v1.variable_creator_scope(slots_stay_local):
        update.apply_update(ctx.first.loss, ctx.optimizer, None, train.clip_gradient_norm, summaries=False,
                            var_list=copies.local_variables)
        budget = _budget(ctx)

        def local_step(carried):
            output, labels = ctx.forward()
            applied = update.apply_update(output.loss, ctx.optimizer, None, train.clip_gradient_norm,
                                          summaries=False, var_list=copies.local_variables)
            return Iteration(carried, Metrics.of(output), labels, applied)

        result = training_loop("local_steps", lambda done, _: done < budget, local_step, ctx.figures)
        return _pushed_and_counted(ctx, result, [copies.push_and_fetch])
