"""The JobSet path (launch/jobset.py, scripts/make_jobset.py): the manifest passes JobSet's own CRD
schema and Kubernetes' schemas; what it cannot be is refused in one line; and a job started with exactly
the environment each of its pods would get trains to the end, a ps killed and restarted included.

tests/data/jobset-v1alpha2-v0.12.0.json is the openAPIV3Schema of JobSet's CRD
(kubernetes-sigs/jobset v0.12.0, commit f22e565, config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml,
Apache-2.0), version v1alpha2, with its 'description' fields removed (80 KB instead of 820 KB).
tests/data/trainer-trainingruntime-v1alpha1-8c0f505.json and trainer-trainjob-v1alpha1-8c0f505.json are
those of Kubeflow Trainer v2's TrainingRuntime and TrainJob CRDs (kubeflow/trainer, commit 8c0f505,
2026-08-21, v1.5.0-rc.0 and later, manifests/base/crds/, Apache-2.0), version v1alpha1, with their
'description' fields removed; its ClusterTrainingRuntime's schema there is the TrainingRuntime's."""

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import jsonschema
import kubernetes_validate
import pytest
import yaml

from ps_trainer.cluster import resolve
from ps_trainer.launch import jobset
from ps_trainer.launch.netns import Hosts, start_in
from tests.support import DATA, ROOT, finished, run_script, wait_for

SCHEMA = json.loads((DATA / "jobset-v1alpha2-v0.12.0.json").read_text())
TRAINER_SCHEMAS = {kind: json.loads((DATA / f"trainer-{kind.lower()}-v1alpha1-8c0f505.json").read_text())
                   for kind in ("TrainingRuntime", "TrainJob")}
TRAINER_SCHEMAS["ClusterTrainingRuntime"] = TRAINER_SCHEMAS["TrainingRuntime"]
KUBERNETES = "1.30.0"
JOB = jobset.JobSetSpec(name="ctr", image="registry.example/ps-trainer:1", model_dir="/mnt/model/ctr",
                        namespace="team", num_ps=2, num_workers=2, trainer_args=("--model=wide_deep",),
                        volume_claim="training-data", queue="team-queue")


def unknown_fields(value, schema, path="") -> list[str]:
    """Keys of `value` its schema does not name (a CRD's schema lets them through; the API server would
    drop them without a word)."""
    found = []
    if isinstance(value, dict) and "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        for key, item in value.items():
            if key not in schema["properties"]:
                found.append(f"{path}.{key}")
            else:
                found += unknown_fields(item, schema["properties"][key], f"{path}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            found += unknown_fields(item, schema["items"], f"{path}[{i}]")
    return found


@pytest.mark.pure
def test_the_jobset_passes_jobsets_crd_schema_and_names_no_field_it_does_not_know():
    manifest = jobset.jobset(JOB)
    jsonschema.Draft7Validator(SCHEMA).validate(manifest)
    assert unknown_fields(manifest, SCHEMA) == []
    broken = jobset.jobset(JOB)
    broken["spec"]["failurePolicy"]["rules"][0]["action"] = "Retry"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(SCHEMA).validate(broken)
    broken["spec"]["successPolicy"]["targetJobs"] = ["chief"]
    assert unknown_fields(broken, SCHEMA) == [".spec.successPolicy.targetJobs"]


@pytest.mark.pure
def test_the_trainer_v2_pair_passes_its_crd_schemas_and_runs_the_same_jobset():
    runtime, train_job = jobset.trainer_v2(JOB)
    for document in (runtime, train_job):
        schema = TRAINER_SCHEMAS[document["kind"]]
        jsonschema.Draft7Validator(schema).validate(document)
        assert unknown_fields(document, schema) == [], document["kind"]
    made = jobset.jobset(JOB)
    assert runtime["spec"]["template"]["spec"] == made["spec"]
    assert train_job["metadata"] == made["metadata"]  # the JobSet's name and namespace, and the Kueue label
    assert train_job["spec"] == {"runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime",
                                                "name": runtime["metadata"]["name"]}}
    # The controller names the JobSet after the TrainJob: its pods read the cluster as the JobSet's do.
    pods = jobset.pod_environments({"metadata": train_job["metadata"], "spec": runtime["spec"]["template"]["spec"]})
    assert pods == jobset.pod_environments(made)
    assert resolve.resolve(None, pods[("worker", 1)]).cluster.ps_hosts == ("ctr-ps-0-0.ctr:2222", "ctr-ps-0-1.ctr:2222")
    del train_job["spec"]["runtimeRef"]["name"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(TRAINER_SCHEMAS["TrainJob"]).validate(train_job)
    runtime, train_job = jobset.trainer_v2(JOB, cluster_runtime=True)  # one runtime for every namespace
    jsonschema.Draft7Validator(TRAINER_SCHEMAS[runtime["kind"]]).validate(runtime)
    assert runtime["kind"] == train_job["spec"]["runtimeRef"]["kind"] == "ClusterTrainingRuntime"
    assert "namespace" not in runtime["metadata"] and train_job["metadata"]["namespace"] == "team"


@pytest.mark.pure
def test_every_job_and_pod_of_it_and_the_network_policy_pass_kubernetes_own_schemas():
    kubernetes_validate.validate(jobset.network_policy(JOB), KUBERNETES, strict=True)
    for replicated in jobset.jobset(JOB)["spec"]["replicatedJobs"]:
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"ctr-{replicated['name']}-0"},
               "spec": replicated["template"]["spec"]}
        kubernetes_validate.validate(job, KUBERNETES, strict=True)


