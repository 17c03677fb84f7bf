"""ps-trainer's public namespace: `ps_trainer.estimator` runs TF1 Estimator programs on the trainer's
parameter-server runtime."""
