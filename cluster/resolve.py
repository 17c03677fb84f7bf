"""Where the cluster comes from: flags, TF_CONFIG, a JobSet's pod, SageMaker, Slurm or AWS Batch.

resolve() is a pure function of the explicit flag values and the environment (a dict), tried in
that order; the first source present wins. AWS Batch also needs a rendezvous (I/O), passed in.
Errors are ClusterError with a one-line message naming the variable and what is wrong.
"""

import dataclasses
import json
import re
from collections.abc import Callable, Mapping
from typing import NamedTuple

from ps_trainer.cluster import spec


class ClusterError(ValueError):
    """The environment or flags describe no usable cluster."""


class Resolved(NamedTuple):
    cluster: spec.ClusterConfig
    source: str


@dataclasses.dataclass(frozen=True)
class ResolveOptions:
    """What engines that only list hosts (Slurm, AWS Batch) need to be told."""

    num_ps: int = 1
    port: int = 2222
    # (job key, node index, node count) -> every node's address, in node order.
    rendezvous: Callable[[str, int, int], list[str]] | None = None


# mnist_replica's cluster, for a task started with --job_name and nothing else naming a cluster: three
# terminals on one machine make a cluster.
DEFAULT_PS_HOSTS, DEFAULT_WORKER_HOSTS = ("localhost:2222",), ("localhost:2223", "localhost:2224")
ENV_VARS = ("JOB_NAME", "TASK_INDEX", "PS_HOSTS", "WORKER_HOSTS")


def resolve(explicit: spec.ClusterConfig | None, env: Mapping[str, str],
            options: ResolveOptions = ResolveOptions(), role: tuple[str, int] | None = None) -> Resolved:
    """The cluster from flags (explicit), else the environment, else (with a role: --job_name and
    --task_index only) mnist_replica's default cluster. Flags that say something else than a cluster
    environment in view are refused, naming both."""
    if explicit is not None:
        _check_agrees(explicit, "the cluster flags", _in_view(env))
        return Resolved(explicit, "flags")
    if role is not None and ("PS_HOSTS" in env or "WORKER_HOSTS" in env):
        # run_*.sh style: the hosts in the environment, the task in the flags.
        env = {"JOB_NAME": role[0], "TASK_INDEX": str(role[1]), **env}
    found = _from_environment(env, options)
    if role is None:
        return found or Resolved(spec.ClusterConfig(), "none (training in this one process)")
    job, index = role
    if found is None:
        return Resolved(spec.ClusterConfig(DEFAULT_PS_HOSTS, DEFAULT_WORKER_HOSTS, job, index),
                        "defaults (mnist_replica's; set --ps_hosts and --worker_hosts for another)")
    task = found.cluster
    if (spec.canonical_job(task.job_name), task.task_index) != (spec.canonical_job(job), index):
        raise ClusterError(
            f"--job_name={job} --task_index={index} say this is {job}:{index}, but {found.source} says "
            f"{task.job_name}:{task.task_index}: drop the two flags (the environment names the task) or "
            f"give the whole cluster with --ps_hosts and --worker_hosts")
    return found


def _from_environment(env: Mapping[str, str], options: ResolveOptions) -> Resolved | None:
    if env.get("TF_CONFIG"):
        source = "TF_CONFIG (SageMaker)" if "SM_HOSTS" in env else "TF_CONFIG"
        found = from_tf_config(env["TF_CONFIG"])
        if all(env.get(name) for name in ENV_VARS):
            _check_agrees(from_env_vars(env), "JOB_NAME, TASK_INDEX, PS_HOSTS and WORKER_HOSTS",
                          Resolved(found, source))
        return Resolved(found, source)
    # The host lists say a cluster is meant; JOB_NAME alone says nothing (Jenkins sets it for every build).
    if "PS_HOSTS" in env or "WORKER_HOSTS" in env:
        return Resolved(from_env_vars(env), "JOB_NAME, TASK_INDEX, PS_HOSTS and WORKER_HOSTS")
    if JOBSET_LAYOUT in env:
        return Resolved(from_jobset(env), f"JobSet {env.get(JOBSET_NAME, '?')} ({JOBSET_LAYOUT})")
    if "SM_HOSTS" in env and "SM_CURRENT_HOST" in env:
        return Resolved(from_sagemaker(env), "SageMaker (SM_HOSTS)")
    slurm_tasks = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
    if _count(env, slurm_tasks) > 1:
        return Resolved(from_slurm(env, options), "Slurm")
    if _count(env, "AWS_BATCH_JOB_NUM_NODES") > 1:
        return Resolved(from_aws_batch(env, options), "AWS Batch multi-node")
    if "AWS_BATCH_JOB_ARRAY_INDEX" in env:
        raise ClusterError(
            f"AWS Batch array job (AWS_BATCH_JOB_ARRAY_INDEX={env['AWS_BATCH_JOB_ARRAY_INDEX']}): its children are "
            "separate jobs that never form a cluster, so each would train alone; run a multi-node parallel job "
            "(or give --ps_hosts, --worker_hosts, --job_name and --task_index)")
    return None


