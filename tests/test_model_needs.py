"""A model declares what it needs of the trainer (model/needs.py), and the trainer reads only that: a
sparse model added as one module and one MODELS line gets its optimizer, its wide part, its tables
kept on the ps by --local_steps and --accumulate_batches' refusal, with no rule about it outside model/."""

import types

import numpy as np
import pytest
import tensorflow as tf
from absl import app
from absl.flags import FLAGS

from ps_trainer import input as inputs
from ps_trainer import model
from ps_trainer.model import layers, needs, spec
from tests.support import read_flags, tf_session
from ps_trainer.training import graph as train_graph
from ps_trainer.training.config import RunConfig
from ps_trainer.training.step import local_steps

pytestmark = pytest.mark.inprocess

v1 = tf.compat.v1


def tiny_sparse_logits(features, cfg, data_spec, training):
    """One id-weight table per categorical column, cut in two, as the model's wide part; a dense layer
    over the numeric columns as its deep part."""
    numeric = sorted(n for n, s in data_spec.features.items() if s.dtype == tf.float32)
    categorical = sorted(n for n, s in data_spec.features.items() if s.dtype == tf.string)
    terms = [layers.dense(tf.stack([features[n] for n in numeric], axis=1), data_spec.num_classes, "deep")]
    for name in categorical:
        ids = tf.strings.to_hash_bucket_fast(features[name], 64)
        with needs.table_part(), needs.wide_part():
            table = v1.get_variable(f"ids_{name}", [64, data_spec.num_classes], initializer=v1.zeros_initializer(),
                                    partitioner=v1.fixed_size_partitioner(2))
        terms.append(v1.nn.embedding_lookup(table, ids, partition_strategy="div"))
    return tf.add_n(terms)


TINY_SPARSE = types.SimpleNamespace(
    NEEDS=needs.Needs(default_optimizer="ftrl_adagrad", partitioned_tables=True),
    check=lambda data_spec: None,
    model_fn=spec.classifier(tiny_sparse_logits),
)


@pytest.fixture
def tiny_sparse_model(monkeypatch):
    """The model registered as its author would: one MODELS line (the --model flag lists MODELS)."""
    monkeypatch.setitem(model.MODELS, "tiny_sparse", TINY_SPARSE)
    monkeypatch.setattr(FLAGS["model"].parser, "enum_values", [*FLAGS["model"].parser.enum_values, "tiny_sparse"])
    yield "tiny_sparse"
    FLAGS.unparse_flags()


def test_a_sparse_model_added_in_one_module_trains_its_declared_wide_part_with_ftrl(tiny_sparse_model):
    cfg = read_flags(f"--model={tiny_sparse_model}", "--dataset=clicks", "--synthetic_examples=512",
                     "--batch_size=32", "--model_dir=/tmp/unused-tiny-sparse")
    assert cfg.train.optimizer == "ftrl_adagrad"  # the model's declared default
    assert read_flags(f"--model={tiny_sparse_model}", "--dataset=clicks", "--optimizer=adam",
                      "--model_dir=/tmp/unused-tiny-sparse").train.optimizer == "adam"  # a named one wins
    with tf.Graph().as_default():
        graph = train_graph.build_graph(RunConfig(cfg.cluster, cfg.train, cfg.model, cfg.data))
        wide = v1.get_collection(needs.WIDE_VARIABLES)
        assert len(wide) == 2 * len([s for s in inputs.spec(cfg.data).features.values() if s.dtype == tf.string])
        slots = {v.op.name for v in v1.global_variables()}
        # FTRL's slots on every shard of the wide tables, Adagrad's on the deep layer, nothing crossed.
        assert all(f"{v.op.name}/Ftrl" in slots and f"{v.op.name}/Adagrad" not in slots for v in wide)
        assert "tiny_sparse/deep/kernel/Adagrad" in slots and "tiny_sparse/deep/kernel/Ftrl" not in slots
        with tf_session() as sess:
            sess.run(v1.global_variables_initializer())
            before = sess.run(wide)
            for _ in range(5):
                sess.run(graph.step.train_op)
            assert any(np.any(after != start) for after, start in zip(sess.run(wide), before))


HOSTS = ["--ps_hosts=127.0.0.1:1", "--worker_hosts=127.0.0.1:2", "--job_name=worker", "--task_index=0"]


def test_accumulated_batches_refuse_a_model_that_declares_partitioned_tables(tiny_sparse_model):
    with pytest.raises(app.UsageError, match=f"--model={tiny_sparse_model}: its embedding tables are partitioned"):
        read_flags(*HOSTS, f"--model={tiny_sparse_model}", "--dataset=clicks", "--model_dir=/tmp/unused-tiny-sparse",
                   "--accumulate_batches=2", "--sync_replicas")


def test_local_steps_copy_a_table_models_dense_variables_and_leave_its_declared_tables_on_the_ps(tiny_sparse_model):
    cfg = read_flags(*HOSTS, f"--model={tiny_sparse_model}", "--dataset=clicks", "--model_dir=/tmp/unused-tiny-sparse",
                     "--local_steps=5")
    with tf.Graph().as_default():
        graph = train_graph.build_graph(RunConfig(cfg.cluster, cfg.train, cfg.model, cfg.data))
        copies = {v.op.name for v in v1.local_variables() if v.op.name.startswith(local_steps.SCOPE)}
        tables = v1.get_collection(needs.TABLE_VARIABLES)
        slots = {v.op.name for v in v1.global_variables()}
    # The deep layer's copies and the Adagrad slots of the copies, on the worker; nothing of the tables.
    assert copies == {f"{local_steps.SCOPE}/tiny_sparse/deep/{name}/{role}" for name in ("kernel", "bias")
                      for role in ("copy", "anchor", "copy/Adagrad")}
    # Each shard of the tables is read where it is, and updated there by FTRL (its slots beside it, saved).
    assert tables and all(v.device.startswith("/job:ps/") and f"{v.op.name}/Ftrl" in slots for v in tables)
    assert graph.step.steps_done is None  # a run is one step
