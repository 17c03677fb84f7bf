"""Reads the parsed flags once into plain, validated values.

Everything below trainer.py takes these values, never FLAGS. Each check raises app.UsageError with a
message that names the flag and the fix, before any server starts.
"""

import dataclasses

from absl import app

import input as inputs
import model
from cluster import spec
from training.config import TrainConfig


@dataclasses.dataclass(frozen=True)
class RunConfig:
    cluster: spec.ClusterConfig
    train: TrainConfig
    model: model.ModelConfig
    data: inputs.DataConfig


def read(flag_values, argv) -> RunConfig:
    """FLAGS (already parsed) and the leftover argv -> RunConfig, or app.UsageError."""
    reject_positional_args(argv)
    cluster = read_cluster(flag_values)
    return RunConfig(
        cluster=cluster,
        train=read_train(flag_values, cluster),
        model=read_model(flag_values),
        data=read_data(flag_values, cluster),
    )


def reject_positional_args(argv) -> None:
    stray = list(argv[1:])
    if stray:
        raise app.UsageError(
            f"unexpected argument(s) {' '.join(stray)}: trainer.py takes only flags. A boolean flag "
            "takes its value after '=' (--sync_replicas=false), never as a separate word.")


def read_cluster(f) -> spec.ClusterConfig:
    ps_hosts = parse_hosts("ps_hosts", f.ps_hosts)
    worker_hosts = parse_hosts("worker_hosts", f.worker_hosts)
    seen = {}
    for flag_name, hosts in (("ps_hosts", ps_hosts), ("worker_hosts", worker_hosts)):
        for address in hosts:
            if address in seen:
                raise app.UsageError(
                    f"{address} appears twice (in --{seen[address]} and --{flag_name}): "
                    "every task needs its own host:port.")
            seen[address] = flag_name
    if f.job_name is None:
        if ps_hosts or worker_hosts:
            raise app.UsageError(
                "--job_name is not set: with --ps_hosts/--worker_hosts, pass --job_name=ps or "
                "--job_name=worker (or drop the host lists to train in one process).")
        if f.task_index != 0:
            raise app.UsageError("--task_index needs a cluster: set --job_name, --ps_hosts and --worker_hosts.")
        return spec.ClusterConfig()
    if not ps_hosts or not worker_hosts:
        missing = "--ps_hosts" if not ps_hosts else "--worker_hosts"
        raise app.UsageError(
            f"{missing} is empty: --job_name={f.job_name} needs at least one ps and one worker "
            "(e.g. --ps_hosts=10.0.0.1:2222 --worker_hosts=10.0.0.2:2222,10.0.0.3:2222).")
    hosts = ps_hosts if f.job_name == spec.PS else worker_hosts
    if f.task_index >= len(hosts):
        raise app.UsageError(
            f"--task_index={f.task_index} is out of range: --{f.job_name}_hosts lists "
            f"{len(hosts)} {f.job_name} task(s) (0..{len(hosts) - 1}).")
    return spec.ClusterConfig(ps_hosts, worker_hosts, f.job_name, f.task_index)


def parse_hosts(flag_name: str, values) -> tuple[str, ...]:
    hosts = tuple(v.strip() for v in values)
    for address in hosts:
        try:
            spec.split_host_port(address)
        except ValueError as err:
            raise app.UsageError(f"--{flag_name}: {err}; write host:port, e.g. 10.0.0.1:2222.") from None
    return hosts


def read_train(f, cluster: spec.ClusterConfig) -> TrainConfig:
    replicas = f.replicas_to_aggregate or cluster.num_workers
    if replicas > cluster.num_workers:
        raise app.UsageError(
            f"--replicas_to_aggregate={replicas} is larger than the {cluster.num_workers} worker(s) "
            "in --worker_hosts: a step would wait forever; use at most that many.")
    if f["replicas_to_aggregate"].present and not f.sync_replicas:
        raise app.UsageError("--replicas_to_aggregate applies only with --sync_replicas; add it or drop the flag.")
    if f["save_checkpoint_steps"].present and f["save_checkpoint_secs"].present:
        raise app.UsageError(
            "--save_checkpoint_steps and --save_checkpoint_secs are both set: choose one.")
    if cluster.job_name != spec.PS and not f.model_dir:
        raise app.UsageError(
            "--model_dir is required for training: the chief writes checkpoints and summaries "
            "there, and a restarted worker resumes from it.")
    steps = f.save_checkpoint_steps
    return TrainConfig(
        train_steps=f.train_steps,
        batch_size=f.batch_size,
        learning_rate=f.learning_rate,
        optimizer=f.optimizer,
        momentum=f.momentum,
        sync_replicas=f.sync_replicas,
        replicas_to_aggregate=replicas,
        model_dir=f.model_dir,
        save_checkpoint_steps=steps,
        save_checkpoint_secs=None if steps else f.save_checkpoint_secs,
        save_summaries_steps=f.save_summaries_steps,
        log_every_n_steps=f.log_every_n_steps,
        seed=f.seed,
        startup_timeout_secs=f.startup_timeout_secs,
    )


def read_model(f) -> model.ModelConfig:
    try:
        units = tuple(int(u) for u in f.hidden_units)
    except ValueError:
        units = ()
    if not units or min(units) < 1:
        raise app.UsageError(
            f"--hidden_units={','.join(f.hidden_units)} must be positive integers, e.g. 256 or 512,256.")
    return model.ModelConfig(name=f.model, hidden_units=units)


def read_data(f, cluster: spec.ClusterConfig) -> inputs.DataConfig:
    data = inputs.DataConfig(name=f.dataset, data_dir=f.data_dir,
                             synthetic_examples=f.synthetic_examples, seed=f.seed)
    if cluster.job_name == spec.PS:
        return data  # a ps never reads data, and its host may not have it
    problem = inputs.DATASETS[f.dataset].check(data)
    if problem:
        raise app.UsageError(problem)
    return data
