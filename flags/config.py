"""Reads the parsed flags once into plain, validated values.

Everything below trainer.py takes these values, never FLAGS. Each check raises app.UsageError with a
message that names the flag and the fix, before any server starts.
"""

import dataclasses
import hashlib
import os
import tempfile
import time

import tensorflow as tf
from absl import app, logging

from ps_trainer import input as inputs
from ps_trainer import model
from ps_trainer.model import multi_valued, tables, user_fn
from ps_trainer.cluster import rendezvous, resolve, spec
from ps_trainer.input import storage
from ps_trainer.training import plan
from ps_trainer.training import momentum
from ps_trainer.training.config import NO_STEP_LIMIT, RunConfig, TrainConfig

SAGEMAKER_CHECKPOINTS = "/opt/ml/checkpoints"


def read(flag_values, argv, env=None) -> RunConfig:
    """FLAGS (already parsed), the leftover argv and the environment -> RunConfig, or UsageError.

    The checks of the flags alone come first; then the cluster (which may wait on a rendezvous); then
    what depends on it. Nothing here looks a name up: the public-address check resolves names when
    the task starts to serve (trainer.py)."""
    env = env or {}
    reject_positional_args(argv)
    take_model_fn(flag_values)
    check_flags_alone(flag_values)
    resolved = read_resolved_cluster(flag_values, env)
    cluster = resolved.cluster
    run = RunConfig(
        cluster=cluster,
        train=read_train(flag_values, cluster, env),
        model=read_model(flag_values, cluster),
        data=read_data(flag_values, cluster, env),
        cluster_source=resolved.source,
        given=frozenset(name for name in GIVEN if flag_values[name].present),
    )
    if cluster.job_name != spec.PS:
        data_spec = inputs.spec(run.data)
        problem = model.check(run.model, data_spec)
        if problem:
            raise app.UsageError(f"--model={run.model.name} with --dataset={run.data.name}: {problem}")
        shards = model.needs_of(run.model.name).table_shards
        if shards and flag_values.embedding_partitions is None:  # the model's default cut of its tables
            run = dataclasses.replace(run, model=dataclasses.replace(
                run.model, embedding_partitions=shards(run.model, data_spec, cluster.num_ps)))
    return run


GIVEN = ("embedding_partitions",)  # RunConfig.given


def take_model_fn(f) -> None:
    """--model_fn names the model: --model is model_fn (said or not), and model_fn needs the function."""
    if f.model_fn and f["model"].present and f.model != "model_fn":
        raise app.UsageError(f"--model_fn={f.model_fn} is the model: drop --model={f.model}")
    if f.model_fn:
        f.model = "model_fn"
    elif f.model == "model_fn":
        raise app.UsageError("--model=model_fn needs --model_fn=FILE.py:FUNCTION, the TF1 model_fn to train")


def check_flags_alone(f) -> None:
    """The checks that need no cluster: combinations of flags that cannot go together."""
    if f.existing_servers:
        raise app.UsageError(
            "--existing_servers=true (mnist_replica's client mode) is not supported: every task of ps-trainer "
            "starts its own server; run one trainer.py per task with --job_name and --task_index, and drop the flag.")
    if f["replicas_to_aggregate"].present and not f.sync_replicas:
        raise app.UsageError("--replicas_to_aggregate applies only with --sync_replicas; add it or drop the flag.")
    if f.steps_per_run > 1 and f.sync_replicas:
        raise app.UsageError(
            f"--steps_per_run={f.steps_per_run} is for asynchronous training: with --sync_replicas every step "
            "waits for the other workers' gradients, so run one step per session.run (drop the flag).")
    check_local_steps(f)
    check_accumulation(f)
    decided(plan.check_input, input_settings(f))
    if f["save_checkpoint_steps"].present and f["save_checkpoint_secs"].present:
        raise app.UsageError(
            "--save_checkpoint_steps and --save_checkpoint_secs are both set: choose one.")
    check_incremental(f)
    check_table_flags(f)
    check_warm_start(f)
    if f["combiner"].present and not f.multi_valued_columns:
        raise app.UsageError("--combiner combines the rows of a multi-valued column's values: there is none "
                             "(--multi_valued_columns); drop the flag.")


