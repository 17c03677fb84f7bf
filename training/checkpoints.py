"""The chief's checkpoints: restored only when the ps tasks lost the training state, and the leftovers
of saves that never completed, cleared before it starts.

A save writes each ps's shard under <prefix>_temp/, merges them into <prefix>.index and
<prefix>.data-*, and only then registers <prefix> in the 'checkpoint' state file (written to a
temporary name and renamed). A chief killed part-way leaves files that no state file lists: they
can never be restored, and the Saver would never delete them, so --keep_checkpoint_max would stop
holding. Only the chief saves, so before it starts no save can be in progress.
"""

import os
import re

import tensorflow as tf
from absl import logging

CHECKPOINT_FILE = re.compile(r"^(model\.ckpt-\d+)(?:_temp.*|\.index|\.data-.*|\.meta)$")
STATE_TEMP_FILE = re.compile(r"^checkpoint\.tmp[0-9a-f]*$")
# A graph collection: ops the chief runs after it restores a checkpoint (state that is no checkpoint's
# and that a restore makes wrong, such as the sync round each worker last pushed a gradient for).
RESET_AFTER_RESTORE = "ps_trainer_reset_after_restore"


def registered_prefixes(model_dir: str) -> set[str]:
    state = tf.train.get_checkpoint_state(model_dir)
    if state is None:
        return set()
    paths = {state.model_checkpoint_path, *state.all_model_checkpoint_paths}
    return {os.path.basename(path) for path in paths if path}


def unfinished_save_files(model_dir: str) -> list[str]:
    """Names of checkpoint files and temporaries in model_dir that the state file does not list."""
    if not tf.io.gfile.isdir(model_dir):
        return []
    keep = registered_prefixes(model_dir)
    names = [name.rstrip("/") for name in tf.io.gfile.listdir(model_dir)]
    return sorted(name for name in names if STATE_TEMP_FILE.match(name) or (
        CHECKPOINT_FILE.match(name) and CHECKPOINT_FILE.match(name).group(1) not in keep))


def remove_interrupted_saves(model_dir: str, task_name: str) -> list[str]:
    """Removes checkpoint files and temporaries that the state file does not list; returns their names."""
    removed = unfinished_save_files(model_dir)
    for name in removed:
        path = os.path.join(model_dir, name)
        if tf.io.gfile.isdir(path):
            tf.io.gfile.rmtree(path)
        else:
            tf.io.gfile.remove(path)
    if removed:
        logging.warning("%s: removed %d file(s) of checkpoint saves that never completed (none was "
                        "registered in %s/checkpoint): %s", task_name, len(removed), model_dir,
                        ", ".join(removed))
    return removed


def report_uninitialized() -> tf.Tensor:
    """The names of the global variables not initialized yet (on the ps): what a restarted ps lacks."""
    uninitialized = tf.compat.v1.report_uninitialized_variables(tf.compat.v1.global_variables())
    uninitialized.mark_used()  # a non-chief's wait for the chief runs it, and a chief's restore; not both
    return uninitialized


class LiveStateSaver(tf.compat.v1.train.Saver):
    """The chief's saver: restores the latest checkpoint only when a ps task lacks its variables.

    A chief that restarts while every ps task kept running finds the training state there, newer
    than any checkpoint. TensorFlow's SessionManager would restore the checkpoint over it, moving
    the global step back: the steps trained since are lost and trained again, and in sync mode the
    rounds are numbered anew under workers that hold tokens and accumulators of the later rounds
    (the accumulators keep gradients of rounds that no longer exist). Keeping the live state loses
    nothing and leaves the global step, the accumulators and the token queue consistent. When any
    variable is uninitialized (a ps task restarted) everything is restored from the checkpoint, so
    every variable comes from one step.
    """

    def __init__(self, uninitialized, *args, **kwargs):
        """uninitialized: report_uninitialized() of this graph."""
        super().__init__(*args, **kwargs)
        self._uninitialized = uninitialized
        self._global_step = tf.compat.v1.train.get_global_step()

    def restore(self, sess, save_path):
        if save_path is None or len(sess.run(self._uninitialized)):
            restored = super().restore(sess, save_path)
            for reset in tf.compat.v1.get_collection(RESET_AFTER_RESTORE):
                sess.run(reset)
            return restored
        logging.info("the ps tasks hold every variable already, at global step %d: training goes on from "
                     "there (not restoring %s, which is no newer)", sess.run(self._global_step), save_path)
        return None
