"""The ps role: serve variables until every worker has finished (or, once the chief has, left the job), until
the chief ended in a permanent error, or until SIGTERM/SIGINT."""

import signal
import threading

from absl import logging

from ps_trainer.cluster import shutdown
from ps_trainer.training import ending, exit_codes


def run(cfg, server) -> int:
    """Returns the process exit code: OK once all workers are done, PREEMPTED if a signal stopped it first; raises
    a permanent Failure (CHIEF_FAILED) once the chief ended in a permanent error short of its end."""
    cluster = cfg.cluster
    stop = threading.Event()

    def request_stop(signum, frame):
        logging.info("ps %d: %s received, stopping", cluster.task_index, signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    logging.info("ps %d: serving on %s for %d training replica(s)", cluster.task_index,
                 cluster.ps_hosts[cluster.task_index], cluster.num_replicas)
    roll = shutdown.wait_for_every_replica(server, cluster, cfg.train.model_dir, cfg.train.train_steps, stop,
                                           cfg.train.num_epochs, cfg.train.worker_gone_secs,
                                           cfg.train.startup_timeout_secs)
    if roll.chief_failed is not None:
        raise ending.with_the_chief(f"ps {cluster.task_index}", roll.chief_failed)
    if not roll.pending():
        left = f" (training replica(s) {sorted(roll.gone)} left the job)" if roll.gone else ""
        logging.info("ps %d: every training replica finished%s; exiting", cluster.task_index, left)
        return exit_codes.OK
    logging.info("ps %d: stopped before every training replica finished", cluster.task_index)
    return exit_codes.PREEMPTED
