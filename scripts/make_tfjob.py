#!/usr/bin/env python3
"""Writes a Kubeflow TFJob manifest for this trainer, with a NetworkPolicy guarding its gRPC port.

    python scripts/make_tfjob.py --name=mnist --image=registry.example/ps-trainer:1 \\
        --model_dir=/mnt/model/mnist --volume_claim=training-data -- --train_steps=20000 > job.yaml
    kubectl apply -f job.yaml

A TF1 Estimator program (ps_trainer.estimator) in the image runs in every replica in place of trainer.py,
its RunConfig reading the TF_CONFIG the operator gives each:

    python scripts/make_tfjob.py --name=census --image=registry.example/my-program:1 \\
        --program=census_wide_deep.py --volume_claim=training-data -- --model_dir=/mnt/model/census

Flags after '--' go to every trainer.py (or the program). A manifest it cannot write is named in one
line (exit 1). Needs PyYAML (pip install -e '.[kubeflow]').
"""

import sys

import yaml
from absl import app, flags

from ps_trainer.launch import kubeflow

flags.DEFINE_string("name", None, "TFJob name (a DNS label).", required=True)
flags.DEFINE_string("image", None, "Container image with ps-trainer installed in its working dir.",
                    required=True)
flags.DEFINE_string("model_dir", None, "model_dir every replica can reach (a mounted PVC or gs://); with "
                    "--program, the program's own flags say it.")
flags.DEFINE_string("namespace", "default", "Kubernetes namespace.")
flags.DEFINE_integer("num_ps", 1, "PS replicas.", lower_bound=1)
flags.DEFINE_integer("num_workers", 2, "Worker replicas besides the chief.", lower_bound=0)
flags.DEFINE_boolean("evaluator", True, "Add an Evaluator replica.")
flags.DEFINE_string("volume_claim", None, f"PVC to mount at {kubeflow.MOUNT_PATH} in every replica.")
flags.DEFINE_integer("metrics_port", 0, "Serve Prometheus metrics on this port of every pod, with the "
                     "prometheus.io scrape annotations (0: none).", lower_bound=0, upper_bound=65535)
flags.DEFINE_string("program", None, "A TF1 Estimator program (its path in the image's working dir) that every "
                    "replica runs in place of trainer.py; the flags after '--' are its own, its model_dir among them.")
FLAGS = flags.FLAGS


def main(argv):
    job = kubeflow.TFJobSpec(
        name=FLAGS.name, image=FLAGS.image, model_dir=FLAGS.model_dir or "", namespace=FLAGS.namespace,
        num_ps=FLAGS.num_ps, num_workers=FLAGS.num_workers, evaluator=FLAGS.evaluator,
        trainer_args=tuple(argv[1:]), volume_claim=FLAGS.volume_claim, metrics_port=FLAGS.metrics_port or None,
        program=FLAGS.program)
    problem = job.problem()
    if problem:
        sys.exit(f"make_tfjob.py: {problem}")
    yaml.safe_dump_all([kubeflow.tfjob(job), kubeflow.network_policy(job)], sys.stdout, sort_keys=False)


if __name__ == "__main__":
    app.run(main)
