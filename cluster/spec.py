"""The cluster as plain values, and the TensorFlow objects built from it."""

import dataclasses

import tensorflow as tf

PS, WORKER = "ps", "worker"


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """Who is in the cluster and which task this process is.

    `job_name` None means no cluster at all: training in this one process.
    """

    ps_hosts: tuple[str, ...] = ()
    worker_hosts: tuple[str, ...] = ()
    job_name: str | None = None
    task_index: int = 0

    @property
    def is_distributed(self) -> bool:
        return self.job_name is not None

    @property
    def num_workers(self) -> int:
        return max(1, len(self.worker_hosts))

    @property
    def num_ps(self) -> int:
        return len(self.ps_hosts)

    @property
    def is_chief(self) -> bool:
        return self.job_name in (None, WORKER) and self.task_index == 0

    @property
    def task_name(self) -> str:
        return f"{self.job_name or 'local'}:{self.task_index}"

    def cluster_spec(self) -> tf.train.ClusterSpec:
        return tf.train.ClusterSpec({PS: list(self.ps_hosts), WORKER: list(self.worker_hosts)})

    def worker_device(self) -> str:
        return f"/job:{WORKER}/task:{self.task_index}"


def split_host_port(address: str) -> tuple[str, int]:
    """'host:port' or '[v6]:port' -> (host, port). Raises ValueError saying what is wrong."""
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise ValueError(f"'{address}' is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or any(c.isspace() for c in host):
        raise ValueError(f"'{address}' has an empty or malformed host")
    if not port.isdigit():
        raise ValueError(f"'{address}' has a non-numeric port '{port}'")
    number = int(port)
    if not 1 <= number <= 65535:
        raise ValueError(f"'{address}' has port {number}, outside 1..65535")
    return host, number


def session_config(cluster: ClusterConfig) -> tf.compat.v1.ConfigProto:
    """Session options for this task.

    device_filters make a task see only the devices it talks to: a worker sees every ps and itself,
    never another worker, so no worker waits for another to come up; a ps sees only itself.
    """
    config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
    if cluster.job_name == WORKER:
        config.device_filters[:] = [f"/job:{PS}", cluster.worker_device()]
    elif cluster.job_name == PS:
        config.device_filters[:] = [f"/job:{PS}/task:{cluster.task_index}"]
    return config


def start_server(cluster: ClusterConfig) -> tf.distribute.Server:
    return tf.compat.v1.train.Server(
        cluster.cluster_spec(),
        job_name=cluster.job_name,
        task_index=cluster.task_index,
        config=session_config(cluster),
        start=True,
    )
