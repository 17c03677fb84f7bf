"""The trainer's main, which trainer.py (in a checkout) and `python -m ps_trainer.trainer` (installed) run on
every host of a TensorFlow parameter-server cluster: the flags or the environment say the cluster and
this task's role (ps, worker, chief, evaluator), and the role runs to its exit code."""

import os

from ps_trainer.tf_loading import keras_hidden, startup_notices_dropped

with startup_notices_dropped(show_all=os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "0"), keras_hidden():
    import tensorflow as tf
    from absl import app, logging
    from absl.flags import FLAGS

    from ps_trainer.cluster import spec
    from ps_trainer.flags import config as flag_config
    from ps_trainer.flags import definitions
    from ps_trainer import input as inputs
    from ps_trainer.input import download
    from ps_trainer.training import ending, evaluator, exit_codes, metrics, roles, start, worker

definitions.define(FLAGS)


def main(argv):
    """Runs this task's role; returns its exit code (training/exit_codes.py: done, permanent or
    transient), with the one-line reason logged."""
    return ending.exit_code_of(lambda: run_role(argv))


def run_role(argv):
    if FLAGS.download_only:
        return download_only(FLAGS.data_dir)
    cfg = start.settle(flag_config.read(FLAGS, argv, os.environ))
    tf.compat.v1.disable_eager_execution()
    # TensorFlow's logger has a handler of its own besides absl's: every line would print twice.
    tf.get_logger().handlers.clear()
    cluster = cfg.cluster
    logging.info("cluster from %s: %s", cfg.cluster_source, describe(cluster))
    return roles.run(cfg, roles.Roles(train=lambda server, task_metrics: worker.run(cfg, server, task_metrics),
                                      evaluate=lambda: run_evaluator(cfg), serve_metrics=lambda: serve_metrics(cfg)),
                     roles.ServingChecks(FLAGS.allow_public_addresses, FLAGS.skip_own_address_check))


def run_evaluator(cfg) -> int:
    """The evaluator task (--job_name=evaluator): follows the chief's checkpoints until the last."""
    try:
        evaluator.run(cfg)
    except evaluator.EvaluationTimeout as err:
        raise exit_codes.Failure(str(err), exit_codes.NO_CHECKPOINT_TO_EVALUATE) from None
    except tf.errors.InvalidArgumentError as err:
        bad_record = inputs.bad_record_message(err.message)
        if bad_record is None:
            raise
        raise exit_codes.Failure(f"evaluator: {bad_record} (the held-out data; --skip_bad_records skips such "
                                 "records)", exit_codes.BAD_DATA) from None
    return exit_codes.OK


def serve_metrics(cfg):
    """This task's metrics (training/metrics.py), served if --metrics_port is set."""
    try:
        return metrics.serve(cfg.cluster, cfg.train.metrics_port)
    except OSError as err:
        raise exit_codes.Failure(f"--metrics_port={cfg.train.metrics_port}: cannot serve metrics on this task's "
                                 f"host: {err.strerror}", exit_codes.OWN_ADDRESS) from None


def download_only(data_dir) -> int:
    if not data_dir:
        raise app.UsageError("--download_only needs --data_dir: the directory to put MNIST's files in")
    try:
        fetched = download.download(data_dir)
    except download.DownloadError as err:
        raise exit_codes.Failure(str(err), exit_codes.DOWNLOAD_FAILED) from None
    logging.info("MNIST is in %s (%d file(s) downloaded); train with --data_dir=%s", data_dir, len(fetched), data_dir)
    return exit_codes.OK


def describe(cluster) -> str:
    if cluster.job_name is None:
        return "no cluster; training in this one process"
    jobs = [f"{name}={','.join(hosts)}" for name, hosts in
            (("ps", cluster.ps_hosts), (cluster.chief_job, cluster.chief_hosts), ("worker", cluster.worker_hosts))
            if hosts]
    role = "evaluator (outside the cluster)" if cluster.job_name == spec.EVALUATOR else cluster.task_name
    joins = f" at {cluster.join_address}, joining the running job" if cluster.joins else ""
    return f"{' '.join(jobs)}; this task: {role}{' (chief)' if cluster.is_chief else ''}{joins}"


def parse_flags(argv):
    if "SM_HOSTS" in os.environ:  # SageMaker passes hyperparameters as '--name value'
        argv = flag_config.join_separate_bool_values(argv, FLAGS)
    return app.parse_flags_with_usage(argv)


def run() -> None:
    """Runs main on the command line's flags and exits with its code."""
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    run()
