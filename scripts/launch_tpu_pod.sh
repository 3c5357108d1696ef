#!/usr/bin/env bash
# Runs a job on every worker of a Cloud TPU pod slice, from your own machine.
#
#   scripts/launch_tpu_pod.sh --tpu=NAME --zone=ZONE [--project=PROJECT]
#       [--workdir=DIR] [--env KEY=VALUE ...] [--max_restarts=N]
#       [--retry_exit_codes=C,...] [--wait_healthy=SECONDS]
#       [--stop_grace=SECONDS] [--worker_python=PATH] [--log_dir=DIR]
#       [--job_id=ID] [--skip_preflight] [--dry_run]
#       -- <launcher flags>
#
# Example:
#   scripts/launch_tpu_pod.sh --tpu=my-v4-32 --zone=us-central2-b -- \
#       --config=configs/mnist.py --config.checkpoint_dir=gs://BUCKET/mnist
#
# 1. Preflight (python -m launcher.tpu_pod): the pod must be READY and
#    HEALTHY, of config.topology.accelerator_type when the config sets it,
#    with as many workers as that type has hosts.
# 2. Copies the project (the files git does not ignore, as one tarball named
#    by its SHA-256) to every worker and, once per version, installs it
#    there in ~/podrun/venv with the TPU extra (skipped with --worker_python).
# 3. Runs `python -m launcher <launcher flags>` on all workers at once with
#    `gcloud compute tpus tpu-vm ssh NAME --worker=all`; JAX finds the pod
#    by itself. Every argument reaches the workers unchanged and unevaluated.
# 4. Each worker's output goes to LOG_DIR/worker_W.log and, prefixed with
#    "[worker W]", to the console. The exit code is the first failing
#    worker's. On a failure or Ctrl-C every worker's job is stopped through
#    the process group recorded when it started (scripts/tpu_worker.sh).
# 5. With --max_restarts, a preempted run (exit 75, or a --retry_exit_codes
#    code) is launched again when cloud-tpu-client says the pod is still
#    recoverable; the job resumes from its checkpoint.
#
# A multi-host job needs storage every worker shares for its checkpoints:
# --config.checkpoint_dir=gs://... (or --config.checkpointing=False).
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

die() { echo "launch_tpu_pod: error: $*" >&2; exit 2; }
note() { echo "launch_tpu_pod: $*" >&2; }

tpu='' zone='' project='' workdir='' max_restarts=0 retry_codes=''
wait_healthy=600 stop_grace=60 worker_python='' log_dir='' job_id=''
skip_preflight=0 dry_run=0
envs=() launcher_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; launcher_args=("$@"); break ;;
    --tpu=*) tpu="${1#*=}" ;;
    --zone=*) zone="${1#*=}" ;;
    --project=*) project="${1#*=}" ;;
    --workdir=*) workdir="${1#*=}" ;;
    --env=*) envs+=("${1#*=}") ;;
    --env) [ $# -ge 2 ] || die "--env needs KEY=VALUE"; envs+=("$2"); shift ;;
    --max_restarts=*) max_restarts="${1#*=}" ;;
    --retry_exit_codes=*) retry_codes="${1#*=}" ;;
    --wait_healthy=*) wait_healthy="${1#*=}" ;;
    --stop_grace=*) stop_grace="${1#*=}" ;;
    --worker_python=*) worker_python="${1#*=}" ;;
    --log_dir=*) log_dir="${1#*=}" ;;
    --job_id=*) job_id="${1#*=}" ;;
    --skip_preflight) skip_preflight=1 ;;
    --dry_run) dry_run=1 ;;
    -h|--help) sed -n '2,34p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument: $1 (launcher flags go after --)" ;;
  esac
  shift
