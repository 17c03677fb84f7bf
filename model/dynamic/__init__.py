"""Dynamic tables (--embedding=dynamic): a row of its own for each raw value, made when training first
meets it, each table cut into shards by a hash of the ID. A kind of table: what model/tables.py's TableKind
names. Its modules, by job: ids.py (which shard holds an ID, and a batch's IDs on their way to the ps
tasks), storage.py (a shard's map, counters and row variables, and admission), upkeep.py (growth, eviction,
the reconciliation after a restore), table.py (DynamicTable: the rows of a batch of IDs, and their
gradients)."""

import tensorflow as tf

from ps_trainer.model import grouped_lookup, multi_valued
from ps_trainer.model.dynamic import table as dynamic_table
from ps_trainer.model.dynamic.ids import TableOptions
from ps_trainer.model.needs import table_part, wide_part

v1 = tf.compat.v1

# The settings only dynamic tables have: given for another kind, each is refused by name, never ignored (a
# user would believe admission or eviction on).
OWN_FLAGS = ("embedding_capacity", "embedding_growth", "embedding_steps_to_live", "embedding_min_count")


def misplaced(flag: str, embedding: str) -> str:
    """The refusal of this kind's own flag given for --embedding=`embedding`."""
    return (f"--{flag} is for --embedding=dynamic (a row per ID, made when training meets it); "
            f"--embedding={embedding} tables hold --hash_buckets rows from the start, with nothing to admit, evict "
            "or grow: add --embedding=dynamic or drop the flag.")


def restore_refusal(saved: dict, now) -> str | None:
    """Why a checkpoint of dynamic tables (`saved`: its run's model settings) cannot restore into `now`'s
    (model.ModelConfig), or None: each ID lies in the shard a hash of it picks among the table's shards, with
    admission counts and eviction state only when those are on; so the checkpoint restores into the same
    number of shards, the same capacity (a limit a resume may change, with --embedding_growth) and the same
    state kept, only."""
    shards = saved.get("embedding_partitions")
    if shards not in (None, now.embedding_partitions):
        return (f"the checkpoints' dynamic tables have {shards} shards each, this run's "
                f"{now.embedding_partitions} (one per ps unless --embedding_partitions says): resume with "
                f"--embedding_partitions={shards}")
    capacity, grew = saved.get("embedding_capacity"), saved.get("embedding_growth", False)
    if grew and not now.embedding_growth:
        return ("--noembedding_growth: the checkpoints' dynamic tables grew with the values they met, to "
                "lengths of their own; resume with --embedding_growth")
    if capacity not in (None, now.embedding_capacity) and not now.embedding_growth:
        return (f"--embedding_capacity={now.embedding_capacity}: the checkpoints' dynamic tables hold "
                f"{capacity} rows each, and a table's capacity is fixed for its run: resume with "
                f"--embedding_capacity={capacity}, or with --embedding_growth (whose capacity is a limit), "
                f"or train with the new one in a new --model_dir")
    for flag, kept in (("embedding_min_count", lambda value: value > 1),
                       ("embedding_steps_to_live", lambda value: value > 0)):
        if flag in saved and kept(saved[flag]) != kept(getattr(now, flag)):
            return (f"--{flag}={getattr(now, flag)}: the checkpoints' dynamic tables were trained with "
                    f"--{flag}={saved[flag]}, which {'keeps' if kept(saved[flag]) else 'does not keep'} the "
                    f"state it needs; resume with --{flag}={saved[flag]} (or another value that "
                    f"{'keeps' if kept(saved[flag]) else 'does not keep'} it)")
    return None


def resumed_shards(saved: dict) -> int | None:
    """The shards a resume keeps unless --embedding_partitions says otherwise (`saved`: the checkpoint's run's
    model settings): its IDs restore only into as many (restore_refusal)."""
    return saved.get("embedding_partitions")


def options_of(model_cfg) -> TableOptions:
    """The options of every dynamic table of a run (model.ModelConfig: its flags)."""
    return TableOptions(capacity=model_cfg.embedding_capacity, shards=model_cfg.embedding_partitions,
                        devices=model_cfg.table_devices, min_count=model_cfg.embedding_min_count,
                        steps_to_live=model_cfg.embedding_steps_to_live, grow=model_cfg.embedding_growth,
                        mark_changes=model_cfg.mark_touched_rows)


def columns(features, names, model_cfg, num_classes, training, initializer, graph_tables):
    """(embeddings, wide weights) of every categorical column, each [batch, columns, width] (a multi-valued
    column's rows combined: model/multi_valued.py), from rows of their own; each ps is sent the batch's
    distinct IDs of every column at once and sends one tensor of rows back per trained value, a row per
    distinct ID. The tables go in `graph_tables`."""
    options = options_of(model_cfg)
    ids = multi_valued.ids_of([features[name] for name in names])
    rounds = grouped_lookup.current_source(graph_tables)  # training/step/row_copies.py: rounds of rows on the worker
    if rounds is not None and not rounds.names_round:  # a step of a round: its rows are the round's copies
        deep, wide = grouped_lookup.lookup(None, ids, graph_tables)
    else:
        tables = []
        with table_part():
            for column, name in enumerate(names):
                with v1.variable_scope(name):
                    tables.append(dynamic_table.DynamicTable(graph_tables, v1.get_variable_scope().name, ids, options,
                                                             training, column))
            if rounds is None:
                deep = dynamic_table.rows_of_columns(tables, "embedding", model_cfg.embedding_dim, initializer)
                with wide_part():
                    wide = dynamic_table.rows_of_columns(tables, "wide", num_classes, v1.zeros_initializer())
            else:  # a round's batches: their IDs admitted, and where their rows lie, for the round's copies
                embeddings = [table.storage("embedding", model_cfg.embedding_dim, initializer) for table in tables]
                with wide_part():
                    weights = [table.storage("wide", num_classes, v1.zeros_initializer()) for table in tables]
                rounds.guard(tables)
                deep, wide = grouped_lookup.lookup(
                    [embeddings, weights], grouped_lookup.Resolved(dynamic_table.pairs_of_columns(tables), ids),
                    graph_tables)
    return (multi_valued.combined(deep, ids, model_cfg.combiner),
            multi_valued.combined(wide, ids, multi_valued.WIDE_COMBINER))
