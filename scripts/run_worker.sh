#!/usr/bin/env bash
# Starts one worker task on this host; worker 0 is the chief. Trains to --train_steps and exits 0.
#   PS_HOSTS=h0:2222 WORKER_HOSTS=h1:2222,h2:2222 MODEL_DIR=/shared/run1 scripts/run_worker.sh --task_index=1
# Cluster lists, task index and model dir come from flags or from PS_HOSTS, WORKER_HOSTS,
# TASK_INDEX, MODEL_DIR. Logs go to $LOG_DIR/worker-N.log (default ./logs).
exec "$(dirname "${BASH_SOURCE[0]}")/_run_task.sh" worker "$@"
