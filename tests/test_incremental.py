"""Incremental checkpoints (training/incremental.py): a full checkpoint plus its deltas restores exactly
what a full checkpoint taken at the last delta's step holds, for hashed tables and for dynamic ones
that grow, admit and evict; an unreadable delta ends the chain; deltas go with their full checkpoint."""

import dataclasses
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from ps_trainer import input as inputs
from ps_trainer import model
from ps_trainer.cluster import spec
from ps_trainer.model.dynamic import storage as table_storage
from ps_trainer.training import checkpoints, evaluator, export, incremental
from ps_trainer.training import graph as train_graph
from ps_trainer.training.config import RunConfig, TrainConfig
from tests.support import tf_session

v1 = tf.compat.v1
DATA = inputs.DataConfig(name="clicks")
HASHED = model.ModelConfig(name="wide_deep", hash_buckets=3001, embedding_partitions=2, embedding_dim=4,
                           hidden_units=(8,), mark_touched_rows=True)
# Two shards that grow (from 64 rows: grown_early) as they meet the users and items of clicks.
DYNAMIC = dataclasses.replace(HASHED, embedding="dynamic", embedding_growth=True, embedding_capacity=400000,
                              embedding_min_count=2, embedding_steps_to_live=6)


def config(model_dir, model_cfg, keep=5) -> RunConfig:
    train = TrainConfig(model_dir=str(model_dir), optimizer="ftrl_adagrad", batch_size=64, learning_rate=0.1,
                        incremental_save_secs=1, keep_checkpoint_max=keep)
    return RunConfig(spec.ClusterConfig(), train, model_cfg, DATA)


@pytest.fixture(autouse=True)
def grown_early(monkeypatch):
    monkeypatch.setattr(table_storage, "GROWTH_ROWS", 64)


class Trainer:
    """The chief's training graph in one process, stepped and saved by hand."""

    def __init__(self, cfg):
        os.makedirs(cfg.train.model_dir, exist_ok=True)
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.train = train_graph.build_graph(cfg)
            self.sess = tf_session(graph=self.graph)
            self.sess.run([v1.global_variables_initializer(), v1.local_variables_initializer()])
        self.model_dir = cfg.train.model_dir

    def steps(self, count):
        for _ in range(count):
            self.sess.run(self.train.step.train_op)
            if self.train.tables.needs:
                self.train.tables.grow_as_needed(self.sess, self.sess.run(list(self.train.tables.needs)))

    def full(self, model_dir=None):
        os.makedirs(model_dir or self.model_dir, exist_ok=True)
        with self.graph.as_default():
            step = self.sess.run(v1.train.get_global_step())
            return self.train.saver.save(self.sess, os.path.join(model_dir or self.model_dir, "model.ckpt"), step)

    def delta(self):
        with self.graph.as_default():
            return self.train.saver.save_delta(self.sess, self.model_dir)


def restored(trainer, *prefixes) -> list[dict[str, np.ndarray]]:
    """Every saved variable and each map's (ID, row) pairs, as the chief's saver restores each prefix (and
    its deltas) into the trainer's graph in a new session (where nothing is initialized yet)."""
    with trainer.graph.as_default():
        trained = trainer.train.graph_tables.of(trainer.graph).trained_shards
        maps = {shard.map.full_name: shard.map.pairs() for _, shard in trained}
        variables = {variable.op.name: variable for variable in checkpoints.saved_variables()
                     if isinstance(variable, tf.Variable)}
        found = []
        for prefix in prefixes:  # a session each, where the restore is the first thing run
            with tf_session(graph=trainer.graph) as sess:
                trainer.train.saver.restore(sess, prefix)
                values, pairs = sess.run((variables, maps))  # one run: each costs a prune of the graph
            for name, (keys, rows) in pairs.items():
                order = np.argsort(keys)
                values[name] = np.stack([keys[order].astype(np.int64), rows[order]]) if keys.dtype != object else (
                    [(key, row) for key, row in sorted(zip(keys.tolist(), rows.tolist()))])
            found.append(values)
    return found


@pytest.mark.inprocess
@pytest.mark.parametrize("model_cfg", [DYNAMIC, HASHED], ids=["dynamic", "hashed"])
def test_a_full_checkpoint_and_its_deltas_restore_what_a_full_checkpoint_at_that_step_holds(tmp_path, model_cfg,
                                                                                              caplog):
    caplog.set_level("INFO", logger="absl")  # its own level (flags parsed in this process may have set it)
    cfg = config(tmp_path / "run", model_cfg)
    trainer = Trainer(cfg)
    trainer.steps(3)
    base = trainer.full()
    trainer.steps(4)
    first = trainer.delta()
    trainer.steps(6)  # past steps_to_live: the delta's save evicts rows, new IDs reuse them
    second = trainer.delta()
    assert [first, second] == incremental.deltas_of(base)
    assert trainer.delta() is None  # no step since the last save
    reference = trainer.full(str(tmp_path / "reference"))

    from_deltas, whole = restored(trainer, base, reference)
    assert sorted(from_deltas) == sorted(whole)
    for name, value in whole.items():
        np.testing.assert_array_equal(from_deltas[name], value, err_msg=name)
    assert whole["global_step"] == 13
    # The deltas hold the changed rows only, and what was trained did change the tables.
    held = sum(np.shape(value)[0] for name, value in whole.items() if name.endswith(("/embedding", "/part_0")))
    assert 0 < incremental.rows_held(second) < held
    # The evaluator and the export restore the chain too (the same function; each case checks one): the
    # same figures, and the same scores from the maps, as the full checkpoint.
    reference_cfg = config(tmp_path / "reference", model_cfg)
    if model_cfg.embedding == "hashed":
        assert evaluator.evaluate(cfg, base, 1000) == evaluator.evaluate(reference_cfg, reference, 1000)
    else:
        features, _ = next(iter(inputs.batches(DATA, inputs.Shard(0, 1), 50, split="eval", repeat=False)))
        features = {name: value.numpy() for name, value in features.items()}
        np.testing.assert_array_equal(export.predict(cfg, base, features)["logits"],
                                      export.predict(reference_cfg, reference, features)["logits"])
    if model_cfg.embedding_growth:  # what the deltas carried: grown storage, admissions and evictions
        assert whole["wide_deep/user/shard0/embedding"].shape[0] > table_storage.GROWTH_ROWS
        assert re.search(r"evicted the rows .*wide_deep/user [1-9]", caplog.text)


@pytest.mark.inprocess
def test_an_unreadable_delta_ends_the_chain_and_deltas_go_with_their_full_checkpoint(tmp_path, caplog):
    cfg = config(tmp_path, HASHED, keep=1)
    trainer = Trainer(cfg)
    trainer.steps(2)
    base = trainer.full()
    deltas = []
    for _ in range(3):
        trainer.steps(2)
        deltas.append(trainer.delta())
    data = tf.io.gfile.glob(deltas[1] + ".data-*")[0]
    with open(data, "r+b") as cut:
        cut.truncate(100)

    values, = restored(trainer, base)
    assert values["global_step"] == 4  # the first delta's step: the chain ends at the unreadable one
    assert "cannot be read" in caplog.text and os.path.basename(deltas[1]) in caplog.text
    assert incremental.deltas_of(base) == deltas[:1]  # it and the one built on it are gone

    trainer.steps(1)
    trainer.delta()
    trainer.full()  # keep=1: the first full checkpoint goes, and its deltas with it
    assert not [name for name in os.listdir(tmp_path) if name.startswith(os.path.basename(base))]
