#!/usr/bin/env bash
# Shared body of run_ps.sh and run_worker.sh: one task of the cluster on this host.
# Usage: _run_task.sh JOB [trainer flags...]
set -euo pipefail
job="$1"
shift
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"

task_index="${TASK_INDEX:-}"
for arg in "$@"; do
  case "$arg" in --task_index=*) task_index="${arg#--task_index=}" ;; esac
done
if [[ -z "$task_index" ]]; then
  echo "run_${job}.sh: no task index: pass --task_index=N or set TASK_INDEX" >&2
  exit 2
fi

# Environment first, so that flags given on the command line win (absl keeps the last value).
args=(--job_name="$job" --task_index="$task_index")
if [[ -n "${PS_HOSTS:-}" ]]; then args+=(--ps_hosts="$PS_HOSTS"); fi
if [[ -n "${WORKER_HOSTS:-}" ]]; then args+=(--worker_hosts="$WORKER_HOSTS"); fi
if [[ -n "${MODEL_DIR:-}" ]]; then args+=(--model_dir="$MODEL_DIR"); fi

log_dir="${LOG_DIR:-$PWD/logs}"
mkdir -p "$log_dir"
log="$log_dir/$job-$task_index.log"
echo "run_${job}.sh: $job $task_index (pid $$) logging to $log"
exec >>"$log" 2>&1
# exec: the trainer keeps this pid, so SIGTERM to it (from systemd, Slurm or a launcher) reaches it.
exec "$python" "$here/../trainer.py" "${args[@]}" "$@"
