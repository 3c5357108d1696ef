#!/usr/bin/env bash
# Runs on each TPU worker for scripts/launch_tpu_pod.sh; not meant to be typed.
#
#   tpu_worker.sh run JOB_ID PYTHON [KEY=VALUE ...] -- <launcher flags>
#   tpu_worker.sh stop JOB_ID [GRACE_SECONDS]
#
# run: starts `PYTHON -m launcher <launcher flags>` in a session (process
# group) of its own with the KEY=VALUE variables added, records the group id
# in ~/podrun/run/JOB_ID.pgid, prefixes every output line with
# "[worker W] ", ends with "[worker W] podrun: exit CODE" and exits CODE.
# Arguments arrive as separate words and are never evaluated.
# stop: sends SIGTERM to that process group (the runtime saves a checkpoint
# and exits), then SIGKILL after GRACE_SECONDS (default 60) if it lingers.
set -uo pipefail

run_dir="$HOME/podrun/run"

worker_id() {
  # The emulated pod and GKE set it; a TPU VM's metadata server knows it.
  if [ -n "${PODRUN_PROCESS_ID:-}" ]; then echo "$PODRUN_PROCESS_ID"; return; fi
  if [ -n "${TPU_WORKER_ID:-}" ]; then echo "$TPU_WORKER_ID"; return; fi
  curl -sf -m 5 -H 'Metadata-Flavor: Google' \
    http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number \
    2>/dev/null || echo '?'
}

group_alive() {
  kill -0 -- "-$1" 2>/dev/null
}

stop() {
  local job_id="$1" grace="${2:-60}" pgid
  pgid="$(cat "$run_dir/$job_id.pgid" 2>/dev/null)" || {
    echo "podrun: no job $job_id on this worker"; return 0; }
  [[ "$pgid" =~ ^[0-9]+$ ]] || { echo "podrun: bad pgid file"; return 1; }
  group_alive "$pgid" || { echo "podrun: job $job_id already stopped"; return 0; }
  kill -TERM -- "-$pgid" 2>/dev/null
  local waited=0
  while group_alive "$pgid" && [ "$waited" -lt "$((grace * 10))" ]; do
    sleep 0.1; waited=$((waited + 1))
  done
  if group_alive "$pgid"; then
    kill -KILL -- "-$pgid" 2>/dev/null
    echo "podrun: job $job_id killed after ${grace}s"
  else
    echo "podrun: job $job_id stopped"
  fi
}

run() {
  local job_id="$1" python="$2"
  shift 2
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    [[ "$1" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || {
      echo "tpu_worker.sh: expected KEY=VALUE with KEY a variable name, got: $1" >&2
      exit 2; }
    export "${1%%=*}=${1#*=}"
    shift
  done
  [ "${1:-}" = "--" ] && shift
  # Every attempt of this job shares its workdir lease (launcher/rank/lease.py).
  export PODRUN_JOB_ID="$job_id"
  local worker code_file
  worker="$(worker_id)"
  mkdir -p "$run_dir"
  code_file="$run_dir/$job_id.exit"
  rm -f "$code_file"
  {
    # setsid: the launcher and everything it starts form one process group,
    # which `stop` can signal without touching anything else on the worker.
    setsid "$python" -u -m launcher "$@" </dev/null 2>&1 &
    local pid=$!
    echo "$pid" > "$run_dir/$job_id.pgid"
    local code
    while :; do
      wait "$pid"; code=$?
      kill -0 "$pid" 2>/dev/null || break
    done
    echo "podrun: exit $code"
    echo "$code" > "$code_file"
  } 2>&1 | sed -u "s/^/[worker $worker] /" &
  local pipeline=$!
  # A dropped ssh session (Ctrl-C on the laptop) hangs up this shell: stop
  # the job rather than leave it holding the TPU. In the background, the
  # pipeline lets the trap run at once.
  trap 'kill -TERM -- "-$(cat "$run_dir/$job_id.pgid" 2>/dev/null)" 2>/dev/null' HUP TERM INT
  while :; do
    wait "$pipeline"
    kill -0 "$pipeline" 2>/dev/null || break
  done
  exit "$(cat "$code_file" 2>/dev/null || echo 1)"
}

case "${1:-}" in
  run) shift; run "$@" ;;
  stop) shift; stop "$@" ;;
  *) echo "usage: tpu_worker.sh run JOB_ID PYTHON [K=V ...] -- FLAGS | stop JOB_ID [GRACE]" >&2
     exit 2 ;;
esac