done
[ -n "$tpu" ] || die "--tpu=NAME is required"
[ -n "$zone" ] || die "--zone=ZONE is required"
[ ${#launcher_args[@]} -gt 0 ] || die "give the launcher flags after --, e.g. -- --config=configs/linear_regression.py"
[[ "$max_restarts" =~ ^[0-9]+$ ]] || die "--max_restarts=$max_restarts is not a count"
[[ "$stop_grace" =~ ^[0-9]+$ ]] || die "--stop_grace=$stop_grace is not whole seconds"
[[ "$job_id" =~ ^[A-Za-z0-9._-]*$ ]] || die "--job_id may hold letters, digits, '.', '_' and '-' only"
for kv in ${envs[@]+"${envs[@]}"}; do
  [[ "$kv" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env $kv: expected KEY=VALUE with KEY a variable name"
done
[ -n "$workdir" ] && launcher_args+=("--workdir=$workdir")

job_id="${job_id:-podrun-$(date -u +%Y%m%d-%H%M%S)-$$}"
log_dir="${log_dir:-$PWD/tpu_logs/$job_id}"
mkdir -p "$log_dir" || die "cannot create --log_dir=$log_dir"
log_dir="$(cd "$log_dir" && pwd)"

# This machine's Python with the project installed (scripts/env.sh makes
# .venv the first time); PODRUN_LOCAL_PYTHON names another.
if [ -n "${PODRUN_LOCAL_PYTHON:-}" ]; then
  py="$PODRUN_LOCAL_PYTHON"
else
  (source "$repo/scripts/env.sh") >&2 || die "could not set up $repo/.venv"
  py="${PODRUN_VENV:-$repo/.venv}/bin/python"
fi
cd "$repo" || exit 2

code_hash="$("$py" -m launcher.tpu_pod bundle --out="$log_dir/code.tar.gz")" ||
  die "could not bundle the project's files"
short="${code_hash:0:16}"

quote() { printf '%q ' "$@" | sed 's/ $//'; }

gcloud_where=(--zone="$zone")
[ -n "$project" ] && gcloud_where+=(--project="$project")
scp_cmd=(gcloud compute tpus tpu-vm scp "$log_dir/code.tar.gz"
         "$tpu:podrun-$short.tar.gz" --worker=all "${gcloud_where[@]}")

code_dir="\$HOME/podrun/code-$short"
setup="set -e; d=\"$code_dir\"; if [ ! -f \"\$d/.podrun-ready\" ]; then rm -rf \"\$d\"; mkdir -p \"\$d\"; tar -xzf \"\$HOME/podrun-$short.tar.gz\" -C \"\$d\"; touch \"\$d/.podrun-ready\"; fi"
if [ -z "$worker_python" ]; then
  # One environment for every version of the code: reinstalled only when
  # pyproject.toml changes.
  setup+="; v=\"\$HOME/podrun/venv\"; s=\"\$v/.podrun-\$(sha256sum \"\$d/pyproject.toml\" | cut -c1-16)\"; if [ ! -f \"\$s\" ]; then python3 -m venv \"\$v\"; \"\$v/bin/pip\" install -q --upgrade pip; \"\$v/bin/pip\" install -q \"\$d[tpu]\"; touch \"\$s\"; fi"
  remote_python='$HOME/podrun/venv/bin/python'
  python_word="\"$remote_python\""
else
  python_word="$(quote "$worker_python")"
fi
setup_cmd=(gcloud compute tpus tpu-vm ssh "$tpu" --worker=all "${gcloud_where[@]}"
           --command="$setup")
run_remote="cd \"$code_dir\" && exec bash scripts/tpu_worker.sh run $(quote "$job_id") $python_word"
[ ${#envs[@]} -gt 0 ] && run_remote+=" $(quote "${envs[@]}")"
run_remote+=" -- $(quote "${launcher_args[@]}")"
run_cmd=(gcloud compute tpus tpu-vm ssh "$tpu" --worker=all "${gcloud_where[@]}"
         --command="$run_remote")
stop_cmd=(gcloud compute tpus tpu-vm ssh "$tpu" --worker=all "${gcloud_where[@]}"
          --command="bash \"$code_dir/scripts/tpu_worker.sh\" stop $(quote "$job_id") $stop_grace")
tpu_args=(--tpu="$tpu" --zone="$zone")
[ -n "$project" ] && tpu_args+=(--project="$project")
preflight_cmd=("$py" -m launcher.tpu_pod preflight "${tpu_args[@]}"
               --wait_healthy="$wait_healthy" -- "${launcher_args[@]}")

if [ "$dry_run" = 1 ]; then
  echo "# job $job_id, code sha256 $code_hash, logs in $log_dir"
  [ "$skip_preflight" = 1 ] || echo "# preflight: python $(quote "${preflight_cmd[@]:1}")"
  quote "${scp_cmd[@]}"; echo
  quote "${setup_cmd[@]}"; echo
  quote "${run_cmd[@]}"; echo
  echo "# on a failure or Ctrl-C:"
  quote "${stop_cmd[@]}"; echo
  exit 0
fi

note "job $job_id, code sha256 $code_hash, logs in $log_dir"
workers=''
preflight() {
  [ "$skip_preflight" = 1 ] && return 0
  local out
  out="$("${preflight_cmd[@]}")" || exit $?
  workers="$(printf '%s' "$out" | "$py" -c 'import json,sys; print(json.load(sys.stdin)["workers"])')"
  note "preflight: $out"
}

gcloud_pid='' stop_pid=''
stop_workers() {  # Runs the stop command on every worker, once per attempt.
  [ -n "$stop_pid" ] && return 0
  note "stopping job $job_id on every worker (process group; SIGKILL after ${stop_grace}s)"
  "${stop_cmd[@]}" >>"$log_dir/stop.log" 2>&1 &
  stop_pid=$!
}

interrupted() {
  trap '' INT TERM
  note "interrupted"
  stop_workers
  wait "$stop_pid" 2>/dev/null
  [ -n "$gcloud_pid" ] && kill -TERM "$gcloud_pid" 2>/dev/null
  wait 2>/dev/null
  exit 130
}

run_attempt() {  # Sets attempt_code.
  local attempt="$1" fifo="$log_dir/.output" line worker rest code
  declare -A exits=() started=()
  first_code='' stop_pid='' peer_failed=''
  rm -f "$fifo"; mkfifo "$fifo" || die "cannot make $fifo"
  "${run_cmd[@]}" >"$fifo" 2>&1 </dev/null &
  gcloud_pid=$!
  while IFS= read -r line; do
    if [[ "$line" =~ ^\[worker\ ([0-9?]+)\]\ ?(.*)$ ]]; then
      worker="${BASH_REMATCH[1]}" rest="${BASH_REMATCH[2]}"
      if [ -z "${started[$worker]:-}" ]; then
        started[$worker]=1
        echo "===== attempt $attempt of job $job_id =====" >>"$log_dir/worker_$worker.log"
      fi
      printf '%s\n' "$rest" >>"$log_dir/worker_$worker.log"
      if [[ "$rest" =~ ^podrun:\ exit\ ([0-9]+)$ ]]; then
        code="${BASH_REMATCH[1]}"
        exits[$worker]="$code"
        # 10: the worker stopped because another failed; that one is the cause.
        if [ "$code" = 10 ]; then
          peer_failed=1
        elif [ "$code" != 0 ] && [ -z "$first_code" ]; then
          first_code="$code"
          note "worker $worker exited $code first"
          stop_workers
        fi
      fi
    else
      printf '%s\n' "$line" >>"$log_dir/gcloud.log"
    fi
    printf '%s\n' "$line"
  done <"$fifo"
  wait "$gcloud_pid"; local gcloud_code=$?
  gcloud_pid=''
  rm -f "$fifo"
  if [ -z "$first_code" ] && [ -n "$peer_failed" ]; then
    first_code=10
    stop_workers
  fi
  local reported="${#exits[@]}"
  if [ -z "$first_code" ] && { [ "$gcloud_code" != 0 ] ||
       { [ -n "$workers" ] && [ "$reported" != "$workers" ]; }; }; then
    note "gcloud exited $gcloud_code with $reported of ${workers:-?} worker(s) reporting an exit code"
    first_code=$(( gcloud_code == 0 ? 1 : gcloud_code ))
    stop_workers
  fi
  [ -n "$stop_pid" ] && wait "$stop_pid" 2>/dev/null
  attempt_code="${first_code:-0}"
}

retryable() {  # As the launcher's --max_restarts: 75 and the codes given.
  case "$1" in 0|1|2|3|5) return 1 ;; 75) return 0 ;; esac
  local c codes
  IFS=',' read -r -a codes <<<"$retry_codes"
  for c in ${codes[@]+"${codes[@]}"}; do
    [ "$c" = "$1" ] && return 0
  done
  return 1
}

trap interrupted INT TERM
preflight
note "copying the code to every worker"
"${scp_cmd[@]}" >>"$log_dir/gcloud.log" 2>&1 || die "gcloud scp failed; see $log_dir/gcloud.log"
note "setting up every worker (first time for this version: installs the project)"
"${setup_cmd[@]}" >>"$log_dir/gcloud.log" 2>&1 || die "worker set-up failed; see $log_dir/gcloud.log"

attempt=1
while :; do
  run_attempt "$attempt"
  code="$attempt_code"
  [ "$code" = 0 ] && { note "job $job_id finished on every worker"; exit 0; }
  if [ "$attempt" -gt "$max_restarts" ] || ! retryable "$code"; then
    note "job $job_id failed with exit code $code (logs: $log_dir)"
    exit "$code"
  fi
  if [ "$skip_preflight" != 1 ]; then
    if ! "$py" -m launcher.tpu_pod recoverable "${tpu_args[@]}"; then
      note "TPU $tpu cannot come back: not relaunching"
      exit "$code"
    fi
    preflight
  fi
  attempt=$((attempt + 1))
  note "relaunching (attempt $attempt of $((max_restarts + 1))) after exit code $code"
done