# The settings of a model's embedding tables, besides those of one kind only (model/tables.py): each given
# where it would do nothing is refused by name, never ignored (a user would believe admission or eviction on).
TABLE_FLAGS = ("embedding", "embedding_dim", "embedding_partitions")


def check_table_flags(f) -> None:
    """Table flags given for a model without tables; a kind's own flags given for another kind."""
    own = {name: kind for kind, module in tables.KINDS.items() for name in module.OWN_FLAGS}
    given = [name for name in (*TABLE_FLAGS, *own) if f[name].present]
    columns = model.needs_of(f.model).dynamic_columns
    if given and not has_tables(f):
        raise app.UsageError(f"--{given[0]} sets embedding tables: " + (
            "a model_fn has them with --embedding=dynamic (its dynamic_embedding_columns); add it or drop the flag."
            if columns else f"--model={f.model} has none (wide_deep has); drop the flag."))
    if columns and "embedding_dim" in given:
        raise app.UsageError("--embedding_dim: a model_fn's dynamic_embedding_column says its own dimension; drop "
                             "the flag.")
    misplaced = next((name for name in given if name in own and own[name] != f.embedding), None)
    if misplaced:
        raise app.UsageError(tables.KINDS[own[misplaced]].misplaced(misplaced, f.embedding))


def check_incremental(f) -> None:
    """--incremental_save_secs saves changed table rows between full checkpoints."""
    if not f.incremental_save_secs:
        return
    if not has_tables(f):
        raise app.UsageError(f"--incremental_save_secs saves the embedding table rows that changed: --model={f.model} "
                             "has no tables; drop the flag (its checkpoints are full ones).")
    if not f.save_checkpoint_steps and f.incremental_save_secs >= f.save_checkpoint_secs:
        raise app.UsageError(f"--incremental_save_secs={f.incremental_save_secs} saves deltas between full "
                             f"checkpoints, which come every --save_checkpoint_secs={f.save_checkpoint_secs}: "
                             "make it smaller.")


def read_multi_valued(f) -> tuple[str, ...]:
    """--multi_valued_columns as DataConfig holds it: "NAME:SEPARATOR" each, the separator '|' unless given."""
    entries, names = [], set()
    for entry in f.multi_valued_columns:
        name, _, separator = entry.partition(":")
        separator = separator if ":" in entry else multi_valued.DEFAULT_SEPARATOR
        if not name or not separator:
            raise app.UsageError(f"--multi_valued_columns: '{entry}' is not NAME or NAME:SEPARATOR "
                                 "(e.g. history or tags:;)")
        if name in names:
            raise app.UsageError(f"--multi_valued_columns names '{name}' twice: give each column once")
        names.add(name)
        entries.append(f"{name}:{separator}")
    return tuple(entries)


def check_warm_start(f) -> None:
    for name in ("warm_start_map", "warm_start_slots"):
        if f[name].present and not f.warm_start_from:
            raise app.UsageError(f"--{name} says what --warm_start_from loads: add it or drop the flag.")
    read_warm_start_map(f)


def read_warm_start_map(f) -> tuple[tuple[str, str], ...]:
    pairs = []
    for entry in f.warm_start_map:
        old, sep, new = entry.partition("=")
        if not sep or not old.strip("/") or not new.strip("/"):
            raise app.UsageError(f"--warm_start_map: {entry!r} is not OLD=NEW (the checkpoint's name, this model's)")
        pairs.append((old.strip("/"), new.strip("/")))
    return tuple(pairs)


