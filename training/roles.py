"""One dispatch by task type for both front doors, trainer.py's flags and an Estimator program (TF1's
_TrainingExecutor.run_<task_type>): the evaluator runs outside the cluster; a task with no cluster trains
alone; a cluster task checks the addresses its server will serve before it listens, then a ps serves
(training/ps.py) and the chief, a master or a worker trains as its front door says. The job ends with its chief:
one that ends in a permanent error ends the ps tasks and the workers too (_train_replica).

Each role returns its exit code (training/exit_codes.py)."""

from collections.abc import Callable
from typing import NamedTuple

from absl import app
from absl import logging

from ps_trainer.cluster import allocator, guard, own_address, shutdown, spec
from ps_trainer.training import ending, exit_codes, ps


class Roles(NamedTuple):
    """What a front door runs for the roles that differ between doors."""
    # A training replica (chief, master, worker): (its server, or None with no cluster; the task's metrics).
    train: Callable[[object, object], int]
    evaluate: Callable[[], int]  # the evaluator
    # Every task but the evaluator, once its server listens: its metrics (training/metrics.py), served, or None.
    serve_metrics: Callable[[], object] = lambda: None


class ServingChecks(NamedTuple):
    """The checks of the addresses a task's server serves (the gRPC port has no authentication)."""
    allow_public_addresses: bool = False
    skip_own_address_check: bool = False


def run(cfg, roles: Roles, checks: ServingChecks) -> int:
    """Runs this task's role (cfg: training/config.RunConfig) to its exit code."""
    cluster = cfg.cluster
    if cluster.job_name == spec.EVALUATOR:
        return roles.evaluate()
    if not cluster.is_distributed:
        return roles.train(None, roles.serve_metrics())
    refuse_unsafe_serving(cluster, checks.allow_public_addresses, checks.skip_own_address_check)
    if cluster.job_name == spec.PS:  # before its server's threads exist
        settings = allocator.give_back_freed_memory()
        if settings:
            logging.info("ps %d: malloc gives freed memory back: %s", cluster.task_index, " ".join(settings))
    server = spec.start_server(cluster)
    task_metrics = roles.serve_metrics()
    if cluster.job_name == spec.PS:
        return ps.run(cfg, server)
    return _train_replica(cfg, lambda: roles.train(server, task_metrics))


def _train_replica(cfg, train: Callable[[], int]) -> int:
    """A training replica of a cluster, to train()'s exit code. A chief that ends in a permanent error leaves its
    reason in model_dir, and the ps tasks end with it (cluster/shutdown.py); a worker whose cluster then stops
    answering ends with that reason too, not as a transient ending that a restart would only repeat."""
    cluster, model_dir = cfg.cluster, cfg.train.model_dir
    if not model_dir:
        return train()
    if cluster.is_chief:
        shutdown.clear_chief_failed(model_dir)
    chief_failure = shutdown.ChiefFailure(model_dir)
    try:
        return train()
    except Exception as err:
        reason = ending.permanent_reason(err)
        if cluster.is_chief and reason is not None:
            shutdown.mark_chief_failed(model_dir, reason)
        failed = None if cluster.is_chief or reason is not None else chief_failure.reason()
        if failed is not None:
            raise ending.with_the_chief(cluster.task_name, failed) from None
        raise


def evaluates_while_training(cluster: spec.ClusterConfig) -> bool:
    """TF1's master (TF_CONFIG's older name of the chief) evaluates and exports as it trains."""
    return cluster.is_chief and cluster.chief_job == spec.MASTER and cluster.job_name != spec.EVALUATOR


def refuse_unsafe_serving(cluster, allow_public_addresses: bool, skip_own_address_check: bool) -> None:
    """Before this task's server listens on every interface: UsageError for a publicly routable
    cluster address (names are looked up here); a transient Failure for an address of this task that
    is not this host's or a port taken (on Kubernetes, a restarted pod's name can still resolve to its
    old address for a while)."""
    if not allow_public_addresses:
        public = guard.public_addresses(cluster)
        if public:
            raise app.UsageError(guard.refusal(public))
    if not skip_own_address_check:
        problem = own_address.problem(cluster)
        if problem:
            raise exit_codes.Failure(problem, exit_codes.OWN_ADDRESS)
