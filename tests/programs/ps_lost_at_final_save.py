"""clicks_estimator.py's model and data, trained with a CheckpointSaverListener that SIGKILLs ps 0 as the chief's
final save begins (once, in the save of --train_steps or past it), for the drill of a ps lost in that save: the
process group that $KILL_PS_PGID names (the test's ps task), which the listener waits to see gone."""

import json
import os
import select
import signal

import tensorflow as tf
from absl import app, flags

import clicks_estimator  # its model_fn and input_fn, its flags, and the one line added

FLAGS = flags.FLAGS


class KillPsAtTheFinalSave(tf.compat.v1.train.CheckpointSaverListener):
    def __init__(self, pgid: int, last_step: int):
        self.pgid, self.last_step, self.killed = pgid, last_step, False

    def before_save(self, session, global_step_value):
        if self.killed or global_step_value < self.last_step:
            return
        self.killed = True
        gone = os.pidfd_open(self.pgid)  # readable once the process has ended
        os.killpg(self.pgid, signal.SIGKILL)
        readable, _, _ = select.select([gone], [], [], 60)
        os.close(gone)
        if not readable:
            raise RuntimeError(f"ps 0 (pid {self.pgid}) still running 60 s after its SIGKILL")
        print(f"killed ps 0 as the save of global step {global_step_value} began", flush=True)


def main(argv):
    del argv
    config = tf.estimator.RunConfig(model_dir=FLAGS.model_dir, save_checkpoints_steps=100, tf_random_seed=7)
    estimator = tf.estimator.Estimator(clicks_estimator.model_fn, config=config,
                                       params={"batch_size": 64, "learning_rate": 0.1})
    chief = json.loads(os.environ["TF_CONFIG"])["task"]["type"] == "chief"
    listeners = [KillPsAtTheFinalSave(int(os.environ["KILL_PS_PGID"]), FLAGS.train_steps)] if chief else []
    tf.estimator.train_and_evaluate(
        estimator, tf.estimator.TrainSpec(clicks_estimator.input_fn, max_steps=FLAGS.train_steps,
                                          saving_listeners=listeners),
        tf.estimator.EvalSpec(clicks_estimator.input_fn, steps=None, throttle_secs=1))


if __name__ == "__main__":
    app.run(main)
