"""What an Estimator program's input_fn gives, as training, evaluation and prediction read it: a tf.data.Dataset
(its iterator initialized in each new session) or its tensors, (features, labels) or features alone."""

from typing import Callable, NamedTuple

import tensorflow as tf

v1 = tf.compat.v1


class IteratorInitializer(v1.train.SessionRunHook):
    """Initializes input_fn's dataset iterator in each new session."""

    def __init__(self, iterator):
        self._iterator = iterator

    def after_create_session(self, session, coord):
        session.run(self._iterator.initializer)


class Input(NamedTuple):
    """What input_fn gave: () -> (features, labels) of its next batch (a tf.data.Dataset's next element, built
    anew at each call; else its tensors), and the hooks it needs."""
    next_batch: Callable
    hooks: list
    dataset: bool  # input_fn returned a tf.data.Dataset


def of(result) -> Input:
    """input_fn's result, a tf.data.Dataset or (features, labels) or features."""
    if isinstance(result, tf.data.Dataset):
        iterator = v1.data.make_initializable_iterator(result)
        return Input(lambda: features_and_labels(iterator.get_next()), [IteratorInitializer(iterator)], True)
    return Input(lambda: features_and_labels(result), [], False)


def features_and_labels(result):
    """(features, labels) of one element of input_fn's data: (features, labels) or features alone."""
    if isinstance(result, (tuple, list)):
        if len(result) != 2:
            raise ValueError(f"input_fn must give features or (features, labels), not {len(result)} items")
        return result[0], result[1]
    return result, None
