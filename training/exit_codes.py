"""The exit codes of trainer.py and the launchers: one table of outcomes, which orchestrators act on.

Every ending is done (exit 0: the global step reached --train_steps), permanent (a rerun fails the
same way until someone changes the flags, the data or the model) or transient (a restart may
succeed, and resumes from the latest checkpoint). Transient outcomes exit with codes that
Kubeflow's `restartPolicy: ExitCode` retries (130, 137, 143 and 138, the code it reserves for
"user-defined retryable"); every permanent one exits 1, which that policy does not retry. The
one-line reason in the log says which outcome it was. docs/engines.md shows what Kubeflow, a
Kubernetes Job's podFailurePolicy and scripts/slurm/train.sbatch do with each.
"""

import signal
from typing import NamedTuple

DONE, PERMANENT, TRANSIENT = "done", "permanent", "transient"

OK = 0
FAILED = 1
RETRY = 128 + signal.SIGUSR1  # 138: Kubeflow's "user-defined retryable" code
INTERRUPTED = 128 + signal.SIGINT  # 130
KILLED = 128 + signal.SIGKILL  # 137: never ours (the kernel's OOM killer, a kubelet's last resort)
PREEMPTED = 128 + signal.SIGTERM  # 143

# The exit codes Kubeflow's ExitCode restart policy retries (its IsRetryableExitCode).
KUBEFLOW_RETRYABLE = frozenset({INTERRUPTED, KILLED, RETRY, PREEMPTED})


class Outcome(NamedTuple):
    code: int
    kind: str
    meaning: str


TRAINED = Outcome(OK, DONE, "a worker reached --train_steps; a ps served until every worker had")
BAD_FLAGS = Outcome(FAILED, PERMANENT, "bad flags or cluster description (absl's usage error)")
BAD_DATA = Outcome(FAILED, PERMANENT, "an input record that cannot be read or parsed, without --skip_bad_records")
NON_FINITE_LOSS = Outcome(FAILED, PERMANENT, "the loss became NaN or Inf (the last checkpoint is the last good one)")
TABLE_FULL = Outcome(FAILED, PERMANENT, "a dynamic embedding table holds --embedding_capacity rows and met a new ID")
NOT_LEARNING = Outcome(FAILED, PERMANENT, "stopped as not learning (--not_learning=stop)")
INPUT_ENDED = Outcome(FAILED, PERMANENT, "the input ended again and again short of --train_steps")
ERROR = Outcome(FAILED, PERMANENT, "an error with no known cause (a traceback)")
MODEL_FN_BROKEN = Outcome(FAILED, PERMANENT, "--model_fn's function breaks its contract (a train_op of its own, no "
                          "loss, no logits)")
STALLED = Outcome(RETRY, TRANSIENT, "no step for --stall_timeout_secs (a sync peer or a ps down)")
PS_UNREACHABLE = Outcome(RETRY, TRANSIENT, "a ps task did not listen within --startup_timeout_secs")
CHIEF_NOT_READY = Outcome(RETRY, TRANSIENT, "the chief did not initialize the variables within --startup_timeout_secs")
CLUSTER_UNAVAILABLE = Outcome(RETRY, TRANSIENT, "a task of the cluster stopped answering (TensorFlow's "
                              "Unavailable, DeadlineExceeded or Aborted reached the top)")
OWN_ADDRESS = Outcome(RETRY, TRANSIENT, "this task's address is not this host's, or its port is taken (DNS not yet "
                      "updated for a restarted pod, or the previous process still exiting)")
CHECKPOINT_NOT_SAVED = Outcome(RETRY, TRANSIENT, "checkpoint saves failed for space or permissions "
                               "(training/checkpoints.MAX_FAILED_SAVES in a row, or the final one)")
CHECKPOINT_UNREADABLE = Outcome(FAILED, PERMANENT, "no checkpoint in --model_dir can be read (each is corrupt, "
                                "truncated or from another model)")
RUN_RECORD_UNREADABLE = Outcome(FAILED, PERMANENT, "--model_dir's run.json is not a run record (not JSON, or no "
                                "model settings in it)")
TRAINED_MODEL_GONE = Outcome(FAILED, PERMANENT, "the chief's done mark says training finished, but no checkpoint of "
                             "that step is left in --model_dir")
MODEL_DIR_IN_USE = Outcome(FAILED, PERMANENT, "the chief of another run still trains in --model_dir (its "
                           "chief.json names it)")
CHIEF_FAILED = Outcome(FAILED, PERMANENT, "a ps or worker: the chief ended in a permanent error short of the end "
                       "(its done/chief-failed mark in --model_dir names it)")
NO_CHECKPOINT_TO_EVALUATE = Outcome(RETRY, TRANSIENT, "the evaluator saw no new checkpoint for --eval_timeout_secs")
DOWNLOAD_FAILED = Outcome(FAILED, PERMANENT, "--download_only could not fetch the dataset")
PREEMPTED_BY_SIGNAL = Outcome(PREEMPTED, TRANSIENT, "SIGTERM: the chief checkpointed its step; a restart resumes")
LAUNCHER_INTERRUPTED = Outcome(INTERRUPTED, TRANSIENT, "a launcher stopped by Ctrl-C; it stopped every task it started")

OUTCOMES = (TRAINED, BAD_FLAGS, BAD_DATA, NON_FINITE_LOSS, TABLE_FULL, NOT_LEARNING, INPUT_ENDED, ERROR,
            MODEL_FN_BROKEN, STALLED, PS_UNREACHABLE, CHIEF_NOT_READY, CLUSTER_UNAVAILABLE, OWN_ADDRESS,
            CHECKPOINT_NOT_SAVED,
            CHECKPOINT_UNREADABLE, RUN_RECORD_UNREADABLE, TRAINED_MODEL_GONE, MODEL_DIR_IN_USE, CHIEF_FAILED,
            NO_CHECKPOINT_TO_EVALUATE, DOWNLOAD_FAILED, PREEMPTED_BY_SIGNAL, LAUNCHER_INTERRUPTED)


def kind(code: int) -> str:
    """The class of an exit code, as an orchestrator must read it (137, the kernel's, is transient)."""
    if code == OK:
        return DONE
    return TRANSIENT if code in KUBEFLOW_RETRYABLE else PERMANENT


class Failure(Exception):
    """An ending reported in one line (the message), with the outcome that gives its exit code."""

    def __init__(self, message: str, outcome: Outcome = ERROR):
        super().__init__(message)
        self.outcome = outcome
