"""Kubernetes manifests for a JobSet (kubernetes-sigs/jobset, API jobset.x-k8s.io/v1alpha2) of this
trainer, and a NetworkPolicy for its port.

Each task kind is a replicated job of one Indexed Job whose pods are its tasks: ps, chief, worker and,
if asked, evaluator. JobSet gives every pod a stable DNS name through a headless Service it makes
itself (<jobset>-<replicated job>-0-<index>.<jobset>); trainer.py reads the cluster from the pod's
environment (cluster/resolve.from_jobset): the layout, set once here, and the pod's JobSet annotations
through the downward API.

Exit codes (training/exit_codes.py) decide what happens to a pod that fails: its Job's
podFailurePolicy fails the Job at once on a permanent code (1, bad flags, not learning) and the
JobSet's failurePolicy then fails the JobSet; a transient code (130, 137, 138, 143) restarts the pod,
which resumes from the latest checkpoint, up to the Job's backoffLimit; a pod evicted or preempted
does not count. The JobSet succeeds when the chief's Job (and the evaluator's, which evaluates the
final checkpoint after the chief ends) succeeds; the ps tasks exit 0 on their own.

Kubeflow Trainer v2 (API trainer.kubeflow.org/v1alpha1) runs the same JobSet: a namespaced TrainingRuntime
whose template is this JobSet's spec, and a TrainJob of the same name that refers to it (trainer_v2()).
The TrainJob sets no `trainer` (which would apply to a replicated job of Trainer v2's "node" kind,
which this one has none of), so the controller makes the JobSet as the template says, named after the
TrainJob: the pods read the same environment and the same host names.
"""

import dataclasses
import json

from ps_trainer.cluster import resolve, spec
from ps_trainer.launch import kubeflow

API_VERSION = "jobset.x-k8s.io/v1alpha2"
TRAINER_API_GROUP = "trainer.kubeflow.org"
TRAINER_API_VERSION = f"{TRAINER_API_GROUP}/v1alpha1"
PORT = 2222
CONTAINER = "trainer"
MOUNT_PATH = "/mnt/model"
JOBSET_NAME_KEY = "jobset.sigs.k8s.io/jobset-name"
# The pod's own JobSet annotations, as the environment variables cluster/resolve.py reads.
DOWNWARD_ENV = {
    resolve.JOBSET_NAME: JOBSET_NAME_KEY,
    resolve.JOBSET_REPLICATED_JOB: "jobset.sigs.k8s.io/replicatedjob-name",
    resolve.JOBSET_JOB_INDEX: "jobset.sigs.k8s.io/job-index",
}
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
REMOTE_PREFIXES = ("gs://",)  # a model_dir every pod shares without a volume (TensorFlow 2.21 writes no s3://)


@dataclasses.dataclass(frozen=True)
class JobSetSpec:
    name: str
    image: str
    model_dir: str
    namespace: str = "default"
    num_ps: int = 1
    num_workers: int = 2  # besides the chief
    evaluator: bool = True
    trainer_args: tuple[str, ...] = ()
    volume_claim: str | None = None  # a PVC holding model_dir, mounted at MOUNT_PATH
    queue: str | None = None  # a Kueue LocalQueue that admits the JobSet
    backoff_limit: int = 10  # restarts of one task kind's pods (transient exits) before its Job fails
    max_restarts: int = 3  # restarts of the whole JobSet after a Job failed for another reason
    cpu: str = "2"
    memory: str = "4Gi"
    # A user's TF1 Estimator program (a path in the image's working directory) that every pod runs in place
    # of trainer.py, with trainer_args as its own flags: its RunConfig reads the pod's task from the same
    # environment trainer.py does (ps_trainer/estimator/run_config.py). Its model_dir is its own flags'.
    program: str | None = None

    def problem(self) -> str | None:
        """What makes this JobSet unusable, in one line, or None."""
        if not self.image:
            return "--image is empty: give the container image the Dockerfile builds"
        if self.num_ps < 1 or self.num_workers < 0:
            return (f"--num_ps={self.num_ps} --num_workers={self.num_workers}: a job needs at least one ps, "
                    "and no fewer than 0 workers besides the chief")
        if self.program:
            return None if self.program.endswith(".py") else f"--program={self.program}: give the program's .py file"
        if not self.model_dir:
            return "--model_dir is empty"
        if self.model_dir.startswith(REMOTE_PREFIXES):
            return None
        if not self.volume_claim:
            return (f"--model_dir={self.model_dir} is a local path and no --volume_claim is given: every pod "
                    f"needs the same directory (a volume mounted at {MOUNT_PATH}, or a gs:// path)")
        if not (self.model_dir + "/").startswith(MOUNT_PATH + "/"):
            return f"--model_dir={self.model_dir} is not on the volume, which is mounted at {MOUNT_PATH}"
        return None

    @property
    def counts(self) -> dict[str, int]:
        return {spec.PS: self.num_ps, spec.CHIEF: 1, spec.WORKER: self.num_workers,
                spec.EVALUATOR: int(self.evaluator)}


