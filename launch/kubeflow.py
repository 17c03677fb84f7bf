"""Kubernetes manifests for a Kubeflow TFJob of this trainer, and a NetworkPolicy for its port.

The training operator starts one pod per replica and gives each a TF_CONFIG that trainer.py reads (or a
user's TF1 Estimator program, `program`, whose RunConfig reads it as TF1's did): PS, Chief, Worker and
Evaluator replicas run the same command. cleanPodPolicy Running removes pods
still running when the job ends, so no ps outlives it; the NetworkPolicy lets only the job's own
pods reach the gRPC port, which has no authentication.

Every replica restarts under `restartPolicy: ExitCode`: the operator restarts a pod whose exit code
is retryable (130, 137, 143, and 138, which the trainer uses for its own transient outcomes:
training/exit_codes.py) and fails the job on any other non-zero code, so a bad flag or a run
stopped as not learning is not restarted again and again. The job is Succeeded when the chief
completes (successPolicy's default), not when every ps does: the ps tasks exit 0 after the
workers, or are removed by cleanPodPolicy.
"""

import dataclasses

from ps_trainer.training import exit_codes

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
    # Restarts of the job's pods (preemptions, stalls, lost nodes) before the operator fails the job.
    backoff_limit: int = 10
    # Each training pod serves Prometheus metrics on this port (--metrics_port), with the scrape
    # annotations; None: no metrics.
    metrics_port: int | None = None
    volume_claim: str | None = None  # a PVC holding model_dir, mounted at MOUNT_PATH
    cpu: str = "2"
    memory: str = "4Gi"
    # A user's TF1 Estimator program (a path in the image's working directory) that every replica runs in
    # place of trainer.py, with trainer_args as its own flags (its model_dir among them).
    program: str | None = None

    def problem(self) -> str | None:
        """What makes this TFJob unusable, in one line, or None."""
        if self.program and not self.program.endswith(".py"):
            return f"--program={self.program}: give the program's .py file"
        if self.program and self.metrics_port:
            return (f"--metrics_port={self.metrics_port} with --program: the metrics are trainer.py's "
                    "(--metrics_port is its flag, not the program's)")
        if not self.program and not self.model_dir:
            return "--model_dir is empty: give the model_dir every replica can reach"
        return None


MOUNT_PATH = "/mnt/model"


def tfjob(job: TFJobSpec) -> dict:
    problem = job.problem()
    if problem:
        raise ValueError(problem)
    replicas = {"PS": job.num_ps, "Chief": 1, "Worker": job.num_workers}
    if job.evaluator:
        replicas["Evaluator"] = 1
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": job.name, "namespace": job.namespace},
        "spec": {
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": job.backoff_limit},
            "successPolicy": "",  # the default, said aloud: Succeeded when the chief is
            "tfReplicaSpecs": {kind: _replica(job, count) for kind, count in replicas.items() if count},
        },
    }


def _replica(job: TFJobSpec, count: int) -> dict:
    container = {
        "name": CONTAINER,
        "image": job.image,
        "command": ["python", job.program or "trainer.py"],
        "args": [*([] if job.program else [f"--model_dir={job.model_dir}"]), *job.trainer_args],
        "ports": [{"name": PORT_NAME, "containerPort": PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": job.cpu, "memory": job.memory}},
    }
    pod = {"containers": [container]}
    template = {"spec": pod}
    if job.metrics_port:
        container["args"].append(f"--metrics_port={job.metrics_port}")
        container["ports"].append({"name": "metrics", "containerPort": job.metrics_port, "protocol": "TCP"})
        template["metadata"] = {"annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": str(
            job.metrics_port), "prometheus.io/path": "/metrics"}}
    if job.volume_claim:
        container["volumeMounts"] = [{"name": "model", "mountPath": MOUNT_PATH}]
        pod["volumes"] = [{"name": "model", "persistentVolumeClaim": {"claimName": job.volume_claim}}]
    # ExitCode: a transient ending restarts the replica, which resumes from the latest checkpoint;
    # a permanent one (exit 1) fails the job.
    return {"replicas": count, "restartPolicy": RESTART_POLICY, "template": template}


RESTART_POLICY = "ExitCode"


def operator_restarts(restart_policy: str, code: int) -> bool:
    """What the training operator does with a replica's container that exited with `code` (its
    pod-restart rule, kubeflow/trainer's IsRetryableExitCode for ExitCode)."""
    if code == exit_codes.OK:
        return restart_policy == "Always"
    return {"Always": True, "OnFailure": True, "Never": False,
            "ExitCode": code in exit_codes.KUBEFLOW_RETRYABLE}[restart_policy]


def pod_failure_policy(container: str = CONTAINER) -> dict:
    """A Kubernetes Job's podFailurePolicy with the same rule, for a task run as a plain Job (its pod
    template needs restartPolicy: Never): a permanent exit code fails the Job at once; a pod evicted
    or preempted (the DisruptionTarget condition) does not count against its backoffLimit."""
    return {"rules": [
        {"action": "FailJob", "onExitCodes": {"containerName": container, "operator": "NotIn",
                                              "values": sorted(exit_codes.KUBEFLOW_RETRYABLE)}},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    ]}


def network_policy(job: TFJobSpec) -> dict:
    return grpc_network_policy(job.name, job.namespace, JOB_NAME_LABEL, PORT, job.metrics_port)


def grpc_network_policy(name: str, namespace: str, job_label: str, port: int, metrics_port: int | None = None) -> dict:
    """Only the pods labelled `job_label: name` reach the job's gRPC port (which has no authentication);
    the metrics port, if any, is open to a scraper in any namespace."""
    own_pods = {"matchLabels": {job_label: name}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": f"{name}-grpc", "namespace": namespace},
        "spec": {
            "podSelector": own_pods,
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": own_pods}], "ports": [{"protocol": "TCP", "port": port}]}] + (
                [{"from": [{"namespaceSelector": {}}], "ports": [{"protocol": "TCP", "port": metrics_port}]}]
                if metrics_port else []),
        },
    }
