"""This replica's training graph: the input, the model, and the step that reaches the ps.

Variables go to the ps tasks (replica_device_setter, by bytes), everything else stays on this worker.
What one session.run does (a single step, sync or not, or one of the levers) is training/step/.
"""

import dataclasses
from typing import Callable, NamedTuple

import tensorflow as tf
from absl import logging

from ps_trainer import input as inputs
from ps_trainer import model
from ps_trainer.model import touched_rows
from ps_trainer.model.graph_tables import GraphTables
from ps_trainer.model.dynamic import storage as table_storage, upkeep as table_upkeep
from ps_trainer.cluster import model_dir as layout
from ps_trainer.cluster import placement, spec
from ps_trainer.input import work_queue
from ps_trainer.model import user_fn
from ps_trainer.training import checkpoints, plan, queue_hook, step, warm_start
from ps_trainer.training import optimizers, schedules

v1 = tf.compat.v1


def _eviction(graph_tables, slots_of, steps_to_live: int):
    """What the chief runs before each save when dynamic tables evict: the eviction, then a log line."""
    counts = table_upkeep.eviction(graph_tables, slots_of)
    if counts is None:
        return None

    def evict(sess):
        evicted = sess.run(counts)
        logging.info("evicted the rows no step read in the last %d global steps: %s", steps_to_live,
                     ", ".join(f"{table} {int(count)}" for table, count in sorted(evicted.items())))
    return evict


class Tables(NamedTuple):
    """What a training graph's dynamic tables need once its update is built: the optimizer's slots of a
    variable, their upkeep (growth; the chief's reconciliation after a restore) and the chief's eviction."""
    slots_of: Callable  # (variable) -> the optimizer's (slot, start value) pairs
    upkeep: table_upkeep.Upkeep
    evict: Callable | None  # (session) before each save; None where no table evicts, or not the chief


def tables_of(graph_tables: GraphTables, optimizer, is_chief: bool, steps_to_live: int) -> Tables:
    """The Tables of the model's tables, `graph_tables` (no dynamic table: an empty upkeep), updated by
    `optimizer`. Only the chief restores and saves: a non-chief worker's graph has no reconciliation, no
    eviction. The rows-held counters and the touched-row marks are left out of the checkpoints."""
    def slots_of(variable):
        return optimizers.slots_and_starts(optimizer, variable)

    evict = _eviction(graph_tables, slots_of, steps_to_live) if is_chief else None
    upkeep = table_upkeep.upkeep(graph_tables, slots_of, restores=is_chief)
    for held in v1.get_collection(table_storage.ROWS_HELD) + v1.get_collection(touched_rows.MARKS):
        v1.add_to_collection(checkpoints.NOT_SAVED, held)
    return Tables(slots_of, upkeep, evict)


def forget_critical_section_executions() -> None:
    """Clears CriticalSection's record of its executions (the work queue's, dynamic tables'), kept for access
    checks while the graph is built: a MetaGraphDef cannot hold it, and every checkpoint's save warns of it."""
    v1.get_collection_ref("critical_section_executions").clear()


class TrainGraph(NamedTuple):
    saver: tf.compat.v1.train.Saver
    step: step.Step
    # The names of the variables not initialized (yet), on the ps: built once, for the chief's saver
    # and a non-chief's wait for the chief (a MonitoredTrainingSession that failed can leave the graph
    # finalized, so nothing can be added later).
    uninitialized: tf.Tensor
    # --input_queue: the hook that feeds this worker's input from the work queue, else None.
    input_queue: queue_hook.InputQueueHook | None = None
    # Dynamic tables: their upkeep (model/dynamic/upkeep.py), run every few training steps.
    tables: table_upkeep.Upkeep = table_upkeep.Upkeep()
    # --warm_start_from with dynamic tables: their load, the chief's Scaffold's init_fn (training/warm_start.py).
    warm_load: warm_start.DynamicLoad | None = None
    # A --model_fn's own train_op is the update (model/user_fn.py): the optimizer flags do not apply.
    own_update: bool = False
    # The model's tables (model/graph_tables.py).
    graph_tables: GraphTables | None = None