@pytest.mark.pure
def test_the_jobset_succeeds_with_its_chief_and_evaluator_and_fails_at_once_on_a_permanent_exit():
    manifest = jobset.jobset(JOB)
    assert manifest["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "team-queue"}
    assert manifest["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["chief", "evaluator"]}
    assert manifest["spec"]["failurePolicy"]["rules"] == [
        {"name": "permanent-exit-code", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}]
    jobs = {replicated["name"]: replicated["template"]["spec"] for replicated in manifest["spec"]["replicatedJobs"]}
    assert {name: job["completions"] for name, job in jobs.items()} == {"ps": 2, "chief": 1, "worker": 2,
                                                                         "evaluator": 1}
    for job in jobs.values():  # the exit codes' rule, the TFJob path's: launch/kubeflow.pod_failure_policy
        assert job["completionMode"] == "Indexed" and job["template"]["spec"]["restartPolicy"] == "Never"
        assert job["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"] == [130, 137, 138, 143]


@pytest.mark.parametrize("change, message", [
    (dict(image=""), "--image is empty"),
    (dict(num_ps=0), "--num_ps=0 --num_workers=2: a job needs at least one ps"),
    (dict(num_workers=-1), "--num_ps=2 --num_workers=-1"),
    (dict(volume_claim=None), "--model_dir=/mnt/model/ctr is a local path and no --volume_claim is given"),
    (dict(model_dir="/data/ctr"), "--model_dir=/data/ctr is not on the volume, which is mounted at /mnt/model"),
])
@pytest.mark.pure
def test_a_jobset_that_cannot_run_is_refused_in_one_line(change, message):
    job = dataclasses.replace(JOB, **change)
    assert job.problem().startswith(message) and "\n" not in job.problem()
    with pytest.raises(ValueError, match=message):
        jobset.jobset(job)
    assert dataclasses.replace(JOB, volume_claim=None, model_dir="gs://bucket/ctr").problem() is None


@pytest.mark.e2e
def test_the_script_writes_both_documents_and_refuses_in_one_line():
    result = run_script("make_jobset.py", "--name=ctr", "--image=img:1", "--model_dir=gs://bucket/ctr",
                        "--evaluator=false", "--", "--sync_replicas", timeout=60)
    assert result.returncode == 0, result.stderr
    manifest, policy = yaml.safe_load_all(result.stdout)
    jsonschema.Draft7Validator(SCHEMA).validate(manifest)
    assert [job["name"] for job in manifest["spec"]["replicatedJobs"]] == ["ps", "chief", "worker"]
    assert policy["kind"] == "NetworkPolicy"
    trainer_v2 = run_script("make_jobset.py", "--kind=trainjob", "--name=ctr", "--image=img:1",
                            "--model_dir=gs://bucket/ctr", timeout=60)
    assert trainer_v2.returncode == 0, trainer_v2.stderr
    assert [document["kind"] for document in yaml.safe_load_all(trainer_v2.stdout)] == [
        "TrainingRuntime", "TrainJob", "NetworkPolicy"]
    refused = run_script("make_jobset.py", "--name=ctr", "--image=img:1", "--model_dir=/data/ctr", timeout=60)
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.strip().splitlines()[-1].startswith("make_jobset.py: --model_dir=/data/ctr is a local path")


@pytest.mark.pure
def test_each_pod_resolves_the_cluster_from_the_environment_the_manifest_gives_it():
    pods = jobset.pod_environments(jobset.jobset(JOB))
    assert sorted(pods) == [("chief", 0), ("evaluator", 0), ("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1)]
    clusters = {pod: resolve.resolve(None, env).cluster for pod, env in pods.items()}
    assert {pod: (cluster.job_name, cluster.task_index) for pod, cluster in clusters.items()} == {
        pod: pod for pod in pods}
    assert clusters[("worker", 1)].ps_hosts == ("ctr-ps-0-0.ctr:2222", "ctr-ps-0-1.ctr:2222")
    assert {cluster.ps_hosts for cluster in clusters.values()} == {clusters[("ps", 0)].ps_hosts}


@pytest.mark.pure
def test_a_program_jobset_runs_the_program_in_every_pod_whose_run_config_reads_that_pods_task(monkeypatch):
    job = dataclasses.replace(JOB, program="census_wide_deep.py", model_dir="",
                              trainer_args=("--model_dir=/mnt/model/census", "--train_steps=1000"))
    assert job.problem() is None
    assert dataclasses.replace(job, program="census").problem() == "--program=census: give the program's .py file"
    manifest = jobset.jobset(job)
    jsonschema.Draft7Validator(SCHEMA).validate(manifest)
    for replicated in manifest["spec"]["replicatedJobs"]:
        container = replicated["template"]["spec"]["template"]["spec"]["containers"][0]
        assert container["command"] == ["python", "census_wide_deep.py"]
        assert container["args"] == ["--model_dir=/mnt/model/census", "--train_steps=1000"]
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "0")  # the import's default, kept from this test process
    monkeypatch.delenv("TF_CONFIG", raising=False)
    from ps_trainer.estimator import RunConfig
    for (job_name, index), env in jobset.pod_environments(manifest).items():
        with monkeypatch.context() as pod:
            for name, value in env.items():
                pod.setenv(name, value)
            config = RunConfig()
        assert (config.task_type, config.task_id) == (job_name, index)
        assert config.is_chief == (job_name == "chief")
        assert (config.num_ps_replicas, config.num_worker_replicas) == (2, 3)


@pytest.fixture
def pod_hosts():
    """Network namespaces as pods, each with its own address and an /etc/hosts (ip netns exec mounts
    /etc/netns/<namespace>/hosts) that maps every pod's JobSet host name to its address."""
    if shutil.which("ip") is None:
        pytest.skip("iproute2 ('ip') is not installed")
    made = []

    def make(names):
        try:
            hosts = Hosts(len(names))
        except subprocess.CalledProcessError as err:
            pytest.skip(f"cannot create network namespaces here: {err.stderr.decode().strip()}")
        made.append(hosts)
        table = "127.0.0.1 localhost\n" + "".join(f"{hosts.address(i)} {name}\n" for i, name in enumerate(names))
        for namespace in hosts.names:
            os.makedirs(f"/etc/netns/{namespace}", exist_ok=True)
            with open(f"/etc/netns/{namespace}/hosts", "w", encoding="utf-8") as f:
                f.write(table)
        return hosts

    yield make
    for hosts in made:
        for namespace in hosts.names:
            shutil.rmtree(f"/etc/netns/{namespace}", ignore_errors=True)
        hosts.close()


def stop(proc):
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.mark.e2e
def test_pods_started_with_their_manifest_environment_train_to_the_end_through_a_ps_restart(tmp_path, pod_hosts):
    spec = jobset.JobSetSpec(name="ctr", image="unused", model_dir=f"{jobset.MOUNT_PATH}/ctr", num_ps=1, num_workers=1,
                             evaluator=False, volume_claim="model",
                             trainer_args=("--train_steps=800", "--log_every_n_steps=100", "--save_checkpoint_secs=3"))
    manifest = jobset.jobset(spec)
    pods = jobset.pod_environments(manifest)
    volume = tmp_path / "volume"  # what the claim mounts at /mnt/model in every pod
    hosts = pod_hosts([resolve.jobset_host("ctr", job, index, "ctr", jobset.PORT).split(":")[0]
                       for job, index in pods])
    namespaces = dict(zip(pods, hosts.names))
    [container] = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"]
    command = [sys.executable, str(ROOT / "trainer.py"),
               *(arg.replace(jobset.MOUNT_PATH, str(volume)) for arg in container["args"])]
    logs = {pod: tmp_path / f"{pod[0]}-{pod[1]}.log" for pod in pods}

    def start(pod, mode="w"):
        env = {**os.environ, **pods[pod], "TF_CPP_MIN_LOG_LEVEL": "1"}
        return start_in(namespaces[pod], command, env, log=open(logs[pod], mode))

    tasks = {pod: start(pod) for pod in pods}
    try:
        chief = ("chief", 0)
        wait_for(lambda: " step " in logs[chief].read_text() and any(
            (volume / "ctr").glob("model.ckpt-*.index")), 240, "the chief's first steps and checkpoint")
        stop(tasks[("ps", 0)])  # a ps pod killed: its Job starts it again, with the same environment
        steps_before_kill = max((int(step) for step in re.findall(r" step (\d+)/\d+ loss", logs[chief].read_text())),
                                default=0)
        tasks[("ps", 0)] = start(("ps", 0), mode="a")
        codes = {pod: task.wait(timeout=300) for pod, task in tasks.items()}
    finally:
        for task in tasks.values():
            stop(task)
    texts = {pod: path.read_text() for pod, path in logs.items()}
    assert codes == {pod: 0 for pod in pods}, {pod: text[-2000:] for pod, text in texts.items()}
    assert "JobSet ctr (PS_TRAINER_JOBSET)" in texts[("chief", 0)]  # the first lines name the cluster's source
    result = finished(texts[("chief", 0)])
    assert int(result["global_step"]) >= 800 and float(result["heldout_accuracy"]) > 0.5, result  # chance: 0.1
    assert steps_before_kill < 800 and texts[("ps", 0)].count("cluster from JobSet ctr") == 2  # killed mid-run
