#!/usr/bin/env python3
"""Writes a JobSet manifest (kubernetes-sigs/jobset) for this trainer, with a NetworkPolicy guarding its
gRPC port: ps, chief, worker and evaluator tasks, each kind an Indexed Job. With --kind=trainjob, the same
JobSet as a Kubeflow Trainer v2 TrainingRuntime and the TrainJob that runs it.

    python scripts/make_jobset.py --name=ctr --image=registry.example/ps-trainer:1 \\
        --model_dir=/mnt/model/ctr --volume_claim=training-data -- --model=wide_deep --train_steps=20000 > job.yaml
    kubectl apply -f job.yaml

A TF1 Estimator program (ps_trainer.estimator) in the image runs in every pod in place of trainer.py:

    python scripts/make_jobset.py --name=census --image=registry.example/my-program:1 \\
        --program=census_wide_deep.py --volume_claim=training-data -- --model_dir=/mnt/model/census

Flags after '--' go to every trainer.py (or the program). A manifest it cannot write (no image, no ps, a local
model_dir without a volume) is refused in one line, exit 1. Needs PyYAML (pip install -e '.[kubeflow]').
"""

import sys

import yaml
from absl import app, flags

from ps_trainer.launch import jobset

flags.DEFINE_string("name", None, "JobSet name (a DNS label).", required=True)
flags.DEFINE_string("image", "", "Container image with ps-trainer installed in its working dir (the Dockerfile's).")
flags.DEFINE_string("model_dir", "", f"model_dir every pod reaches: on --volume_claim (under {jobset.MOUNT_PATH}) "
                    "or a gs:// path.")
flags.DEFINE_string("namespace", "default", "Kubernetes namespace.")
flags.DEFINE_integer("num_ps", 1, "ps tasks.")
flags.DEFINE_integer("num_workers", 2, "Worker tasks besides the chief.")
flags.DEFINE_boolean("evaluator", True, "Add an evaluator task.")
flags.DEFINE_string("volume_claim", None, f"PVC to mount at {jobset.MOUNT_PATH} in every pod.")
flags.DEFINE_string("queue", None, "Kueue LocalQueue to admit the JobSet (the kueue.x-k8s.io/queue-name label).")
flags.DEFINE_enum("kind", "jobset", ["jobset", "trainjob"], "jobset: a JobSet; trainjob: the same JobSet as a "
                  "Kubeflow Trainer v2 TrainingRuntime and the TrainJob that runs it.")
flags.DEFINE_boolean("cluster_runtime", False, "--kind=trainjob: a ClusterTrainingRuntime (for every namespace) "
                     "instead of a TrainingRuntime in --namespace.")
flags.DEFINE_string("program", None, "A TF1 Estimator program (its path in the image's working dir) that every pod "
                    "runs in place of trainer.py; the flags after '--' are its own, its model_dir among them.")
flags.DEFINE_integer("backoff_limit", 10, "Restarts of one task kind's pods after transient exits.", lower_bound=0)
FLAGS = flags.FLAGS


def main(argv):
    job = jobset.JobSetSpec(
        name=FLAGS.name, image=FLAGS.image, model_dir=FLAGS.model_dir, namespace=FLAGS.namespace,
        num_ps=FLAGS.num_ps, num_workers=FLAGS.num_workers, evaluator=FLAGS.evaluator,
        trainer_args=tuple(argv[1:]), volume_claim=FLAGS.volume_claim, queue=FLAGS.queue,
        backoff_limit=FLAGS.backoff_limit, program=FLAGS.program)
    problem = job.problem()
    if problem:
        sys.exit(f"make_jobset.py: {problem}")
    documents = (jobset.trainer_v2(job, FLAGS.cluster_runtime) if FLAGS.kind == "trainjob" else
                 [jobset.jobset(job)])
    yaml.safe_dump_all([*documents, jobset.network_policy(job)], sys.stdout, sort_keys=False)


if __name__ == "__main__":
    app.run(main)