def input_settings(f, name: str | None = None, cluster: spec.ClusterConfig | None = None) -> plan.InputSettings:
    """What training/plan.py decides the input path by: the flags, and the dataset and cluster once known."""
    several = next((flag for flag in plan.SEVERAL_BATCHES if f[flag].value > 1), None)
    backup = None
    if cluster is not None and f.sync_replicas:
        aggregated = f.replicas_to_aggregate or cluster.num_replicas
        backup = (aggregated, cluster.num_replicas) if aggregated < cluster.num_replicas else None
    return plan.InputSettings(
        input_queue=f.input_queue, needs_queue=next((flag for flag in plan.QUEUE_FLAGS if f[flag].value), None),
        several_batches=(several, f[several].value) if several else None,
        rounds=plan.reads_rounds(step_settings(f, cluster)),
        cache=f.cache, backup_workers=backup,
        dataset=name, has_files=None if name is None else inputs.lists_files(name),
        distributed=None if cluster is None else cluster.is_distributed,
        joins=bool(cluster and cluster.joins))


def step_settings(f, cluster: spec.ClusterConfig | None = None) -> plan.StepSettings:
    """What training/plan.py decides the step path by: the flags, the model's tables, the cluster once known."""
    takes_rounds = plan.tables_take_rounds(model.needs_of(f.model), f.embedding, chosen_optimizer(f))
    return plan.StepSettings(local_steps=f.local_steps, steps_per_run=f.steps_per_run,
                             steps_per_run_given=f["steps_per_run"].present, accumulate_batches=f.accumulate_batches,
                             sync=f.sync_replicas, has_tables=has_tables(f), tables_take_rounds=takes_rounds,
                             model=f.model, distributed=None if cluster is None else cluster.is_distributed)


def decided(choose, settings):
    """A plan's choice, its Conflict raised as a usage error."""
    try:
        return choose(settings)
    except plan.Conflict as err:
        raise app.UsageError(str(err)) from None


def read_resolved_cluster(f, env) -> resolve.Resolved:
    """Flags if they name a cluster or a role, else whatever cluster the environment describes."""
    rendezvous_fn = None
    if f.rendezvous_dir:
        address = f.advertise_address or rendezvous.own_address(
            env.get("AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"))
        rendezvous_fn = rendezvous.DirectoryRendezvous(f.rendezvous_dir, address, f.rendezvous_timeout_secs)
    options = resolve.ResolveOptions(num_ps=f.num_ps, port=f.port, rendezvous=rendezvous_fn)
    explicit = read_cluster(f)
    role = None
    if explicit is None and f.job_name not in (None, spec.EVALUATOR):
        role = (spec.canonical_job(f.job_name), f.task_index)
    try:
        resolved = resolve.resolve(explicit, env, options, role)
        if explicit is None:  # the flags' own hosts were checked as they were read, naming the flag
            check_addresses(resolved.cluster)
    except resolve.ClusterError as err:
        raise app.UsageError(str(err)) from None
    if f.num_gpus is not None:
        resolved = resolved._replace(cluster=dataclasses.replace(resolved.cluster, num_gpus=f.num_gpus))
    if not f.thread_spinning:
        resolved = resolved._replace(cluster=dataclasses.replace(resolved.cluster, thread_spinning=False))
    return resolved


def check_addresses(cluster: spec.ClusterConfig) -> None:
    seen = set()
    for address in (*cluster.ps_hosts, *cluster.chief_hosts, *cluster.worker_hosts):
        try:
            spec.split_host_port(address)
        except ValueError as err:
            raise resolve.ClusterError(f"cluster address {err}") from None
        if address in seen:
            raise resolve.ClusterError(f"cluster lists {address} twice: every task needs its own host:port")
        seen.add(address)


def join_separate_bool_values(argv, flag_values):
    """SageMaker passes hyperparameters as '--name value'; absl reads a boolean's value only after
    '='. Joins '--sync_replicas True' into '--sync_replicas=True' for the known boolean flags."""
    booleans = {name for name in flag_values if flag_values[name].boolean}
    joined, i = [], 0
    while i < len(argv):
        arg = argv[i]
        name = arg[2:] if arg.startswith("--") and "=" not in arg else None
        if name in booleans and i + 1 < len(argv) and argv[i + 1].lower() in ("true", "false", "1", "0"):
            joined.append(f"--{name}={argv[i + 1]}")
            i += 2
            continue
        joined.append(arg)
        i += 1
    return joined


