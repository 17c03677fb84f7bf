"""Every path under --model_dir, the directory every task of a cluster shares, named here and nowhere else.

    <model_dir>/
      checkpoint, model.ckpt-<step>.*        the Saver's state file and checkpoints (MonitoredTrainingSession)
      model.ckpt-<full>-delta-<step>.*       incremental checkpoints (training/incremental.py)
      run.json                               what the run trains (training/run_record.py)
      chief.json                             which chief trains here (training/chief_claim.py)
      input_queue_files.json                 the files the input queue's epochs are of (input/work_queue.py)
      done/replica-<i>                       a replica's mark that it finished (cluster/shutdown.py)
      done/chief-failed                      the chief's mark that it ended in a permanent error (cluster/shutdown.py)
      members/replica-<i>                    a worker that joined the running job (cluster/shutdown.py)
      workers/<task>/                        a worker's summaries; trained_examples.bin (--input_queue_audit)
      profile/<task>/                        TensorBoard profiles (--profile_steps)
      eval/, eval_<name>/                    the evaluator's summaries
      export/<step>/, export/<exporter>/     SavedModels
      run.png                                scripts/plot_run.py's figure

Each function takes model_dir and returns a path; none touches the disk.
"""

import os

CHECKPOINT_PREFIX = "model.ckpt"  # MonitoredTrainingSession's, and tf.estimator's
CHECKPOINT_STATE = "checkpoint"  # the Saver's state file, which names the checkpoints (tf.train.get_checkpoint_state)
RUN_RECORD = "run.json"
CHIEF_CLAIM = "chief.json"
QUEUE_FILES = "input_queue_files.json"
DONE = "done"
MEMBERS = "members"
REPLICA = "replica-"  # a file of done/ or members/: replica-<index>
CHIEF_FAILED = "chief-failed"
WORKERS = "workers"
AUDIT = "trained_examples.bin"
PROFILE = "profile"
EVAL = "eval"
EXPORT = "export"
PLOT = "run.png"


def checkpoint_state(model_dir: str) -> str:
    return os.path.join(model_dir, CHECKPOINT_STATE)


def run_record(model_dir: str) -> str:
    return os.path.join(model_dir, RUN_RECORD)


def chief_claim(model_dir: str) -> str:
    return os.path.join(model_dir, CHIEF_CLAIM)


def queue_files(model_dir: str) -> str:
    return os.path.join(model_dir, QUEUE_FILES)


def done_dir(model_dir: str) -> str:
    return os.path.join(model_dir, DONE)


def done_mark(model_dir: str, replica: int) -> str:
    return os.path.join(model_dir, DONE, f"{REPLICA}{replica}")


def chief_failed(model_dir: str) -> str:
    return os.path.join(model_dir, DONE, CHIEF_FAILED)


def members_dir(model_dir: str) -> str:
    return os.path.join(model_dir, MEMBERS)


def member(model_dir: str, replica: int) -> str:
    return os.path.join(model_dir, MEMBERS, f"{REPLICA}{replica}")


def replica_of(name: str) -> int | None:
    """The replica index a file of done/ or members/ is named for; None for another file (one being written)."""
    index = name.removeprefix(REPLICA)
    return int(index) if name.startswith(REPLICA) and index.isdigit() else None


def worker_dir(model_dir: str, task_dir: str) -> str:
    """A training task's summaries (task_dir: cluster.spec.ClusterConfig.task_dir, e.g. worker_1)."""
    return os.path.join(model_dir, WORKERS, task_dir)


def audit_file(model_dir: str, task_dir: str) -> str:
    return os.path.join(model_dir, WORKERS, task_dir, AUDIT)


def profile_dir(model_dir: str, task_dir: str) -> str:
    return os.path.join(model_dir, PROFILE, task_dir)


def eval_dir(model_dir: str, name: str | None = None) -> str:
    """The evaluator's summaries; a named evaluation (tf.estimator's `name`) has a directory of its own."""
    return os.path.join(model_dir, f"{EVAL}_{name}" if name else EVAL)


def export_dir(model_dir: str, version: int | str) -> str:
    """A SavedModel: the trainer's at the step of its checkpoint, an Estimator exporter's under its name."""
    return os.path.join(model_dir, EXPORT, str(version))


def plot(model_dir: str) -> str:
    return os.path.join(model_dir, PLOT)
