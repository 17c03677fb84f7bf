"""The embedded default dataset: 28x28x1 images of 10 classes, generated from --seed.

Each class has a prototype made of a few soft strokes; an example is its class prototype, shifted by
up to three pixels, scaled in contrast and covered in noise. The examples are made in blocks of
BLOCK, each block a pure function of (seed, split, its number), computed by stateless random ops, so
any worker can produce exactly its own shard (every count-th block) with no download and no large
constant in the graph.
"""

import numpy as np
import tensorflow as tf

from ps_trainer.input import packing, tuning
from ps_trainer.input.specs import DataSpec

KIND = "generated"
MULTI_VALUED = ()  # no multi-valued columns

IMAGE_SHAPE = (28, 28, 1)
NUM_CLASSES = 10
EVAL_EXAMPLES = 2000
NOISE_STDDEV = 0.6
MAX_SHIFT = 3
# Examples made at once, and a worker's unit of its shard: one block's random numbers are drawn
# together, its images made with a handful of ops (one example at a time cost a worker ~3 s of CPU
# per 30,000).
BLOCK = 64


def check(data_cfg):
    return None


def spec(data_cfg):
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


@tuning.pipeline
def blocks(data_cfg, split: str, shard) -> tf.data.Dataset:
    """Blocks of ({'image': uint8 images}, int64 labels) of `split`, only the blocks of `shard`."""
    count = data_cfg.synthetic_examples if split == "train" else EVAL_EXAMPLES
    stream = 0 if split == "train" else 1  # the split's own random numbers: no example in both
    templates = tf.constant(prototypes(data_cfg.seed))
    seed = data_cfg.seed

    def make(block):
        def seed_of(part):  # a block's own stream of each of its four draws
            return tf.stack([tf.constant(seed, tf.int64), block * 8 + stream * 4 + part])

        size = tf.minimum(tf.constant(BLOCK, tf.int64), count - block * BLOCK)
        label = tf.random.stateless_uniform([size], seed_of(0), minval=0, maxval=NUM_CLASSES, dtype=tf.int64)
        shift = tf.random.stateless_uniform([size, 2], seed_of(1), minval=-MAX_SHIFT, maxval=MAX_SHIFT + 1,
                                            dtype=tf.int32)
        shape = tf.concat([[size], tf.constant(IMAGE_SHAPE, tf.int64)], 0)
        noise = tf.random.stateless_normal(shape, seed_of(2), stddev=NOISE_STDDEV)
        contrast = 0.7 + 0.6 * tf.random.stateless_uniform([size, 1, 1, 1], seed_of(3))
        image = tf.gather(templates, label)
        for axis in (1, 2):  # each template rolled by its example's shift: pixel i comes from i - shift
            source = (tf.range(IMAGE_SHAPE[axis - 1])[None, :] - shift[:, axis - 1:axis]) % IMAGE_SHAPE[axis - 1]
            image = tf.gather(image, source, axis=axis, batch_dims=1)
        image = image * contrast + noise
        return {"image": tf.cast(tf.round(tf.clip_by_value(image, 0.0, 1.0) * 255.0), tf.uint8)}, label

    numbers = tf.data.Dataset.range(-(-count // BLOCK)).shard(shard.count, shard.index)
    return numbers.map(make, num_parallel_calls=tuning.PARALLEL_CALLS, deterministic=True)


records = packing.unbatched(blocks)


def shard_description(data_cfg, split: str, shard) -> str:
    count = data_cfg.synthetic_examples if split == "train" else EVAL_EXAMPLES
    every = f"blocks {shard.index}, {shard.index + shard.count}, ... of {BLOCK} examples of" if shard.count > 1 \
        else "all"
    return f"{every} {count} generated from seed {data_cfg.seed}"
