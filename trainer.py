"""ps-trainer: one script for every host of a TensorFlow parameter-server cluster.

    python trainer.py --ps_hosts=h0:2222 --worker_hosts=h1:2222,h2:2222 --job_name=ps --task_index=0
    python trainer.py --ps_hosts=h0:2222 --worker_hosts=h1:2222,h2:2222 --job_name=worker \
        --task_index=0 --model_dir=/shared/run1

Without cluster flags the cluster comes from the environment (TF_CONFIG, SageMaker, Slurm, AWS
Batch); with none of those either, it trains in this one process.
"""

from ps_trainer import trainer

if __name__ == "__main__":
    trainer.run()
