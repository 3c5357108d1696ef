#!/usr/bin/env bash
# Runs a job on every worker of a Cloud TPU pod slice (or of several
# slices), from your own machine; with --create, makes the slice first.
#
#   scripts/launch_tpu_pod.sh --tpu=NAME --zone=ZONE [--project=PROJECT]
#       [--project_dir=DIR] [--project_max_mb=100]
#       [--workdir=DIR] [--env KEY=VALUE ...] [--max_restarts=N]
#       [--restart_backoff=SECONDS]
#       [--retry_exit_codes=C,...] [--wait_healthy=SECONDS]
#       [--stop_grace=SECONDS] [--orphan_timeout=SECONDS]
#       [--worker_python=PATH] [--provision_python] [--log_dir=DIR]
#       [--job_id=ID] [--skip_preflight] [--replace] [--dry_run]
#       [--log_all_workers] [--num_slices=N] [--megascale_port=8080]
#       [--accelerator_devices=GLOBS] [--kill_accelerator_holders]
#       [--create --accelerator_type=TYPE --runtime_version=IMAGE
#        [--spot|--reserved] [--valid_until=6h] [--delete_after]
#        [--queued_resource=NAME] [--capacity_timeout=86400]
#        [--provisioning_timeout=1800] [--poll_interval=10]
#        [--lost_slice_wait=30] [--relaunch_grace=15]
#        [--min_slices=K | --min_replicas=K] [--slice_back_backoff=60]
#        [--slice_back_timeout=86400]]
#       -- <launcher flags>
#   scripts/launch_tpu_pod.sh --tpu=NAME --zone=ZONE --status
#   scripts/launch_tpu_pod.sh --tpu=NAME --zone=ZONE --stop[=JOB_ID]
#
# Each flag with its meaning: `podrun-tpu launch --help` (the same flags).
#
# Example (a spot v4-32, babysat through preemptions, deleted at the end;
# the image's Python is 3.10, so --provision_python installs a newer one):
#   scripts/launch_tpu_pod.sh --tpu=my-v4-32 --zone=us-central2-b --create \
#       --accelerator_type=v4-32 --runtime_version=tpu-ubuntu2204-base \
#       --provision_python --spot --max_restarts=10 --delete_after -- \
#       --config=configs/mnist.py --config.data_dir=gs://BUCKET/mnist-data \
#       --workdir=gs://BUCKET/mnist
# (the workdir in a bucket: the slice's disks go with a preemption)
#
# Your own project: run the script from its directory (or name it with
# --project_dir). Its files that git does not ignore (every file, outside
# git; at most --project_max_mb MiB) travel beside podrun's code, and the
# job runs from their copy on every worker, so that --config=my_config.py,
# the module config.workload names and relative data paths work there.
#
# 0. --create asks for the slice through a queued resource (named --tpu, or
#    --queued_resource) and waits through its states, each phase with its
#    own timeout: capacity (ACCEPTED, WAITING_FOR_RESOURCES;
#    --capacity_timeout), provisioning (--provisioning_timeout), the nodes
#    READY and HEALTHY (--wait_healthy). Ctrl-C or SIGTERM at any point
#    deletes what this launch created, and only that; so does a create that
#    never comes up, and --delete_after at the end.
# 1. Reads each slice (`gcloud ... describe`: its workers, which the joined
#    job must find as its process count, exit 3 otherwise) and, unless
#    --skip_preflight, checks it through the Cloud TPU API (READY, HEALTHY,
#    config.topology.accelerator_type; needs `gcloud auth
#    application-default login`). --num_slices=N runs one job on slices
#    NAME-0 ... NAME-(N-1): every worker gets MEGASCALE_* and its process
#    id across slices.
# 2. Checks each worker's Python (with venv, new enough for this machine's
#    JAX: 3.11+ for JAX 0.10, 3.12+ from 0.11; python3.13 ... python3, or
#    --worker_python) before copying anything; --provision_python installs
#    that version (deadsnakes PPA, sudo apt-get) where none is found.
# 3. Copies podrun's code and the project (one tarball named by its
#    SHA-256) to every worker and, once per version of pyproject.toml and of
#    JAX, installs podrun's dependencies in ~/podrun/venv with the TPU extra
#    and this machine's JAX version (skipped with --worker_python).
# 4. On each worker, names every process holding the accelerator
#    (--accelerator_devices, /dev/accel* and /dev/vfio/*) and a stale
#    /tmp/libtpu_lockfile, and stops there (exit 11); --replace stops
#    podrun's own earlier jobs and removes a stale lockfile,
#    --kill_accelerator_holders stops foreign holders.
# 5. Runs `python -m launcher <launcher flags>` on all workers at once
#    through launcher/tpu/worker.py: each line goes to LOG_DIR/worker_W.log;
#    the console shows worker 0 in full and the others' warnings and errors
#    (all of them with --log_all_workers). The exit code is the first
#    failing worker's (a worker's 10 means "another failed first").
# 6. On a failure, Ctrl-C (exit 130; from a terminal too) or SIGTERM (exit
#    143) every worker's job gets SIGTERM (it saves a checkpoint), then
#    SIGKILL after --stop_grace seconds. A job whose launching machine is
#    gone stops by itself after --orphan_timeout seconds (default 30). A job
#    of an earlier launch still running on the pod is named and stops this
#    launch, unless --replace stops it first.
# 7. With --max_restarts, a preempted run (exit 75, or a --retry_exit_codes
#    code) is launched again; a slice this launch created that is lost
#    (node PREEMPTED, queued resource SUSPENDED or FAILED; read every
#    --poll_interval seconds) is deleted and created again under its name
#    first, once its job has ended (its preemption save; at most
#    --lost_slice_wait seconds); a spot slice that still looks up after a
#    job ended as a shutdown ends it is read for --relaunch_grace seconds
#    before the job is relaunched there. The job resumes from its checkpoint. Attempts that fail in a
#    row without progress wait --restart_backoff seconds (default 1),
#    doubled each time; Ctrl-C or SIGTERM during that wait ends the launch
#    as it does anywhere else (what it created deleted, exit 130/143).
#
# A multi-host job needs storage every worker shares for its checkpoints:
# --config.checkpoint_dir=gs://... (or --config.checkpointing=False).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
case " $* " in
  # The whole header: every line from the second to the first that is not
  # a comment.
  *" -h "*|*" --help "*) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"; exit 0 ;;
esac
# This machine's Python with the project and its pod extra (google-auth and
# requests, for the preflight) installed: scripts/env.sh makes .venv the first time;
# PODRUN_LOCAL_PYTHON names another.
if [ -n "${PODRUN_LOCAL_PYTHON:-}" ]; then
  py="$PODRUN_LOCAL_PYTHON"
else
  (PODRUN_EXTRAS="${PODRUN_EXTRAS-pod}" source "$repo/scripts/env.sh") >&2 || { echo "launch_tpu_pod: error: could not set up $repo/.venv" >&2; exit 2; }
  py="${PODRUN_VENV:-$repo/.venv}/bin/python"
fi
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
exec "$py" -m launcher.tpu launch "$@"
