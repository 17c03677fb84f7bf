"""ps-trainer: one script for every host of a TensorFlow parameter-server cluster.

    python trainer.py --ps_hosts=h0:2222 --worker_hosts=h1:2222,h2:2222 --job_name=ps --task_index=0
    python trainer.py --ps_hosts=h0:2222 --worker_hosts=h1:2222,h2:2222 --job_name=worker \
        --task_index=0 --model_dir=/shared/run1

With no --job_name and no host lists it trains in this one process.
"""

import tensorflow as tf
from absl import app, logging
from absl.flags import FLAGS

from cluster import spec
from flags import config as flag_config
from flags import definitions  # noqa: F401  (defines every flag)
from training import ps, worker


def main(argv):
    cfg = flag_config.read(FLAGS, argv)
    tf.compat.v1.disable_eager_execution()
    # TensorFlow's logger has a handler of its own besides absl's: every line would print twice.
    tf.get_logger().handlers.clear()
    cluster = cfg.cluster
    if not cluster.is_distributed:
        logging.info("no cluster given: training in this one process")
        return run_worker(cfg, server=None)
    logging.info("cluster: ps=%s worker=%s; this task: %s%s", ",".join(cluster.ps_hosts),
                 ",".join(cluster.worker_hosts), cluster.task_name, " (chief)" if cluster.is_chief else "")
    server = spec.start_server(cluster)
    if cluster.job_name == spec.PS:
        return ps.run(cfg, server)
    return run_worker(cfg, server)


def run_worker(cfg, server):
    try:
        worker.run(cfg, server)
    except worker.TrainingError as err:
        logging.error("%s", err)
        return 1
    return 0


if __name__ == "__main__":
    app.run(main)
