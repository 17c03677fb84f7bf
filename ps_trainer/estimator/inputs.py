"""tf.estimator.inputs: input_fns over numpy arrays and pandas frames, with TF1's arguments and results
(features, or (features, labels), as tensors; the last batch of an epoch may be short). TF1 fed them
through queues and queue runners; here they come from tf.data (the shuffle buffer is queue_capacity
examples), so an input that fails is an error, never a queue closed as if the data had ended; a lever
(PS_TRAINER_FLAGS), which reads several batches a session.run, reads that tf.data.Dataset (AS_DATASET). The
arrays are held in the graph: for data larger than about 2 GB, read files with tf.data instead."""

import numpy as np
import tensorflow as tf

v1 = tf.compat.v1
# The attribute of these input_fns that gives their data as a tf.data.Dataset of (features, labels): what a lever
# reads several batches a session.run of (training/step/taken.py), where the input_fn's tensors give one.
AS_DATASET = "ps_trainer_as_dataset"


def _checked_length(arrays: dict) -> int:
    lengths = {name: len(array) for name, array in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"numpy_input_fn: the arrays differ in length: {lengths}")
    if not lengths:
        raise ValueError("numpy_input_fn: x holds no arrays")
    return next(iter(lengths.values()))


def numpy_input_fn(x, y=None, batch_size=128, num_epochs=1, shuffle=None, queue_capacity=1000, num_threads=1):
    """An input_fn of x (a dict of arrays, or one array) and y (an array, a dict of arrays, or None),
    `num_epochs` times over (None: forever), in batches of `batch_size`, shuffled when `shuffle`."""
    if not isinstance(shuffle, bool):
        raise ValueError(f"shuffle must be provided and explicitly set as boolean (it is {shuffle!r}).")
    if isinstance(x, dict) and isinstance(y, dict) and set(x) & set(y):
        raise ValueError(f"{sorted(set(x) & set(y))} in both x and y")
    del num_threads  # tf.data's own threads

    def dataset():
        features = dict(x) if isinstance(x, dict) else {"__x": x}
        labels = None if y is None else (dict(y) if isinstance(y, dict) else {"__y": y})
        arrays = {**{("x", k): np.asarray(v) for k, v in features.items()},
                  **{("y", k): np.asarray(v) for k, v in (labels or {}).items()}}
        _checked_length({f"{side}:{name}": array for (side, name), array in arrays.items()})
        examples = tf.data.Dataset.from_tensor_slices({f"{side}/{name}": array
                                                       for (side, name), array in arrays.items()})
        if shuffle:
            examples = examples.shuffle(queue_capacity, reshuffle_each_iteration=True)

        def split(batch):
            got_x = {name: batch[f"x/{name}"] for name in features}
            got_y = None if labels is None else {name: batch[f"y/{name}"] for name in labels}
            got_x = got_x["__x"] if not isinstance(x, dict) else got_x
            if got_y is None:
                return got_x
            return got_x, (got_y["__y"] if not isinstance(y, dict) else got_y)

        return examples.repeat(num_epochs).batch(batch_size).map(split)

    def input_fn():
        return v1.data.make_one_shot_iterator(dataset()).get_next()

    setattr(input_fn, AS_DATASET, dataset)
    return input_fn


def pandas_input_fn(x, y=None, batch_size=128, num_epochs=1, shuffle=None, queue_capacity=1000, num_threads=1,
                    target_column="target"):
    """An input_fn of a pandas DataFrame's columns (features) and a Series or DataFrame (labels)."""
    if y is not None and target_column in x:
        raise ValueError(f"Cannot use name {target_column} for target column: DataFrame already has a column with "
                         "that name")
    if y is not None and len(x) != len(y):
        raise ValueError(f"x has {len(x)} rows and y {len(y)}")
    features = {name: x[name].to_numpy() for name in x.columns}
    labels = None
    if y is not None:
        labels = ({name: y[name].to_numpy() for name in y.columns} if hasattr(y, "columns") else y.to_numpy())
    return numpy_input_fn(features, labels, batch_size, num_epochs, shuffle, queue_capacity, num_threads)