def _count(env: Mapping[str, str], name: str) -> int:
    """A number the platform sets (1 when unset or empty), or ClusterError naming the variable."""
    value = env.get(name, "").strip()
    if not value:
        return 1
    if not value.isdigit():
        raise ClusterError(f"{name}={value!r} is not a number")
    return int(value)


def _in_view(env: Mapping[str, str]) -> Resolved | None:
    """The cluster TF_CONFIG or JOB_NAME/... describe, if they are readable; else None."""
    try:
        return _from_environment({k: v for k, v in env.items() if k == "TF_CONFIG" or k in ENV_VARS},
                                 ResolveOptions())
    except ClusterError:
        return None  # unreadable: the flags name the cluster; nothing to compare


def _check_agrees(mine: spec.ClusterConfig, what: str, found: Resolved | None) -> None:
    """Another source in view must describe the same task and hosts."""
    if found is None:
        return
    theirs = found.cluster

    def key(cluster):
        return (cluster.ps_hosts, cluster.worker_hosts, cluster.chief_hosts, spec.canonical_job(cluster.job_name),
                cluster.task_index)

    if key(theirs) != key(mine):
        raise ClusterError(
            f"{what} say this is {mine.task_name} of ps={','.join(mine.ps_hosts)} "
            f"worker={','.join(mine.worker_hosts)}, but {found.source} says {theirs.task_name} of "
            f"ps={','.join(theirs.ps_hosts)} worker={','.join(theirs.worker_hosts)}: use one (unset "
            f"{'TF_CONFIG' if 'TF_CONFIG' in found.source else 'those variables'}, or drop {what})")


# ---------------------------------------------------------------- JOB_NAME, TASK_INDEX, PS_HOSTS, WORKER_HOSTS

def from_env_vars(env: Mapping[str, str]) -> spec.ClusterConfig:
    """The four variables some platforms (and scripts/run_*.sh) pass: all four, or a one-line error."""
    missing = [name for name in ENV_VARS if not env.get(name)]
    if missing:
        raise ClusterError(f"{', '.join(missing)} not set: a task needs all of {', '.join(ENV_VARS)} "
                           f"(set {', '.join(name for name in ENV_VARS if name in env)} are not enough)")
    job = spec.canonical_job(env["JOB_NAME"])
    if job not in (spec.PS, spec.WORKER, spec.CHIEF):
        raise ClusterError(f"JOB_NAME={env['JOB_NAME']!r} is not ps, worker or chief")
    if not env["TASK_INDEX"].isdigit():
        raise ClusterError(f"TASK_INDEX={env['TASK_INDEX']!r} is not a non-negative integer")
    ps = tuple(h.strip() for h in env["PS_HOSTS"].split(",") if h.strip())
    workers = tuple(h.strip() for h in env["WORKER_HOSTS"].split(",") if h.strip())
    index = int(env["TASK_INDEX"])
    hosts = ps if job == spec.PS else workers
    if job == spec.CHIEF or index >= len(hosts):
        raise ClusterError(f"JOB_NAME={env['JOB_NAME']} TASK_INDEX={index} is not a task of "
                           f"{'PS_HOSTS' if job == spec.PS else 'WORKER_HOSTS'} ({len(hosts)} listed)")
    return spec.ClusterConfig(ps, workers, job, index)


# ---------------------------------------------------------------- TF_CONFIG

