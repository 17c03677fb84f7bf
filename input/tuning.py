"""Parallelism of every input pipeline.

Fixed instead of tf.data's autotuning: the autotuner's model thread wakes only on a timer that
grows toward a minute, and destroying the iterator (closing the session at the end of training)
waits for it, which cost seconds to tens of seconds on every exit. A ps/worker host is shared by
several tasks anyway, so a small fixed parallelism is what it should get.
"""

import functools

import tensorflow as tf

PARALLEL_CALLS = 2
PREFETCH_BATCHES = 2


def without_autotune(dataset: tf.data.Dataset) -> tf.data.Dataset:
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def pipeline(build):
    """A function that builds a dataset (a source's records(), batches()): its pipeline without the
    autotuner, and its functions (map, filter, interleave, flat_map) not converted by AutoGraph. They
    are graph code with no Python control flow on tensors: tf.data would have AutoGraph parse, transform
    and write a module to the temporary directory for each, about 0.15 s of every worker's start per
    pipeline, for nothing. Scripts and tests that read a source's records on their own get both too."""

    @functools.wraps(build)
    @tf.autograph.experimental.do_not_convert
    def built(*args, **kwargs):
        return without_autotune(build(*args, **kwargs))

    return built
