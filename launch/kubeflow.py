"""Kubernetes manifests for a Kubeflow TFJob of this trainer, and a NetworkPolicy for its port.

The training operator starts one pod per replica and gives each a TF_CONFIG that trainer.py reads:
PS, Chief, Worker and Evaluator replicas run the same command. cleanPodPolicy Running removes pods
still running when the job ends, so no ps outlives it; the NetworkPolicy lets only the job's own
pods reach the gRPC port, which has no authentication.
"""

import dataclasses

PORT = 2222
PORT_NAME = "tfjob-port"  # the operator finds the port by this name
CONTAINER = "tensorflow"  # the operator's webhook requires this container name
JOB_NAME_LABEL = "training.kubeflow.org/job-name"  # set by the operator on every pod of the job


@dataclasses.dataclass(frozen=True)
class TFJobSpec:
    name: str
    image: str
    model_dir: str
    namespace: str = "default"
    num_ps: int = 1
    num_workers: int = 2
    evaluator: bool = True
    trainer_args: tuple[str, ...] = ()
    volume_claim: str | None = None  # a PVC holding model_dir, mounted at MOUNT_PATH
    cpu: str = "2"
    memory: str = "4Gi"


MOUNT_PATH = "/mnt/model"


def tfjob(job: TFJobSpec) -> dict:
    replicas = {"PS": job.num_ps, "Chief": 1, "Worker": job.num_workers}
    if job.evaluator:
        replicas["Evaluator"] = 1
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": job.name, "namespace": job.namespace},
        "spec": {
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 3},
            "tfReplicaSpecs": {kind: _replica(job, count) for kind, count in replicas.items() if count},
        },
    }


def _replica(job: TFJobSpec, count: int) -> dict:
    container = {
        "name": CONTAINER,
        "image": job.image,
        "command": ["python", "trainer.py"],
        "args": [f"--model_dir={job.model_dir}", *job.trainer_args],
        "ports": [{"name": PORT_NAME, "containerPort": PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": job.cpu, "memory": job.memory}},
    }
    pod = {"containers": [container]}
    if job.volume_claim:
        container["volumeMounts"] = [{"name": "model", "mountPath": MOUNT_PATH}]
        pod["volumes"] = [{"name": "model", "persistentVolumeClaim": {"claimName": job.volume_claim}}]
    # OnFailure: a replica that crashes restarts in place and resumes from the latest checkpoint.
    return {"replicas": count, "restartPolicy": "OnFailure", "template": {"spec": pod}}


def network_policy(job: TFJobSpec) -> dict:
    own_pods = {"matchLabels": {JOB_NAME_LABEL: job.name}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": f"{job.name}-grpc", "namespace": job.namespace},
        "spec": {
            "podSelector": own_pods,
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": own_pods}], "ports": [{"protocol": "TCP", "port": PORT}]}],
        },
    }