def reject_positional_args(argv) -> None:
    stray = list(argv[1:])
    if stray:
        raise app.UsageError(
            f"unexpected argument(s) {' '.join(stray)}: trainer.py takes only flags. A boolean flag "
            "takes its value after '=' (--sync_replicas=false), never as a separate word.")


def read_cluster(f) -> spec.ClusterConfig | None:
    """The cluster named by flags, or None when no flag names one (the environment decides)."""
    ps_hosts = parse_hosts("ps_hosts", f.ps_hosts)
    worker_hosts = parse_hosts("worker_hosts", f.worker_hosts)
    chief_hosts = parse_hosts("chief_hosts", f.chief_hosts)
    seen = {}
    for flag_name, hosts in (("ps_hosts", ps_hosts), ("chief_hosts", chief_hosts),
                             ("worker_hosts", worker_hosts)):
        for address in hosts:
            if address in seen:
                raise app.UsageError(
                    f"{address} appears twice (in --{seen[address]} and --{flag_name}): "
                    "every task needs its own host:port.")
            seen[address] = flag_name
    job = spec.canonical_job(f.job_name)
    if job is None:
        if ps_hosts or worker_hosts or chief_hosts:
            raise app.UsageError(
                "--job_name is not set: with --ps_hosts/--worker_hosts, pass --job_name=ps, worker, "
                "chief or evaluator (or drop the host lists to train in one process).")
        if f.task_index is not None:
            raise app.UsageError("--task_index needs --job_name (and a cluster: --ps_hosts and --worker_hosts, "
                                 "or a cluster environment).")
        return None
    if job == spec.EVALUATOR:
        return spec.ClusterConfig(ps_hosts, worker_hosts, job, f.task_index or 0, chief_hosts)
    if f.task_index is None:
        raise app.UsageError(
            f"--task_index is required with --job_name={f.job_name}: each task of a job needs its own "
            "(0, 1, ...); a task that took a default would be a second task 0 (worker 0 is the chief).")
    if len(chief_hosts) > 1:
        raise app.UsageError(f"--chief_hosts lists {len(chief_hosts)} hosts: a cluster has one chief.")
    if not (ps_hosts or worker_hosts or chief_hosts):
        return None  # the environment's cluster, or mnist_replica's default (resolve.resolve)
    if not ps_hosts or not (worker_hosts or chief_hosts):
        missing = "--ps_hosts" if not ps_hosts else "--worker_hosts"
        raise app.UsageError(
            f"{missing} is empty: --job_name={f.job_name} needs at least one ps and one worker "
            "(e.g. --ps_hosts=10.0.0.1:2222 --worker_hosts=10.0.0.2:2222,10.0.0.3:2222).")
    hosts = {spec.PS: ps_hosts, spec.WORKER: worker_hosts, spec.CHIEF: chief_hosts}[job]
    if f.join_address is not None:
        return read_joining_worker(f, ps_hosts, worker_hosts, chief_hosts, job, seen)
    if f.task_index >= len(hosts):
        flag = "chief_hosts" if job == spec.CHIEF else f"{job}_hosts"
        joining = (" (a worker joining a running job gives its own address with --join_address)"
                   if job == spec.WORKER else "")
        raise app.UsageError(
            f"--task_index={f.task_index} is out of range: --{flag} lists "
            f"{len(hosts)} {job} task(s) (0..{len(hosts) - 1}){joining}.")
    return spec.ClusterConfig(ps_hosts, worker_hosts, job, f.task_index, chief_hosts)