def layout(job: JobSetSpec) -> str:
    """PS_TRAINER_JOBSET's value: the replica counts and the port, the one place they are written."""
    return json.dumps({**{name: count for name, count in job.counts.items() if count}, "port": PORT},
                      separators=(",", ":"))


def jobset(job: JobSetSpec) -> dict:
    problem = job.problem()
    if problem:
        raise ValueError(problem)
    metadata = {"name": job.name, "namespace": job.namespace}
    if job.queue:
        metadata["labels"] = {KUEUE_QUEUE_LABEL: job.queue}
    targets = [spec.CHIEF] + ([spec.EVALUATOR] if job.evaluator else [])
    return {
        "apiVersion": API_VERSION,
        "kind": "JobSet",
        "metadata": metadata,
        "spec": {
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": targets},
            "failurePolicy": {"maxRestarts": job.max_restarts, "rules": [
                # A Job failed by its podFailurePolicy: a permanent exit code, which no restart mends.
                {"name": "permanent-exit-code", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]},
            ]},
            "replicatedJobs": [_replicated_job(job, name, count) for name, count in job.counts.items() if count],
        },
    }


def _replicated_job(job: JobSetSpec, name: str, count: int) -> dict:
    env = [{"name": resolve.JOBSET_LAYOUT, "value": layout(job)}] + [
        {"name": variable, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{key}']"}}}
        for variable, key in DOWNWARD_ENV.items()]
    container = {
        "name": CONTAINER,
        "image": job.image,
        "command": ["python", job.program or "trainer.py"],
        "args": [*([] if job.program else [f"--model_dir={job.model_dir}"]), *job.trainer_args],
        "env": env,
        "ports": [{"name": "grpc", "containerPort": PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": job.cpu, "memory": job.memory}},
    }
    pod = {"restartPolicy": "Never", "containers": [container]}  # Never: podFailurePolicy needs it
    if job.volume_claim:
        container["volumeMounts"] = [{"name": "model", "mountPath": MOUNT_PATH}]
        pod["volumes"] = [{"name": "model", "persistentVolumeClaim": {"claimName": job.volume_claim}}]
    return {"name": name, "replicas": 1, "template": {"spec": {
        "completionMode": "Indexed", "completions": count, "parallelism": count,
        "backoffLimit": job.backoff_limit, "podFailurePolicy": kubeflow.pod_failure_policy(CONTAINER),
        "template": {"spec": pod}}}}


def trainer_v2(job: JobSetSpec, cluster_runtime: bool = False) -> list[dict]:
    """The Kubeflow Trainer v2 pair for the job: a runtime holding the JobSet as its template and the
    TrainJob that runs it. The runtime is a TrainingRuntime in the TrainJob's namespace (nothing
    cluster-wide to install), or with `cluster_runtime` a ClusterTrainingRuntime (the same spec, for
    every namespace). The Kueue label goes on the TrainJob, which Kueue admits."""
    made = jobset(job)
    kind = "ClusterTrainingRuntime" if cluster_runtime else "TrainingRuntime"
    metadata = {"name": job.name} if cluster_runtime else {"name": job.name, "namespace": job.namespace}
    runtime = {"apiVersion": TRAINER_API_VERSION, "kind": kind, "metadata": metadata,
               "spec": {"template": {"spec": made["spec"]}}}
    train_job = {"apiVersion": TRAINER_API_VERSION, "kind": "TrainJob", "metadata": made["metadata"],
                 "spec": {"runtimeRef": {"apiGroup": TRAINER_API_GROUP, "kind": kind, "name": job.name}}}
    return [runtime, train_job]


def network_policy(job: JobSetSpec) -> dict:
    """Only the JobSet's own pods reach its gRPC port (which has no authentication)."""
    return kubeflow.grpc_network_policy(job.name, job.namespace, JOBSET_NAME_KEY, PORT)


def pod_environments(manifest: dict) -> dict[tuple[str, int], dict[str, str]]:
    """What each pod of a JobSet manifest gets in its environment, as the JobSet controller, Kubernetes and
    the downward API would set it: (replicated job, index) -> {variable: value}."""
    name = manifest["metadata"]["name"]
    annotations_of = {"jobset.sigs.k8s.io/jobset-name": lambda rjob: name,
                      "jobset.sigs.k8s.io/replicatedjob-name": lambda rjob: rjob,
                      "jobset.sigs.k8s.io/job-index": lambda rjob: "0"}
    pods = {}
    for replicated in manifest["spec"]["replicatedJobs"]:
        job_spec = replicated["template"]["spec"]
        [container] = job_spec["template"]["spec"]["containers"]
        for index in range(job_spec["completions"]):
            env = {"JOB_COMPLETION_INDEX": str(index)}
            for variable in container["env"]:
                if "value" in variable:
                    env[variable["name"]] = variable["value"]
                else:
                    path = variable["valueFrom"]["fieldRef"]["fieldPath"]
                    key = path[len("metadata.annotations['"):-2]
                    env[variable["name"]] = annotations_of[key](replicated["name"])
            pods[(replicated["name"], index)] = env
    return pods
