"""The exit codes of trainer.py and the launchers, which orchestrators act on."""

import signal

OK = 0  # a worker reached --train_steps (and a ps served until every worker had); a launcher's cluster did
FAILED = 1  # an error, with its one-line reason: bad flags, bad data, a model not learning, a failed task
STALLED = 75  # EX_TEMPFAIL: no step for --stall_timeout_secs; a restart may succeed
INTERRUPTED = 128 + signal.SIGINT  # a launcher stopped by Ctrl-C or SIGTERM; it stopped every task it started
PREEMPTED = 128 + signal.SIGTERM  # stopped by SIGTERM: the chief checkpointed; a restart resumes