def read_joining_worker(f, ps_hosts, worker_hosts, chief_hosts, job, seen) -> spec.ClusterConfig:
    """--join_address: a worker joining a running async job, at its own index past --worker_hosts."""
    [address] = parse_hosts("join_address", [f.join_address])
    if job != spec.WORKER:
        raise app.UsageError(f"--join_address is for a worker joining a running job, not --job_name={f.job_name}.")
    if f.task_index < len(worker_hosts):
        raise app.UsageError(
            f"--join_address with --task_index={f.task_index}: --worker_hosts lists that worker already "
            f"(0..{len(worker_hosts) - 1}); a joining worker takes an index past the list, one of its own.")
    if len(chief_hosts) + f.task_index >= spec.MAX_REPLICAS:
        raise app.UsageError(f"--task_index={f.task_index}: a job holds at most {spec.MAX_REPLICAS} training "
                             "replicas, the chief included.")
    if address in seen:
        raise app.UsageError(f"--join_address={address} is in --{seen[address]} already: a joining worker needs "
                             "a host:port of its own.")
    if f.sync_replicas:
        raise app.UsageError("--join_address with --sync_replicas: a synchronous round waits for the workers it "
                             "started with; only asynchronous jobs take joining workers.")
    return spec.ClusterConfig(ps_hosts, worker_hosts, job, f.task_index, chief_hosts, join_address=address)


LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


