"""What the fault drills read from a run's model directory with TensorFlow: the registered checkpoint,
whether it restores, the files of a save in progress, the input queue's audit. launch/faults.py and
launch/chaos.py call them through launch.forked.call_with_tensorflow, so that a drill script that
forks its tasks from the preloaded server never imports TensorFlow itself."""

import glob

import numpy as np
import tensorflow as tf

from ps_trainer.cluster import model_dir as layout
from ps_trainer.training import checkpoints, queue_hook


def registered_step(model_dir: str) -> int | None:
    """The step of the latest checkpoint in the state file, or None before the first."""
    state = tf.compat.v1.train.get_checkpoint_state(model_dir)
    if state is None or not state.model_checkpoint_path:
        return None
    return int(state.model_checkpoint_path.rpartition("-")[2])


def restorable_step(model_dir: str) -> int | None:
    """Reads every tensor of the latest checkpoint; its global step, or None if any cannot be read."""
    try:
        reader = tf.train.load_checkpoint(model_dir)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
        return int(reader.get_tensor("global_step"))
    except (tf.errors.OpError, ValueError):
        return None


def save_leftovers(model_dir: str) -> int:
    """Files of a save in progress or never completed: written, but not (yet) in the state file."""
    try:
        return len(checkpoints.unfinished_save_files(model_dir))
    except tf.errors.OpError:  # the state file was being replaced as we read it
        return 1


def count_audit(model_dir: str) -> dict:
    """{epoch: [distinct examples, examples trained more than once, trained in all]} from every
    worker's --input_queue_audit file under model_dir (empty without one)."""
    paths = sorted(glob.glob(layout.audit_file(model_dir, "*")))
    if not paths:
        return {}
    trained = np.concatenate([queue_hook.read_audit(path) for path in paths])
    counts = {}
    for epoch in np.unique(trained[:, 0]).tolist():
        _, times = np.unique(trained[trained[:, 0] == epoch, 1:], axis=0, return_counts=True)
        counts[epoch] = [int(times.size), int((times > 1).sum()), int(times.sum())]
    return counts