def _work_queue(cfg, global_step) -> work_queue.ItemFeed:
    """--input_queue: the work queue on ps 0 (one per training replica's graph, the same state) and
    this worker's feed of it; its session is connected when the worker knows its target."""
    cluster, train = cfg.cluster, cfg.train
    num_files = len(inputs.DATASETS[cfg.data.name].files(cfg.data, "train"))
    queue = work_queue.WorkQueue(num_files, cluster.replica_index, spec.MAX_REPLICAS, train.num_epochs,
                                 cfg.data.input_queue_lease_secs, cluster.ps_devices()[0], global_step,
                                 not_saved=checkpoints.NOT_SAVED,
                                 ahead_shape=work_queue.ahead_log_shape(cluster.num_replicas, cfg.data.shuffle_buffer))
    return work_queue.ItemFeed(queue, cluster.task_name, empty_batches=train.sync_replicas,
                               files_per_pass=work_queue.files_per_pass(num_files, cluster.num_replicas))


def build_graph(cfg, stop_requested=None) -> TrainGraph:
    """This replica's training graph: variables on the ps tasks, everything else on this worker.
    `stop_requested()` ends a sync worker's wait for a round (see training/step/sync.py)."""
    cluster, train = cfg.cluster, cfg.train
    v1.set_random_seed(train.seed)
    lever = step.lever(train)
    device = placement.device_setter(cluster) if cluster.is_distributed else None
    with v1.device(device):
        global_step = v1.train.get_or_create_global_step()
        read_size = train.step_path.read_size(train.batch_size)
        if cfg.data.input_queue:
            feed = _work_queue(cfg, global_step)
            batches = v1.data.make_initializable_iterator(inputs.batches(cfg.data, inputs.Shard(0, 1, feed),
                                                                         read_size))
        else:
            feed = None
            shard = inputs.Shard(cluster.replica_index, cluster.num_replicas)
            batches = v1.data.make_one_shot_iterator(inputs.batches(cfg.data, shard, read_size))
        # --input_queue: each read's (file keys, ordinals in the files) of its examples; the step trains
        # the last read built (a round's is built after the first forward pass, which makes the variables).
        tags = []
        reader, getter = step.reader_and_getter(lever, cluster, train)
        data_spec = inputs.spec(cfg.data)
        model_cfg = dataclasses.replace(cfg.model, table_devices=cluster.ps_devices())
        graph_tables = GraphTables()  # the model's tables, however many times a lever builds it

        def next_batch():
            features, labels, *example_tags = batches.get_next()
            tags.append(example_tags)
            return features, labels

        def forward(batch=None):
            features, labels = batch or next_batch()
            with v1.variable_scope(v1.get_variable_scope(), custom_getter=getter, reuse=v1.AUTO_REUSE):
                return model.build(features, labels, model_cfg, data_spec, summaries=False, training=True,
                                   graph_tables=graph_tables), labels

        if cfg.model.model_fn:
            _refuse_own_update(cfg, model_cfg, data_spec)
        first, first_labels = forward()
        if first.own_update is not None:
            logging.info("%s: the model_fn's own train_op is the update, run as written: --optimizer, "
                         "--learning_rate and --clip_gradient_norm do not apply", cluster.task_name)
        learning_rate = schedules.learning_rate(global_step, train)
        v1.summary.scalar("learning_rate", learning_rate)
        optimizer = optimizers.make_optimizer(learning_rate, train, graph_tables)
        built = lever.build(step.StepContext(forward, first, first_labels, optimizer, global_step, cluster, train,
                                             reader, stop_requested, next_batch))
        model.summarize(built.metrics)
        tables = tables_of(graph_tables, optimizer, cluster.is_chief, cfg.model.embedding_steps_to_live)
        warm = warm_start.apply(train, cluster.task_name, cluster.is_chief, graph_tables, tables.slots_of,
                                tables.upkeep.after_restore)
    forget_critical_section_executions()
    uninitialized = checkpoints.report_uninitialized()
    # As MonitoredTrainingSession's default saver (sharded: each ps saves its own variables), with
    # --keep_checkpoint_max.
    # A checkpoint whose input queue has no trained prefixes restores without them (checkpoints.OlderLayout).
    older = checkpoints.older_layout(train.model_dir, [feed.queue.prefixes] if feed else [], sharded=True)
    saver = checkpoints.LiveStateSaver(uninitialized, sharded=True, max_to_keep=train.keep_checkpoint_max,
                                       save_relative_paths=True, before_save=tables.evict,
                                       after_restore=tables.upkeep.after_restore, older=older,
                                       fresh_state=checkpoints.optimizer_state_layout(
                                           train.model_dir if cluster.is_chief else None, sharded=True),
                                       # The chief alone saves and restores: the others need no delta saver.
                                       slots_of=tables.slots_of if train.incremental_save_secs and cluster.is_chief
                                       else None, graph_tables=graph_tables)
    queue = None
    if feed:
        if built.end_op is not None:
            feed.end_op = built.end_op
        audit = layout.audit_file(cfg.train.model_dir, cluster.task_dir) if cfg.data.input_queue_audit else None
        queue = queue_hook.InputQueueHook(feed, *_trained_tags(tags[-1], built, train), batches.initializer,
                                          cfg.data.input_queue_lease_secs,
                                          drops_first_step=built.drops_next_push,
                                          audit_path=audit,
                                          reached=built.round_applied or step_reached(built.counted, global_step))
    return TrainGraph(saver, built, uninitialized, queue, tables.upkeep, warm, own_update=first.own_update is not None,
                      graph_tables=graph_tables)