def default_model_dir(cluster: spec.ClusterConfig) -> str | None:
    """Where a task without --model_dir keeps the run: a new directory for one process; for a cluster
    on this one host, a directory named from its addresses, the same for every task, ps tasks included
    (they read the workers' done marks there; a rerun of the same cluster resumes from it). Across
    hosts no default can be shared: UsageError for a training task, None for a ps."""
    if cluster.job_name == spec.EVALUATOR:
        raise app.UsageError("--model_dir is required for the evaluator: the chief's --model_dir, where it finds "
                             "the checkpoints to evaluate.")
    if not cluster.is_distributed:
        model_dir = os.path.join(tempfile.gettempdir(), f"ps-trainer-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        logging.info("--model_dir not set: checkpoints go to %s, new for this run", model_dir)
        return model_dir
    hosts = (*cluster.ps_hosts, *cluster.chief_hosts, *cluster.worker_hosts)
    remote = sorted({host for host, _ in map(spec.split_host_port, hosts)
                     if host not in LOCAL_HOSTS and not host.startswith("127.")})
    if remote and cluster.job_name == spec.PS:
        return None
    if remote:
        raise app.UsageError(
            "--model_dir is required for a cluster across hosts (" + ", ".join(remote) + "): the "
            "chief writes checkpoints there, every ps writes its shard, and a restarted worker resumes from it; "
            "give a directory every host shares (e.g. --model_dir=/shared/run1).")
    digest = hashlib.sha256(",".join(hosts).encode()).hexdigest()[:12]
    model_dir = os.path.join(tempfile.gettempdir(), f"ps-trainer-{digest}")
    logging.info("--model_dir not set: checkpoints go to %s, the same for every task of this one-host cluster "
                 "(a rerun of the same cluster resumes from it)", model_dir)
    return model_dir


def parse_hosts(flag_name: str, values) -> tuple[str, ...]:
    hosts = tuple(v.strip() for v in values)
    for address in hosts:
        try:
            spec.split_host_port(address)
        except ValueError as err:
            raise app.UsageError(f"--{flag_name}: {err}; write host:port, e.g. 10.0.0.1:2222.") from None
    return hosts


def read_train(f, cluster: spec.ClusterConfig, env) -> TrainConfig:
    replicas = f.replicas_to_aggregate or cluster.num_replicas
    if replicas > cluster.num_replicas:
        raise app.UsageError(
            f"--replicas_to_aggregate={replicas} is larger than the {cluster.num_replicas} worker(s) "
            "in --worker_hosts: a step would wait forever; use at most that many.")
    decided(plan.check_input, input_settings(f, cluster=cluster))
    optimizer = chosen_optimizer(f)
    choice = momentum.choose(f.momentum, cluster.num_replicas, f.sync_replicas, f.local_steps, optimizer,
                             f.learning_rate)
    learning_rate = f.learning_rate * choice.learning_rate_scale
    path = decided(plan.step_path, step_settings(f, cluster))
    if f.scale_learning_rate_by_replicas and f.sync_replicas:
        learning_rate *= replicas
    return TrainConfig(
        **read_schedule(f),
        **read_outputs(f, cluster, env),
        clip_gradient_norm=f.clip_gradient_norm or None,
        train_steps=f.train_steps if f["train_steps"].present or not f.num_epochs else NO_STEP_LIMIT,
        num_epochs=f.num_epochs,
        batch_size=f.batch_size,
        learning_rate=learning_rate,
        optimizer=optimizer,
        momentum=choice.momentum,
        momentum_choice=choice,
        not_learning=f.not_learning,
        sync_replicas=f.sync_replicas,
        replicas_to_aggregate=replicas,
        seed=f.seed,
        startup_timeout_secs=f.startup_timeout_secs,
        worker_gone_secs=f.worker_gone_secs,
        eval_timeout_secs=f.eval_timeout_secs,
        stall_warning_secs=f.stall_warning_secs,
        stall_timeout_secs=f.stall_timeout_secs,
        wire_dtype=f.wire_dtype,
        step_path=path,
        local_steps=f.local_steps,
        accumulate_batches=f.accumulate_batches,
        profile_steps=read_profile_steps(f),
    )


def read_outputs(f, cluster: spec.ClusterConfig, env) -> dict:
    """Where the run's outputs go and how often: --model_dir (checked, or its default) and the rest."""
    model_dir = f.model_dir or default_model_dir(cluster)
    if model_dir and model_dir.startswith("s3://") and "SM_HOSTS" in env:
        # SageMaker's estimator passes an s3:// --model_dir by default, which TensorFlow 2.21
        # cannot write; SageMaker uploads SM_MODEL_DIR (the export) and, with checkpoint_s3_uri,
        # /opt/ml/checkpoints.
        logging.warning("--model_dir=%s: TensorFlow %s cannot write s3:// paths; checkpoints go to %s "
                        "(set the estimator's checkpoint_s3_uri to keep them), the export also to SM_MODEL_DIR",
                        model_dir, tf.__version__, SAGEMAKER_CHECKPOINTS)
        model_dir = SAGEMAKER_CHECKPOINTS
    steps = f.save_checkpoint_steps
    return dict(model_dir=model_dir,
                # SageMaker packages what the job leaves in SM_MODEL_DIR as the model to deploy.
                export_copy_dir=env.get("SM_MODEL_DIR"),
                save_checkpoint_steps=steps,
                save_checkpoint_secs=None if steps else f.save_checkpoint_secs,
                keep_checkpoint_max=f.keep_checkpoint_max,
                save_graph_def=f.save_graph_def,
                incremental_save_secs=f.incremental_save_secs,
                warm_start_from=f.warm_start_from,
                warm_start_map=read_warm_start_map(f),
                warm_start_slots=f.warm_start_slots,
                save_summaries_steps=f.save_summaries_steps,
                log_every_n_steps=f.log_every_n_steps,
                export_saved_model=f.export_saved_model,
                metrics_port=f.metrics_port)


def read_profile_steps(f) -> tuple[int, int] | None:
    try:
        profile = tuple(int(step) for step in f.profile_steps) or None
    except ValueError:
        profile = ()
    if profile is not None and (len(profile) != 2 or not 1 <= profile[0] <= profile[1]):
        raise app.UsageError(f"--profile_steps={','.join(f.profile_steps)}: expected FIRST,LAST local steps, "
                             "1 <= FIRST <= LAST, e.g. 100,110.")
    return profile


def check_accumulation(f):
    """Checks --accumulate_batches against the flags it cannot go with."""
    if f.accumulate_batches == 1:
        return
    if not f.sync_replicas:
        raise app.UsageError(f"--accumulate_batches={f.accumulate_batches} is for --sync_replicas; asynchronous "
                             "workers send one update per several batches with --local_steps.")
    check_dense_lever(f, "accumulate_batches")


def has_tables(f) -> bool:
    """Whether --model keeps embedding tables on the ps (model/needs.py), with this --embedding."""
    return model.has_tables(f.model, f.embedding)


def chosen_optimizer(f) -> str:
    """--optimizer if given, else the model's own default (model/needs.py), else the flag's default."""
    return f.optimizer if f["optimizer"].present else model.needs_of(f.model).default_optimizer or f.optimizer


def check_dense_lever(f, lever: str):
    """What --accumulate_batches refuses: 16-bit wire variables (it already moves each variable once per
    several batches) and a model with tables on the ps (a step moves only the rows it touches).
    --local_steps refuses the first only: it keeps a model's tables on the ps (training/step/local_steps.py)."""
    if f.wire_dtype != "float32":
        raise app.UsageError(f"--wire_dtype={f.wire_dtype} with --{lever}: choose one of the two.")
    if has_tables(f):
        raise app.UsageError(f"--{lever} with --model={f.model}: its embedding tables are partitioned across the "
                             "ps tasks and move only the rows a step touches; the lever is for dense models.")


def check_local_steps(f) -> None:
    """Checks --local_steps against the flags it cannot go with."""
    if f.local_steps == 1:
        return
    if f.sync_replicas:
        raise app.UsageError(
            f"--local_steps={f.local_steps} is for asynchronous training: a synchronous round already averages "
            "the workers' gradients; --accumulate_batches sends one gradient per several batches instead.")
    decided(plan.step_path, step_settings(f))  # what the flags alone refuse; the rest once the cluster is known
    if f.wire_dtype != "float32":
        raise app.UsageError(f"--wire_dtype={f.wire_dtype} with --local_steps: choose one of the two.")


def read_schedule(f) -> dict:
    """The learning-rate schedule's settings, checked."""
    if f.scale_learning_rate_by_replicas and not f.sync_replicas:
        raise app.UsageError("--scale_learning_rate_by_replicas applies with --sync_replicas (a step averages "
                             "several workers' gradients); asynchronous workers each apply their own.")
    boundaries, factors = (), ()
    if f.learning_rate_schedule == "piecewise":
        try:
            boundaries = tuple(int(b) for b in f.lr_boundaries)
            factors = tuple(float(v) for v in f.lr_factors)
        except ValueError:
            boundaries, factors = (), ()
        if (not boundaries or len(factors) != len(boundaries) + 1 or list(boundaries) != sorted(set(boundaries))):
            raise app.UsageError(
                f"--learning_rate_schedule=piecewise needs --lr_boundaries (increasing steps) and --lr_factors, one "
                f"more than the boundaries: got {','.join(f.lr_boundaries) or 'none'} and "
                f"{','.join(f.lr_factors) or 'none'} (e.g. --lr_boundaries=1000,2000 --lr_factors=1,0.1,0.01)")
    elif f.lr_boundaries or f.lr_factors:
        raise app.UsageError("--lr_boundaries and --lr_factors apply to --learning_rate_schedule=piecewise only.")
    return dict(lr_schedule=f.learning_rate_schedule, decay_steps=f.decay_steps, decay_rate=f.decay_rate,
                staircase=f.staircase, end_learning_rate=f.end_learning_rate, lr_boundaries=boundaries,
                lr_factors=factors, warmup_steps=f.warmup_steps)


def read_model(f, cluster: spec.ClusterConfig) -> model.ModelConfig:
    try:
        units = tuple(int(u) for u in f.hidden_units)
    except ValueError:
        units = ()
    if not units or min(units) < 1:
        raise app.UsageError(
            f"--hidden_units={','.join(f.hidden_units)} must be positive integers, e.g. 256 or 512,256.")
    try:
        user_fn.params_of(f.model_fn_params)
    except user_fn.ModelFnError as err:
        raise app.UsageError(str(err)) from None
    return model.ModelConfig(name=f.model, model_fn=f.model_fn, model_fn_params=tuple(f.model_fn_params),
                             hidden_units=units, hash_buckets=f.hash_buckets,
                             embedding_dim=f.embedding_dim, embedding=f.embedding,
                             embedding_capacity=f.embedding_capacity, embedding_min_count=f.embedding_min_count,
                             embedding_steps_to_live=f.embedding_steps_to_live, embedding_growth=f.embedding_growth,
                             combiner=f.combiner,
                             embedding_partitions=f.embedding_partitions or max(1, cluster.num_ps),
                             mark_touched_rows=f.incremental_save_secs > 0)


def read_data(f, cluster: spec.ClusterConfig, env) -> inputs.DataConfig:
    data_dir = f.data_dir or env.get("SM_CHANNEL_TRAINING")
    eval_data_dir = f.eval_data_dir or env.get("SM_CHANNEL_EVAL")
    name, cache = f.dataset, f.cache
    if cluster.job_name != spec.PS:  # a ps never reads data, and its host may not have it
        for flag, path in (("data_dir", data_dir), ("eval_data_dir", eval_data_dir), ("cache", cache)):
            problem = storage.problem(flag, path)
            if problem:
                raise app.UsageError(problem)
        name = read_dataset_name(f, data_dir, "--data_dir" if f.data_dir else "SM_CHANNEL_TRAINING")
    data = inputs.DataConfig(name=name, data_dir=data_dir, eval_data_dir=eval_data_dir,
                             synthetic_examples=f.synthetic_examples, seed=f.seed, cache=cache,
                             shuffle_buffer=f.shuffle_buffer,
                             skip_bad_records=f.skip_bad_records, label_column=f.label_column,
                             numeric_columns=tuple(f.numeric_columns),
                             categorical_columns=tuple(f.categorical_columns),
                             multi_valued_columns=read_multi_valued(f), num_classes=f.num_classes,
                             numeric_default=f.numeric_default, input_queue=bool(f.input_queue),
                             input_queue_lease_secs=f.input_queue_lease_secs,
                             input_queue_audit=f.input_queue_audit, group_column=f.group_column)
    if cluster.job_name == spec.PS:
        return data
    problem = inputs.DATASETS[name].check(data)
    if problem:
        raise app.UsageError(problem)
    check_group_column(data)
    check_multi_valued(data)
    path = decided(plan.input_path, input_settings(f, name, cluster))
    return dataclasses.replace(data, input_queue=path.queue, input_queue_by_default=path.by_default)


def check_group_column(data: inputs.DataConfig) -> None:
    """--group_column names a feature of the dataset, whose labels are two classes (an AUC's)."""
    if data.group_column is None:
        return
    data_spec = inputs.spec(data)
    if data.group_column not in data_spec.features:
        raise app.UsageError(f"--group_column={data.group_column} is not a feature of --dataset={data.name} (its "
                             f"features: {', '.join(sorted(data_spec.features))})")
    if data_spec.num_classes != 2:
        raise app.UsageError(f"--group_column: the group AUC is of two classes; --dataset={data.name} has "
                             f"{data_spec.num_classes}")


def check_multi_valued(data: inputs.DataConfig) -> None:
    """--multi_valued_columns names columns the dataset can read so (its MULTI_VALUED), none the group AUC
    groups by."""
    separators = data.separators()
    if not separators:
        return
    readable = inputs.DATASETS[data.name].MULTI_VALUED
    unknown = [name for name in separators if readable is not None and name not in readable]
    if unknown:
        can = f"only {', '.join(readable)}" if readable else "none"
        raise app.UsageError(f"--multi_valued_columns={unknown[0]}: --dataset={data.name} has {can} of them")
    if data.group_column in separators:
        raise app.UsageError(f"--group_column={data.group_column} is multi-valued (--multi_valued_columns): a group "
                             "is one value; name a single-valued column")


def read_dataset_name(f, data_dir: str | None, source: str) -> str:
    """--dataset, or with the default --dataset and a data directory, the format its files are in."""
    if not data_dir or not inputs.is_generated(f.dataset):
        return f.dataset
    if f["dataset"].present:
        raise app.UsageError(f"{source}={data_dir} is not read by --dataset={f.dataset} (generated data): "
                             f"drop it, or name its format with --dataset=tfrecord, csv or idx.")
    found = inputs.formats_in(data_dir)
    if len(found) != 1:
        held = f"holds {' and '.join(found)} files" if found else (
            "holds no train-*.tfrecord, train-*.csv or MNIST IDX (train-images-idx3-ubyte[.gz]) files")
        raise app.UsageError(f"{source}={data_dir} {held}: name the format to read with "
                             f"--dataset=tfrecord, csv or idx.")
    return found[0]