def from_tf_config(text: str) -> spec.ClusterConfig:
    """TF_CONFIG as Kubeflow TFJob, SageMaker and TF's own tools write it."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as err:
        raise ClusterError(f"TF_CONFIG is not valid JSON: {err}") from None
    if not isinstance(config, dict):
        raise ClusterError("TF_CONFIG must be a JSON object with 'cluster' and 'task'")
    cluster, task = config.get("cluster") or {}, config.get("task") or {}
    if config.get("rpc_layer", "grpc") != "grpc":
        raise ClusterError(f"TF_CONFIG rpc_layer '{config['rpc_layer']}' is not supported: use grpc")
    if spec.CHIEF in cluster and spec.MASTER in cluster:
        raise ClusterError("TF_CONFIG lists both 'chief' and 'master': a cluster has one chief")
    known = {spec.PS, spec.WORKER, spec.CHIEF, spec.MASTER, spec.EVALUATOR}
    unknown = set(cluster) - known
    if unknown:
        raise ClusterError(f"TF_CONFIG cluster has unknown job(s) {sorted(unknown)}; known: {sorted(known)}")
    job, index = task.get("type"), task.get("index", 0)
    if job not in known:
        raise ClusterError(f"TF_CONFIG task type {job!r} is not one of {sorted(known)}")
    if not isinstance(index, int) or index < 0:
        raise ClusterError(f"TF_CONFIG task index {index!r} is not a non-negative integer")
    chief_job = spec.MASTER if spec.MASTER in cluster else spec.CHIEF
    hosts = {name: tuple(cluster.get(name) or ()) for name in known}
    if job != spec.EVALUATOR and index >= len(hosts[job]):
        raise ClusterError(
            f"TF_CONFIG task {job}:{index} is out of range: cluster lists {len(hosts[job])} {job} task(s)")
    if not hosts[spec.PS] and job != spec.EVALUATOR:
        if job in spec.CHIEF_JOBS and not hosts[spec.WORKER]:
            return spec.ClusterConfig()  # one task and no ps (a one-host SageMaker job): no cluster
        raise ClusterError("TF_CONFIG cluster has no 'ps' job: this trainer needs at least one ps")
    return spec.ClusterConfig(
        ps_hosts=hosts[spec.PS], worker_hosts=hosts[spec.WORKER], job_name=job, task_index=index,
        chief_hosts=hosts[chief_job], chief_job=chief_job)


# ---------------------------------------------------------------- JobSet (and Kubeflow Trainer v2's TrainJob)

# What the manifest (launch/jobset.py) sets in every pod: the layout, once, as JSON ({"ps": N, "chief":
# 1, "worker": M, "port": P}); and, through the downward API, the pod's own JobSet annotations.
JOBSET_LAYOUT = "PS_TRAINER_JOBSET"
JOBSET_NAME = "PS_TRAINER_JOBSET_NAME"  # metadata.annotations['jobset.sigs.k8s.io/jobset-name']
JOBSET_REPLICATED_JOB = "PS_TRAINER_REPLICATED_JOB"  # ...['jobset.sigs.k8s.io/replicatedjob-name']
JOBSET_JOB_INDEX = "PS_TRAINER_JOB_INDEX"  # ...['jobset.sigs.k8s.io/job-index']
COMPLETION_INDEX = "JOB_COMPLETION_INDEX"  # Kubernetes sets it in every pod of an Indexed Job
JOBSET_JOBS = (spec.PS, spec.CHIEF, spec.WORKER, spec.EVALUATOR)  # the replicated jobs, by their names


def jobset_host(jobset: str, replicated_job: str, pod_index: int, subdomain: str, port: int) -> str:
    """A pod's address under JobSet's DNS host names: <jobset>-<replicated job>-<job index>-<pod
    index>.<subdomain> (each replicated job here is one Indexed Job: job index 0)."""
    return f"{jobset}-{replicated_job}-0-{pod_index}.{subdomain}:{port}"


def from_jobset(env: Mapping[str, str]) -> spec.ClusterConfig:
    """The cluster of a JobSet pod (a Trainer v2 TrainJob is a JobSet underneath, named as the TrainJob):
    every host from the layout and the JobSet's name, this task from its replicated job and index."""
    try:
        layout = json.loads(env[JOBSET_LAYOUT])
    except json.JSONDecodeError as err:
        raise ClusterError(f"{JOBSET_LAYOUT} is not valid JSON: {err}") from None
    if not isinstance(layout, dict) or set(layout) - {*JOBSET_JOBS, "port", "subdomain"}:
        raise ClusterError(f"{JOBSET_LAYOUT} must be a JSON object of replica counts ({', '.join(JOBSET_JOBS)}), "
                           f"'port' and optionally 'subdomain', not {env[JOBSET_LAYOUT]}")
    counts = {job: layout.get(job, 0) for job in JOBSET_JOBS}
    port = layout.get("port")
    if not all(isinstance(count, int) and count >= 0 for count in counts.values()) or not isinstance(port, int):
        raise ClusterError(f"{JOBSET_LAYOUT}={env[JOBSET_LAYOUT]}: the counts and the port must be integers")
    if counts[spec.PS] < 1 or counts[spec.CHIEF] != 1 or counts[spec.EVALUATOR] > 1:
        raise ClusterError(f"{JOBSET_LAYOUT}={env[JOBSET_LAYOUT]}: a job needs at least one ps, one chief and at "
                           "most one evaluator")
    for name in (JOBSET_NAME, JOBSET_REPLICATED_JOB, COMPLETION_INDEX):
        if not env.get(name):
            raise ClusterError(f"{name} is not set: the pod needs it (its JobSet's downward-API environment; "
                               "scripts/make_jobset.py writes it)")
    job, jobset = env[JOBSET_REPLICATED_JOB], env[JOBSET_NAME]
    if job not in JOBSET_JOBS:
        raise ClusterError(f"{JOBSET_REPLICATED_JOB}={job}: the replicated jobs are {', '.join(JOBSET_JOBS)}")
    index = _count(env, COMPLETION_INDEX)
    if env.get(JOBSET_JOB_INDEX, "0") != "0":
        raise ClusterError(f"{JOBSET_JOB_INDEX}={env[JOBSET_JOB_INDEX]}: each replicated job is one Job "
                           "(replicas: 1) whose pods are its tasks")
    if index >= counts[job]:
        raise ClusterError(f"{COMPLETION_INDEX}={index} is out of range: {JOBSET_LAYOUT} has {counts[job]} {job} "
                           "task(s)")
    subdomain = layout.get("subdomain") or jobset

    def hosts(name):
        return tuple(jobset_host(jobset, name, i, subdomain, port) for i in range(counts[name]))

    return spec.ClusterConfig(ps_hosts=hosts(spec.PS), worker_hosts=hosts(spec.WORKER), job_name=job,
                              task_index=index, chief_hosts=hosts(spec.CHIEF))


