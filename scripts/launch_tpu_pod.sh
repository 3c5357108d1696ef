#!/usr/bin/env bash
# Runs a job on every worker of a Cloud TPU pod slice, from your own machine.
#
#   scripts/launch_tpu_pod.sh --tpu=NAME --zone=ZONE [--project=PROJECT]
#       [--workdir=DIR] [--env KEY=VALUE ...] [--max_restarts=N]
#       [--retry_exit_codes=C,...] [--wait_healthy=SECONDS]
#       [--stop_grace=SECONDS] [--orphan_timeout=SECONDS]
#       [--worker_python=PATH] [--provision_python] [--log_dir=DIR]
#       [--job_id=ID] [--skip_preflight] [--replace] [--dry_run]
#       -- <launcher flags>
#   scripts/launch_tpu_pod.sh --tpu=NAME --zone=ZONE --status
#   scripts/launch_tpu_pod.sh --tpu=NAME --zone=ZONE --stop[=JOB_ID]
#
# Example:
#   scripts/launch_tpu_pod.sh --tpu=my-v4-32 --zone=us-central2-b -- \
#       --config=configs/mnist.py --config.checkpoint_dir=gs://BUCKET/mnist
#
# 1. Reads the pod (`gcloud ... describe`: its workers, which every worker's
#    job must find as its process count, exit 3 otherwise) and, unless
#    --skip_preflight, checks it through cloud-tpu-client (READY, HEALTHY,
#    config.topology.accelerator_type; needs `gcloud auth
#    application-default login`).
# 2. Checks each worker's Python (with venv, new enough for this machine's
#    JAX: 3.11+ for JAX 0.10, 3.12+ from 0.11; python3.13 ... python3, or
#    --worker_python) before copying anything; --provision_python installs
#    that version (deadsnakes PPA, sudo apt-get) where none is found.
# 3. Copies the project (one tarball named by its SHA-256) to every worker
#    and, once per version of pyproject.toml and of JAX, installs it in
#    ~/podrun/venv with the TPU extra and this machine's JAX version
#    (skipped with --worker_python).
# 4. Runs `python -m launcher <launcher flags>` on all workers at once
#    through launcher/tpu/worker.py: each line goes to LOG_DIR/worker_W.log
#    and, prefixed "[worker W]", to the console. The exit code is the first
#    failing worker's (a worker's 10 means "another failed first").
# 5. On a failure, Ctrl-C (exit 130) or SIGTERM (exit 143) every worker's
#    job gets SIGTERM (it saves a checkpoint), then SIGKILL after
#    --stop_grace seconds. A job whose launching machine is gone stops by
#    itself after --orphan_timeout seconds (default 30). A job of an earlier
#    launch still running on the pod is named and stops this launch, unless
#    --replace stops it first.
# 6. With --max_restarts, a preempted run (exit 75, or a --retry_exit_codes
#    code) is launched again when cloud-tpu-client says the pod is still
#    recoverable; the job resumes from its checkpoint.
#
# A multi-host job needs storage every worker shares for its checkpoints:
# --config.checkpoint_dir=gs://... (or --config.checkpointing=False).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
case " $* " in
  *" -h "*|*" --help "*) sed -n '2,46p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
# This machine's Python with the project and its pod extra (cloud-tpu-client,
# for the preflight) installed: scripts/env.sh makes .venv the first time;
# PODRUN_LOCAL_PYTHON names another.
if [ -n "${PODRUN_LOCAL_PYTHON:-}" ]; then
  py="$PODRUN_LOCAL_PYTHON"
else
  (source "$repo/scripts/env.sh") >&2 || { echo "launch_tpu_pod: error: could not set up $repo/.venv" >&2; exit 2; }
  py="${PODRUN_VENV:-$repo/.venv}/bin/python"
fi
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
exec "$py" -m launcher.tpu launch "$@"
