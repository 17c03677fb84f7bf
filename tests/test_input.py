"""Inputs: the embedded dataset is deterministic and learnable, and shards never overlap."""

import numpy as np
import pytest
import tensorflow as tf

import input as inputs
from input import synthetic, tfrecord

CFG = inputs.DataConfig(synthetic_examples=120, seed=7)


def epoch(cfg, shard, split="train"):
    """One pass over a shard's records, as (image bytes, label) pairs, in eager mode."""
    dataset = inputs.DATASETS[cfg.name].records(cfg, split, shard)
    return [(image.numpy().tobytes(), int(label)) for image, label in dataset]


def test_synthetic_is_a_pure_function_of_the_seed():
    assert epoch(CFG, inputs.Shard(0, 1)) == epoch(CFG, inputs.Shard(0, 1))
    other_seed = inputs.DataConfig(synthetic_examples=120, seed=8)
    assert epoch(CFG, inputs.Shard(0, 1)) != epoch(other_seed, inputs.Shard(0, 1))


def test_synthetic_images_have_the_declared_shape_and_every_class():
    images, labels = zip(*inputs.DATASETS["synthetic"].records(CFG, "train", inputs.Shard(0, 1)))
    assert images[0].shape == (28, 28, 1) and images[0].dtype == tf.uint8
    assert set(int(label) for label in labels) == set(range(10))


def test_synthetic_classes_are_separable_by_their_prototypes():
    # Nearest prototype, blind to the shifts, already beats chance (0.1) threefold.
    templates = synthetic.prototypes(CFG.seed).reshape(10, -1)
    records = epoch(inputs.DataConfig(synthetic_examples=500, seed=CFG.seed), inputs.Shard(0, 1))
    hits = 0
    for image, label in records:
        pixels = np.frombuffer(image, np.uint8).astype(np.float32) / 255.0
        hits += int(np.argmax(templates @ pixels) == label)
    assert hits / len(records) > 0.3


@pytest.mark.parametrize("count", [2, 3])
def test_synthetic_shards_are_disjoint_and_cover_the_epoch(count):
    whole = epoch(CFG, inputs.Shard(0, 1))
    shards = [epoch(CFG, inputs.Shard(i, count)) for i in range(count)]
    seen = [image for shard in shards for image, _ in shard]
    assert len(seen) == len(set(seen)) == len(whole)
    assert sorted(seen) == sorted(image for image, _ in whole)


def test_eval_split_is_held_out():
    train = {image for image, _ in epoch(CFG, inputs.Shard(0, 1))}
    held_out = {image for image, _ in epoch(CFG, inputs.Shard(0, 1), split="eval")}
    assert len(held_out) == synthetic.EVAL_EXAMPLES and not train & held_out


@pytest.fixture
def tfrecord_dir(tmp_path):
    records = [(image.numpy(), label.numpy()) for image, label in
               synthetic.records(CFG, "train", inputs.Shard(0, 1))]
    tfrecord.write(records, str(tmp_path), "train", num_files=3)
    return tmp_path


@pytest.mark.parametrize("workers", [2, 3, 4, 5])  # 2-3: by file; 4-5: by record
def test_tfrecord_shards_are_disjoint_and_complete(tfrecord_dir, workers):
    cfg = inputs.DataConfig(name="tfrecord", data_dir=str(tfrecord_dir))
    assert tfrecord.check(cfg) is None
    shards = [epoch(cfg, inputs.Shard(i, workers)) for i in range(workers)]
    assert all(shards)
    seen = [record for shard in shards for record in shard]
    assert sorted(seen) == sorted(epoch(CFG, inputs.Shard(0, 1)))


def test_tfrecord_roundtrip_keeps_images_and_labels(tfrecord_dir):
    cfg = inputs.DataConfig(name="tfrecord", data_dir=str(tfrecord_dir))
    assert sorted(epoch(cfg, inputs.Shard(0, 1))) == sorted(epoch(CFG, inputs.Shard(0, 1)))
    assert not list(tfrecord_dir.glob("*.incomplete"))


def test_batches_are_float_in_unit_range_and_full():
    images, labels = next(iter(inputs.batches(CFG, inputs.Shard(1, 2), batch_size=16)))
    assert images.shape == (16, 28, 28, 1) and images.dtype == tf.float32
    assert 0.0 <= float(tf.reduce_min(images)) and float(tf.reduce_max(images)) <= 1.0
    assert labels.shape == (16,)
