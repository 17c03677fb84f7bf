#!/usr/bin/env bash
# Starts one ps task on this host; it exits 0 by itself once every worker has finished (1 if the chief ended
# in a permanent error, naming its reason).
#   PS_HOSTS=h0:2222 WORKER_HOSTS=h1:2222,h2:2222 scripts/run_ps.sh --task_index=0
# Cluster lists and task index come from flags or from PS_HOSTS, WORKER_HOSTS, TASK_INDEX.
# Logs go to $LOG_DIR/ps-N.log (default ./logs); PYTHON picks the interpreter.
exec "$(dirname "${BASH_SOURCE[0]}")/_run_task.sh" ps "$@"
