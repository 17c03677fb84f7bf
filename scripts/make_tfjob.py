#!/usr/bin/env python3
"""Writes a Kubeflow TFJob manifest for this trainer, with a NetworkPolicy guarding its gRPC port.

    python scripts/make_tfjob.py --name=mnist --image=registry.example/ps-trainer:1 \\
        --model_dir=/mnt/model/mnist --volume_claim=training-data -- --train_steps=20000 > job.yaml
    kubectl apply -f job.yaml

Flags after '--' go to every trainer.py. Needs PyYAML (pip install -e '.[kubeflow]').
"""

import sys

import yaml
from absl import app, flags

from ps_trainer.launch import kubeflow

flags.DEFINE_string("name", None, "TFJob name (a DNS label).", required=True)
flags.DEFINE_string("image", None, "Container image with ps-trainer installed in its working dir.",
                    required=True)
flags.DEFINE_string("model_dir", None, "model_dir every replica can reach (a mounted PVC or gs://).",
                    required=True)
flags.DEFINE_string("namespace", "default", "Kubernetes namespace.")
flags.DEFINE_integer("num_ps", 1, "PS replicas.", lower_bound=1)
flags.DEFINE_integer("num_workers", 2, "Worker replicas besides the chief.", lower_bound=0)
flags.DEFINE_boolean("evaluator", True, "Add an Evaluator replica.")
flags.DEFINE_string("volume_claim", None, f"PVC to mount at {kubeflow.MOUNT_PATH} in every replica.")
flags.DEFINE_integer("metrics_port", 0, "Serve Prometheus metrics on this port of every pod, with the "
                     "prometheus.io scrape annotations (0: none).", lower_bound=0, upper_bound=65535)
FLAGS = flags.FLAGS


def main(argv):
    job = kubeflow.TFJobSpec(
        name=FLAGS.name, image=FLAGS.image, model_dir=FLAGS.model_dir, namespace=FLAGS.namespace,
        num_ps=FLAGS.num_ps, num_workers=FLAGS.num_workers, evaluator=FLAGS.evaluator,
        trainer_args=tuple(argv[1:]), volume_claim=FLAGS.volume_claim, metrics_port=FLAGS.metrics_port or None)
    yaml.safe_dump_all([kubeflow.tfjob(job), kubeflow.network_policy(job)], sys.stdout, sort_keys=False)


if __name__ == "__main__":
    app.run(main)
