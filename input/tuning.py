"""Parallelism of every input pipeline.

Fixed instead of tf.data's autotuning: the autotuner's model thread wakes only on a timer that
grows toward a minute, and destroying the iterator (closing the session at the end of training)
waits for it, which cost seconds to tens of seconds on every exit. A ps/worker host is shared by
several tasks anyway, so a small fixed parallelism is what it should get.
"""

import tensorflow as tf

PARALLEL_CALLS = 2
PREFETCH_BATCHES = 2


def without_autotune(dataset: tf.data.Dataset) -> tf.data.Dataset:
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)
