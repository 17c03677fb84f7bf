"""The cluster as plain values, and the TensorFlow objects built from it.

TensorFlow is imported by the three functions that build its objects, not with this module: the
launchers (scripts/run_ssh.py) read the jobs and addresses from here without the seconds of CPU of
`import tensorflow`.
"""

from __future__ import annotations

import dataclasses
import os
import typing

if typing.TYPE_CHECKING:
    import tensorflow as tf

PS, WORKER, CHIEF, MASTER, EVALUATOR = "ps", "worker", "chief", "master", "evaluator"
CHIEF_JOBS = (CHIEF, MASTER)
# The job a joining worker's server starts as. Its sessions name it worker K (their ClusterDef), and
# TensorFlow refuses a session ClusterDef that names the server by the job and task it started as.
JOINING = "joining"
# Training replicas (chief and workers, joiners included) the input queue's per-replica state holds.
MAX_REPLICAS = 1024


def canonical_job(name: str | None) -> str | None:
    """A job's name as the trainer uses it: 'master' (TF_CONFIG's and SageMaker's old name) is 'chief'."""
    return CHIEF if name == MASTER else name


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """Who is in the cluster and which task this process is.

    The training replicas are the chief task (if the cluster has a `chief` or `master` job) and then
    every worker; the first replica is the chief. `job_name` None means no cluster at all: training
    in this one process. An evaluator is outside the training cluster: it starts no server and no
    training task waits for it.
    """

    ps_hosts: tuple[str, ...] = ()
    worker_hosts: tuple[str, ...] = ()
    job_name: str | None = None
    task_index: int = 0
    chief_hosts: tuple[str, ...] = ()
    chief_job: str = CHIEF  # the name the cluster's own TF_CONFIG gives it: 'chief' or 'master'
    # --num_gpus: None leaves placement to TensorFlow; 0 keeps a worker on its CPU; N puts its compute
    # on GPU task_index % N of its host (one task per GPU). A ps never uses a GPU.
    num_gpus: int | None = None
    # A worker joining a running async job (--join_address): its own host:port; its --task_index is
    # past worker_hosts, which stay the job's as every other task has them. Its sessions carry a
    # ClusterDef of the ps tasks and itself, so the ps tasks reach it without knowing it from start.
    join_address: str = ""
    # --nothread_spinning: TensorFlow's thread pools sleep when out of work instead of spin-waiting
    # first, for tasks that share a host's cores (launch/processes.LocalCluster sets it when they must).
    thread_spinning: bool = True

    @property
    def joins(self) -> bool:
        return bool(self.join_address)

    @property
    def is_distributed(self) -> bool:
        """Whether this process is a task of a training cluster (and so starts a server)."""
        return self.job_name not in (None, EVALUATOR)

    @property
    def replicas(self) -> list[tuple[str, int]]:
        chief = [(self.chief_job, 0)] if self.chief_hosts else []
        return chief + [(WORKER, i) for i in range(len(self.worker_hosts))]

    @property
    def num_replicas(self) -> int:
        """Training replicas as the job started: the chief task, if any, and the workers (without those
        that joined since, which keep the job's hyperparameters)."""
        return max(1, len(self.replicas))

    @property
    def replica_index(self) -> int:
        """This task's place among the training replicas (0 = chief); its data shard."""
        if not self.is_distributed:
            return 0
        if self.joins:
            return len(self.chief_hosts) + self.task_index
        return self.replicas.index((self.job_name, self.task_index))

    @property
    def num_ps(self) -> int:
        return len(self.ps_hosts)

    @property
    def is_chief(self) -> bool:
        return self.job_name is None or (self.job_name != PS and self.is_distributed
                                         and self.replica_index == 0)

    @property
    def task_name(self) -> str:
        return f"{self.job_name or 'local'}:{self.task_index}"

    @property
    def task_dir(self) -> str:
        """The task's name as a directory of model_dir's per-task outputs (workers/, profile/)."""
        return self.task_name.replace(":", "_")

    def cluster_spec(self) -> tf.train.ClusterSpec:
        """The cluster as this task's sessions see it (a joining worker: the ps tasks and itself)."""
        import tensorflow as tf  # noqa: PLC0415  (TensorFlow loads where used: pure tests and --help run without it)
        if self.joins:
            return tf.train.ClusterSpec({PS: list(self.ps_hosts), WORKER: {self.task_index: self.join_address}})
        jobs = {PS: self.ps_hosts, WORKER: self.worker_hosts, self.chief_job: self.chief_hosts}
        return tf.train.ClusterSpec({job: list(hosts) for job, hosts in jobs.items() if hosts})

    def replica_addresses(self) -> dict[int, str]:
        """The training replicas the task knows from start, by replica index -> host:port."""
        return dict(enumerate((*self.chief_hosts, *self.worker_hosts)))

    def ps_devices(self) -> tuple[str, ...]:
        """The ps tasks' devices in order; none when this process trains alone."""
        return tuple(f"/job:{PS}/task:{i}" for i in range(self.num_ps)) if self.is_distributed else ()

    def worker_device(self) -> str:
        return f"/job:{self.job_name}/task:{self.task_index}"

    def compute_device(self) -> str:
        """Where this worker's ops (all but the variables) go."""
        if not self.num_gpus:
            return self.worker_device() + ("/device:CPU:0" if self.num_gpus == 0 else "")
        return f"{self.worker_device()}/device:GPU:{self.task_index % self.num_gpus}"

    @property
    def hides_gpus(self) -> bool:
        """A ps never takes GPU memory; nor does a worker told --num_gpus=0."""
        return self.job_name == PS or self.num_gpus == 0

    def own_address(self) -> str:
        if self.joins:
            return self.join_address
        hosts = {PS: self.ps_hosts, WORKER: self.worker_hosts, self.chief_job: self.chief_hosts}
        return hosts[self.job_name][self.task_index]


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

    device_filters make a task see only the devices it talks to: a training replica (chief or
    worker) sees every ps and itself, never another replica or the evaluator, so none waits for
    another to come up; a ps sees only itself. The server's thread pools are made from it too
    (start_server): with --nothread_spinning they sleep when out of work. The graph optimizer's
    passes are graph_rewrites'.
    """
    config = graph_rewrites()
    config.allow_soft_placement = True
    config.experimental.disable_thread_spinning = not cluster.thread_spinning
    if cluster.job_name == PS:
        config.device_filters[:] = [f"/job:{PS}/task:{cluster.task_index}"]
    elif cluster.is_distributed:
        config.device_filters[:] = [f"/job:{PS}", cluster.worker_device()]
    if cluster.joins:  # the ps tasks learn this worker's address from its sessions, and share their state
        config.cluster_def.CopyFrom(cluster.cluster_spec().as_cluster_def())
        config.experimental.share_session_state_in_clusterspec_propagation = True
    return config


def graph_rewrites() -> tf.compat.v1.ConfigProto:
    """Session options with TensorFlow's graph optimizer (grappler) set for graphs built once and run for long.

    Grappler optimizes the part of the graph that a run needs at that run's first call, once for each distinct
    set of fetches and feeds (a training step, a step that also logs, a save, a restore), and the ops of a
    function (a cond's or loop's branch) when it first runs: one process with 14 dynamic tables spent 7 s of CPU
    in it. Set here as tf.estimator's sessions had it (RunConfig's default session_config): one pass of its
    optimizers, not two. And without TensorFlow's MLIR round trip of each graph (disable_tfg_optimizer: attribute
    consolidation, a topological sort, shape inference and the export back, which leave the ops as they were).
    docs/speed.md has the figures."""
    import tensorflow as tf  # noqa: PLC0415  (TensorFlow loads where used: pure tests and --help run without it)
    from tensorflow.core.protobuf import rewriter_config_pb2  # noqa: PLC0415  (as above)
    config = tf.compat.v1.ConfigProto()
    config.graph_options.rewrite_options.meta_optimizer_iterations = rewriter_config_pb2.RewriterConfig.ONE
    config.graph_options.rewrite_options.disable_tfg_optimizer = True
    return config


# gRPC options of the channels a task opens to the others, where the user set none of their own:
# - Keepalive. A call that waits on a connection whose other end is gone (a ps that dropped it while a
#   link was down, its reset lost) would wait forever: TCP sends nothing on a quiet connection and gRPC's
#   client pings are off by default. With a ping after 10 s of quiet, such a call fails (UNAVAILABLE)
#   within about 20 s and the session is re-created. gRPC's default of 2 pings per quiet spell stays: a
#   TF server (no way to configure it) takes pings more often than every 5 minutes without data for abuse
#   and closes after 2 strikes.
# - Reconnection at most 1 s apart. Closing a session whose ps died waits until the ps's address answers
#   again (the call that ends the session on each task waits for its connection), and gRPC tries to
#   reconnect after 1 s, 1.6 s, 2.6 s, ... up to 120 s apart: a ps back after 6 s was found 8.8 s later, and
#   the longer a ps is down the longer the wait after its return. Capped at 1 s, the session is made again
#   within about a second of the ps's return (docs/faults.md); a task that is down costs a connection
#   attempt a second.
GRPC_OPTIONS_ENV = "TF_GRPC_DEFAULT_OPTIONS"
DEFAULT_GRPC_OPTIONS = {"grpc.keepalive_time_ms": "10000", "grpc.keepalive_timeout_ms": "10000",
                        "grpc.max_reconnect_backoff_ms": "1000"}


def grpc_options(current: str | None) -> str:
    """TF_GRPC_DEFAULT_OPTIONS ('name=value,...') with DEFAULT_GRPC_OPTIONS added where the user set nothing."""
    options = [option for option in (current or "").split(",") if option]
    named = {option.split("=", 1)[0].strip() for option in options}
    return ",".join(options + [f"{name}={value}" for name, value in DEFAULT_GRPC_OPTIONS.items()
                               if name not in named])


def start_server(cluster: ClusterConfig, environ=os.environ) -> tf.distribute.Server:
    import tensorflow as tf  # noqa: PLC0415  (TensorFlow loads where used: pure tests and --help run without it)
    # TensorFlow reads these once, when it makes its first channel or device: before the server starts.
    environ[GRPC_OPTIONS_ENV] = grpc_options(environ.get(GRPC_OPTIONS_ENV))
    if cluster.hides_gpus:
        environ["CUDA_VISIBLE_DEVICES"] = ""
    if cluster.joins:
        return tf.compat.v1.train.Server(tf.train.ClusterSpec({JOINING: [cluster.join_address]}), job_name=JOINING,
                                         task_index=0, start=True)
    return tf.compat.v1.train.Server(
        cluster.cluster_spec(),
        job_name=cluster.job_name,
        task_index=cluster.task_index,
        config=session_config(cluster),
        start=True,
    )
