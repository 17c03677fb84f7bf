"""Model output shapes and metrics, in one process."""

import pytest
import tensorflow as tf

from ps_trainer import input as inputs
from ps_trainer import model
from tests.support import tf_session

v1 = tf.compat.v1


IMAGES = inputs.DataConfig()
CLICKS = inputs.DataConfig(name="clicks")


def batch(data_cfg, size=5):
    features, labels = next(iter(inputs.DATASETS[data_cfg.name].records(data_cfg, "train", inputs.Shard(0, 1))
                                 .batch(size).take(1)))
    return {k: tf.constant(v.numpy()) for k, v in features.items()}, tf.constant(labels.numpy())


@pytest.mark.inprocess
@pytest.mark.parametrize("name,data", [("mlp", IMAGES), ("cnn", IMAGES), ("wide_deep", CLICKS)])
def test_model_gives_logits_a_scalar_loss_and_accuracy(name, data):
    data_spec = inputs.spec(data)
    features, labels = batch(data)
    with tf.Graph().as_default():
        features = {k: tf.constant(v.numpy()) for k, v in features.items()}
        out = model.build(features, tf.constant(labels.numpy()), model.ModelConfig(name=name, hidden_units=(32, 16)),
                          data_spec)
        assert out.logits.shape.as_list() == [5, data_spec.num_classes]
        assert out.loss.shape.as_list() == [] and out.accuracy.shape.as_list() == []
        with tf_session() as sess:
            sess.run(v1.global_variables_initializer())
            loss, accuracy, summary = sess.run([out.loss, out.accuracy, v1.summary.merge_all()])
        tags = {value.tag for value in tf.compat.v1.Summary.FromString(summary).value}
        assert tags == ({"loss", "accuracy", "auc"} if data_spec.num_classes == 2 else {"loss", "accuracy"})
        # Untrained: a positive, finite cross-entropy (on 5 examples it can fall anywhere near ln(classes)).
        assert 0.0 < loss < 10 and 0.0 <= accuracy <= 1.0


@pytest.mark.pure
def test_mlp_layers_follow_hidden_units():
    with tf.Graph().as_default():
        model.build({"image": tf.zeros([2, 28, 28, 1], tf.uint8)}, tf.zeros([2], tf.int64),
                    model.ModelConfig(hidden_units=(64, 32)), inputs.spec(IMAGES))
        shapes = {v.name: v.shape.as_list() for v in v1.global_variables()}
    assert shapes == {
        "mlp/hidden0/kernel:0": [784, 64], "mlp/hidden0/bias:0": [64],
        "mlp/hidden1/kernel:0": [64, 32], "mlp/hidden1/bias:0": [32],
        "mlp/logits/kernel:0": [32, 10], "mlp/logits/bias:0": [10],
    }


@pytest.mark.pure
def test_wide_deep_tables_are_partitioned_and_lookups_are_sparse():
    cfg = model.ModelConfig(name="wide_deep", hidden_units=(8,), hash_buckets=1000, embedding_dim=4,
                            embedding_partitions=2)
    features, labels = batch(CLICKS, size=3)
    with tf.Graph().as_default():
        features = {k: tf.constant(v.numpy()) for k, v in features.items()}
        out = model.build(features, tf.constant(labels.numpy()), cfg, inputs.spec(CLICKS))
        shapes = {v.op.name: v.shape.as_list() for v in v1.global_variables()}
        table = [v for v in v1.global_variables() if v.op.name == "wide_deep/user/embedding/part_0"][0]
        gradient = tf.gradients(out.loss, [table])[0]
    assert shapes["wide_deep/user/embedding/part_0"] == [500, 4] == shapes["wide_deep/user/embedding/part_1"]
    assert shapes["wide_deep/item/wide/part_1"] == [500, 2]
    assert isinstance(gradient, tf.IndexedSlices)  # only the rows looked up get (and send) a gradient


@pytest.mark.pure
def test_batch_auc_counts_correctly_ranked_pairs():
    labels = tf.constant([1, 0, 1, 0], tf.int64)
    assert float(model.batch_auc(labels, tf.constant([0.9, 0.1, 0.8, 0.2]))) == 1.0
    assert float(model.batch_auc(labels, tf.constant([0.1, 0.9, 0.2, 0.8]))) == 0.0
    assert float(model.batch_auc(labels, tf.constant([0.5, 0.5, 0.9, 0.1]))) == 0.875  # one tie: 3.5 of 4


@pytest.mark.pure
def test_the_export_copy_for_sagemaker_is_whole_and_replaces_an_older_one(tmp_path):
    from ps_trainer.training import export
    source = tmp_path / "export" / "300"
    (source / "variables").mkdir(parents=True)
    (source / "saved_model.pb").write_bytes(b"graph")
    (source / "variables" / "variables.index").write_bytes(b"index")
    target = tmp_path / "sm_model" / "300"
    (target / "stale").mkdir(parents=True)
    assert export._copy_tree(str(source), str(target)) == str(target)
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*")) == [
        "saved_model.pb", "variables", "variables/variables.index"]
    assert (target / "variables" / "variables.index").read_bytes() == b"index"
    assert not list(target.parent.glob("*.incomplete"))


@pytest.mark.inprocess
@pytest.mark.parametrize("name,data,embedding", [("mlp", IMAGES, "hashed"), ("cnn", IMAGES, "hashed"),
                                                 ("wide_deep", CLICKS, "hashed"), ("wide_deep", CLICKS, "dynamic")])
def test_an_empty_batch_has_zero_loss_and_zero_gradients(name, data, embedding):
    # What a sync worker with nothing to read sends its round (--input_queue): a share that adds nothing.
    features, labels = batch(data)
    with tf.Graph().as_default():
        features = {k: tf.constant(v.numpy()[:0]) for k, v in features.items()}
        cfg = model.ModelConfig(name=name, hidden_units=(8,), embedding=embedding)
        out = model.build(features, tf.constant(labels.numpy()[:0]), cfg, inputs.spec(data), training=True)
        variables = v1.trainable_variables()
        grads = [g for g in tf.gradients(out.loss, variables) if g is not None]
        assert grads, variables
        with tf_session() as sess:
            sess.run([v1.global_variables_initializer(), v1.tables_initializer()])
            loss, accuracy, grads = sess.run([out.loss, out.accuracy, grads])
    assert (loss, accuracy) == (0.0, 0.0)
    for grad in grads:
        values = getattr(grad, "values", grad)  # an IndexedSlicesValue (a sparse lookup's) or an array
        assert not values.any()