# ---------------------------------------------------------------- SageMaker

SAGEMAKER_WORKER_PORT, SAGEMAKER_PS_PORT = 2222, 2223


def from_sagemaker(env: Mapping[str, str]) -> spec.ClusterConfig:
    """The cluster SageMaker's parameter-server mode builds when it sets no TF_CONFIG itself.

    As its TensorFlow toolkit does: the first host is the master, the others workers (port 2222),
    and with more than one host a ps on every host (port 2223) that SageMaker starts, not us.
    """
    try:
        hosts = json.loads(env["SM_HOSTS"])
    except json.JSONDecodeError as err:
        raise ClusterError(f"SM_HOSTS is not a JSON list of host names: {err}") from None
    current = env["SM_CURRENT_HOST"]
    if current not in hosts:
        raise ClusterError(f"SM_CURRENT_HOST {current!r} is not in SM_HOSTS {hosts}")
    if len(hosts) == 1:
        return spec.ClusterConfig()
    workers = tuple(f"{h}:{SAGEMAKER_WORKER_PORT}" for h in hosts[1:])
    ps = tuple(f"{h}:{SAGEMAKER_PS_PORT}" for h in hosts)
    chief = (f"{hosts[0]}:{SAGEMAKER_WORKER_PORT}",)
    if current == hosts[0]:
        job, index = spec.MASTER, 0
    else:
        job, index = spec.WORKER, hosts.index(current) - 1
    return spec.ClusterConfig(ps, workers, job, index, chief_hosts=chief, chief_job=spec.MASTER)


# ---------------------------------------------------------------- Slurm

def expand_nodelist(text: str) -> list[str]:
    """Slurm's compressed host list, in Slurm's order: 'node[9-10],gpu[01-02,7]' ->
    ['node9', 'node10', 'gpu01', 'gpu02', 'gpu7']. Zero padding is kept; nothing is sorted."""
    hosts = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", text):
        match = re.fullmatch(r"([^\[]*)\[([^\]]+)\](.*)", part)
        if not match:
            hosts.append(part)
            continue
        prefix, ranges, suffix = match.groups()
        if "[" in suffix:
            raise ClusterError(f"node list {text!r}: more than one bracket in {part!r} is not supported")
        for item in ranges.split(","):
            low, _, high = item.partition("-")
            if not low.isdigit() or (high and not high.isdigit()):
                raise ClusterError(f"node list {text!r}: bad range {item!r}")
            for number in range(int(low), int(high or low) + 1):
                hosts.append(f"{prefix}{str(number).zfill(len(low))}{suffix}")
    return hosts