def _refuse_own_update(cfg, model_cfg, data_spec) -> None:
    """A model_fn that returns its own train_op trains on the single step path, its update as written; where a
    lever makes the update, ModelFnError in one line. The model_fn is asked in a scratch graph first: under a
    lever's custom getter its optimizer would fail on the copies it is handed, with no word of why."""
    refusal = plan.own_update_refusal(cfg.train.step_path.name, cfg.train.sync_replicas, cfg.model.embedding)
    if refusal is None:
        return
    with tf.Graph().as_default():
        features, labels, *_ = v1.data.make_one_shot_iterator(
            inputs.batches(cfg.data, inputs.Shard(0, 1), cfg.train.batch_size)).get_next()
        built = model.build(features, labels, model_cfg, data_spec, summaries=False, training=True)
    if built.own_update is not None:
        raise user_fn.ModelFnError(
            f"--model_fn={cfg.model.model_fn}: its EstimatorSpec has a train_op, and {refusal}: return the loss "
            "alone (the runtime's --optimizer then makes the update), or train without that flag")


def step_reached(counted, global_step):
    """The global step as the run's own count left it (None where no op of the run counts): read after
    `counted`, on its device, so no call is added. The run's trained examples are reported to the input
    queue with it, and ps 0 drops a report where the global step is behind it: after a restore that undid
    the run's update, its examples are trained again. Read anywhere in the run, the global step is often
    the one before the count, and a round whose push the restore undid would be reported trained."""
    if counted is None:
        return None
    with tf.control_dependencies([counted]), v1.colocate_with(global_step):
        return tf.identity(global_step.read_value(), name="global_step_reached")


def _trained_tags(read_tags, built, train):
    """The (file keys, ordinals) of the examples a run trains of its read: all of a step's batch; of a
    round's batches, those of the steps it took (--train_steps can cut a round short)."""
    if not train.step_path.reads_several_batches:
        return read_tags
    trained = tf.cast(built.steps_done, tf.int64) * train.batch_size
    return [tags[:trained] for tags in read_tags]
