"""The embedded default dataset: 28x28x1 images of 10 classes, generated from --seed.

Each class has a prototype made of a few soft strokes; an example is its class prototype, shifted by
up to two pixels, scaled in contrast and covered in noise. Example i is a pure function of (seed, i),
computed by stateless random ops, so any worker can produce exactly its own shard with no download
and no large constant in the graph.
"""

import numpy as np
import tensorflow as tf

from input import tuning
from input.specs import DataSpec, generated_shard_description

KIND = "generated"

IMAGE_SHAPE = (28, 28, 1)
NUM_CLASSES = 10
EVAL_EXAMPLES = 2000
NOISE_STDDEV = 0.6
MAX_SHIFT = 3


def check(cfg):
    return None


def spec(cfg):
    return DataSpec({"image": tf.TensorSpec(IMAGE_SHAPE, tf.uint8, "image")}, NUM_CLASSES)


def prototypes(seed: int) -> np.ndarray:
    """[NUM_CLASSES, 28, 28, 1] float32 templates, each three random strokes of gaussian ink."""
    rng = np.random.RandomState(seed)
    ys, xs = np.mgrid[0:28, 0:28].astype(np.float32)
    out = np.zeros((NUM_CLASSES, 28, 28), np.float32)
    for c in range(NUM_CLASSES):
        for _ in range(3):
            (y0, x0), (y1, x1) = rng.uniform(5, 23, size=(2, 2))
            for t in np.linspace(0.0, 1.0, 12):
                cy, cx = y0 + t * (y1 - y0), x0 + t * (x1 - x0)
                out[c] += np.exp(-((ys - cy) ** 2 + (xs - cx) ** 2) / (2 * 1.5**2))
        out[c] /= out[c].max()
    return out[..., None]


def records(cfg, split: str, shard) -> tf.data.Dataset:
    """Unbatched ({'image': uint8 image}, int64 label) of `split`, only the examples of `shard`."""
    first = 0 if split == "train" else cfg.synthetic_examples
    count = cfg.synthetic_examples if split == "train" else EVAL_EXAMPLES
    templates = tf.constant(prototypes(cfg.seed))
    seed = cfg.seed

    def make(index):
        label = tf.random.stateless_uniform([], [seed, index * 3], minval=0, maxval=NUM_CLASSES,
                                            dtype=tf.int64)
        shift = tf.random.stateless_uniform([2], [seed, index * 3 + 1], minval=-MAX_SHIFT,
                                            maxval=MAX_SHIFT + 1, dtype=tf.int32)
        noise = tf.random.stateless_normal(IMAGE_SHAPE, [seed, index * 3 + 2], stddev=NOISE_STDDEV)
        contrast = 0.7 + 0.6 * tf.random.stateless_uniform([], [seed + 1, index])
        image = tf.roll(tf.gather(templates, label), shift, axis=[0, 1]) * contrast + noise
        return {"image": tf.cast(tf.round(tf.clip_by_value(image, 0.0, 1.0) * 255.0), tf.uint8)}, label

    indices = tf.data.Dataset.range(first, first + count).shard(shard.count, shard.index)
    return indices.map(make, num_parallel_calls=tuning.PARALLEL_CALLS, deterministic=True)


def shard_description(cfg, split: str, shard) -> str:
    return generated_shard_description(cfg, split, shard, EVAL_EXAMPLES)
