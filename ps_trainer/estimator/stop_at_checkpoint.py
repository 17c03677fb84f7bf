"""tf.estimator.experimental.make_stop_at_checkpoint_step_hook: training that ends at a step the chief's checkpoint
holds. The chief's hook is TF's StopAtStepHook; another replica's ends its training once the global step reached
last_step and the latest checkpoint in the model_dir is at last_step or later (the chief saved it). Until then,
after each look at the checkpoint, it waits wait_after_file_check_secs before its next step, so that many
replicas do not read the directory at once.
"""

import time

import tensorflow as tf

v1 = tf.compat.v1


def make_stop_at_checkpoint_step_hook(estimator, last_step, wait_after_file_check_secs=30):
    """The chief's StopAtStepHook(last_step), or another replica's hook that stops once the chief's checkpoint
    is at last_step."""
    if estimator.config.is_chief:
        return v1.train.StopAtStepHook(last_step=last_step)
    return StopAtCheckpointStepHook(estimator.model_dir, last_step, wait_after_file_check_secs)


class StopAtCheckpointStepHook(v1.train.SessionRunHook):
    """Requests the stop once the global step reached last_step and model_dir's latest checkpoint holds
    last_step or later; each look that finds it short is followed by a wait of wait_after_file_check_secs."""

    sleep = staticmethod(time.sleep)  # the wait, which tests replace

    def __init__(self, model_dir, last_step, wait_after_file_check_secs=30):
        if last_step is None:
            raise ValueError("last_step must be specified.")
        if model_dir is None:
            raise ValueError("model_dir must be specified.")
        self._model_dir, self._last_step = model_dir, last_step
        self._wait_secs = wait_after_file_check_secs

    def begin(self):
        self._global_step = v1.train.get_global_step()
        if self._global_step is None:
            raise RuntimeError("Global step should be created to use StopAtCheckpointStepHook.")

    def before_run(self, run_context):
        return v1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        if run_values.results + 1 < self._last_step:
            return
        if checkpoint_step(self._model_dir) >= self._last_step:
            run_context.request_stop()
        else:
            self.sleep(self._wait_secs)


def checkpoint_step(model_dir) -> int:
    """The global step of model_dir's latest checkpoint (0 with none)."""
    checkpoint = tf.train.latest_checkpoint(model_dir)
    if checkpoint is None:
        return 0
    return int(tf.train.load_variable(checkpoint, v1.GraphKeys.GLOBAL_STEP))