def expand_tasks_per_node(text: str) -> list[int]:
    """Slurm's tasks-per-node list: '3(x2),1' -> [3, 3, 1]."""
    counts = []
    for item in text.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if not match:
            raise ClusterError(f"tasks per node {text!r}: cannot read {item!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def from_slurm(env: Mapping[str, str], options: ResolveOptions) -> spec.ClusterConfig:
    """One task per Slurm rank, block-distributed: ranks fill each node in node-list order.

    The first options.num_ps ranks are ps tasks, the rest workers; a task listens on options.port
    plus its local index on the node. Unlike TF's SlurmClusterResolver this needs no GPUs and
    never sorts node names as strings (node10 before node9 would hand out another node's address).
    """
    def need(*names):
        for name in names:
            if env.get(name):
                return env[name]
        raise ClusterError(f"Slurm: {names[0]} is not set; run the trainer with srun")

    nodes = expand_nodelist(need("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"))
    counts = expand_tasks_per_node(need("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"))
    if len(counts) != len(nodes):
        raise ClusterError(f"Slurm: {len(nodes)} nodes but tasks per node for {len(counts)}")
    tasks = [(node, local) for node, count in zip(nodes, counts) for local in range(count)]
    need("SLURM_PROCID")
    rank = _count(env, "SLURM_PROCID")
    if not 0 <= rank < len(tasks):
        raise ClusterError(f"Slurm: SLURM_PROCID={rank} is outside the {len(tasks)} tasks of the step")
    node, local = tasks[rank]
    actual = env.get("SLURMD_NODENAME")
    if actual and actual != node:
        raise ClusterError(
            f"Slurm: rank {rank} should run on {node} under block distribution but runs on {actual}; "
            "start the step with srun --distribution=block")
    if env.get("SLURM_LOCALID") and _count(env, "SLURM_LOCALID") != local:
        raise ClusterError(f"Slurm: rank {rank} has SLURM_LOCALID={env['SLURM_LOCALID']}, "
                           f"expected {local} under block distribution")
    addresses = tuple(f"{n}:{options.port + i}" for n, i in tasks)
    return _split_ps_workers(addresses, rank, options.num_ps, "Slurm")


def _split_ps_workers(addresses, index, num_ps, engine) -> spec.ClusterConfig:
    if not 1 <= num_ps < len(addresses):
        raise ClusterError(f"{engine}: --num_ps={num_ps} leaves no worker among {len(addresses)} tasks")
    ps, workers = addresses[:num_ps], addresses[num_ps:]
    if index < num_ps:
        return spec.ClusterConfig(ps, workers, spec.PS, index)
    return spec.ClusterConfig(ps, workers, spec.WORKER, index - num_ps)


# ---------------------------------------------------------------- AWS Batch

def from_aws_batch(env: Mapping[str, str], options: ResolveOptions) -> spec.ClusterConfig:
    """A multi-node parallel job: node i is task i (the first options.num_ps nodes are ps).

    AWS Batch tells a child node only the main node's address, but the ps also pulls from every
    worker, so every node must learn every address: the nodes rendezvous, keyed by the job id.
    """
    for name in ("AWS_BATCH_JOB_NUM_NODES", "AWS_BATCH_JOB_NODE_INDEX", "AWS_BATCH_JOB_ID"):
        if not env.get(name, "").strip():
            raise ClusterError(f"AWS Batch: {name} is missing from the job's environment")
    count, index = _count(env, "AWS_BATCH_JOB_NUM_NODES"), _count(env, "AWS_BATCH_JOB_NODE_INDEX")
    # A retried job keeps its id: key by attempt too, or a retry would read stale addresses.
    job_key = f"{env['AWS_BATCH_JOB_ID'].split('#')[0]}-attempt{env.get('AWS_BATCH_JOB_ATTEMPT', '1')}"
    if options.rendezvous is None:
        raise ClusterError("AWS Batch: nodes must exchange addresses: pass --rendezvous_dir, a "
                           "directory shared by every node (EFS or FSx)")
    hosts = options.rendezvous(job_key, index, count)
    return _split_ps_workers(tuple(f"{h}:{options.port}" for h in hosts), index, options.num_ps,
                             "AWS Batch")
