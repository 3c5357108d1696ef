"""Every environment variable podrun sets or reads, by name, in one place.

A launcher (the local pod, the TPU driver's worker half, a scheduler's
script) hands each process its place and its attempt through these;
the process reads them back. launcher/tpu/worker.py runs on a TPU VM
without the project and spells the ones it sets itself
(tests/test_tpu_worker.py checks that they agree).

Example:
  >>> os.environ.get(env_vars.JOB_ID)       # the same on every attempt of a job
"""

# A scheduler's or a user's way to hand each process its place in the job,
# for --coordinator_address, --num_processes, --process_id and
# --coordinator_bind_address (flags win).
COORDINATOR_ADDRESS = 'PODRUN_COORDINATOR_ADDRESS'
NUM_PROCESSES = 'PODRUN_NUM_PROCESSES'
PROCESS_ID = 'PODRUN_PROCESS_ID'
COORDINATOR_BIND_ADDRESS = 'PODRUN_COORDINATOR_BIND_ADDRESS'

# The job's certificate authority, for --tls_dir (flags win).
TLS_DIR = 'PODRUN_TLS_DIR'

# The job's id, the same on every attempt: names its local checkpoints and
# its workdir lease.
JOB_ID = 'PODRUN_JOB_ID'
# This attempt's name, the same on every process: its goodput ledgers' folder.
ATTEMPT = 'PODRUN_ATTEMPT'
# The process count a TPU driver expects from the accelerator type.
EXPECTED_PROCESSES = 'PODRUN_EXPECTED_PROCESSES'
# "K-P": the fewest and most processes an elastic job may run on
# (--min_processes, --min_slices), so that a config that cannot run on
# one of them is refused before step 1.
ELASTIC_PROCESSES = 'PODRUN_ELASTIC_PROCESSES'
# Set by a local-pod launcher: it prefixes, files and filters the process's
# output itself.
SUPERVISED = 'PODRUN_SUPERVISED'
# Set by a launcher that reaches the workdir and writes its own files of
# the record there (the goodput roll-up, its attempts): process 0 then
# leaves them to it (runtime/common/layout.py, `writer`).
LAUNCHER_RECORD = 'PODRUN_LAUNCHER_RECORD'
# The pipe a local-pod launcher reads each process's progress from.
PROGRESS_FD = 'PODRUN_PROGRESS_FD'
# A file the launcher writes when its infrastructure saw processes' hosts
# go (a TPU slice PREEMPTED): JSON {"processes": [...], "why": "..."}. Their
# silence then ends the job within seconds rather than --heartbeat_timeout
# (launcher/process/peers.py).
GONE_FILE = 'PODRUN_GONE_FILE'
# Where the local checkpoint tier lives (default /dev/shm/podrun).
LOCAL_CHECKPOINT_DIR = 'PODRUN_LOCAL_CHECKPOINT_DIR'
# Where a machine keeps its copy of a gs:// workdir (default
# ~/.cache/podrun/record; launcher/common/record_mirror.py).
RECORD_CACHE = 'PODRUN_RECORD_CACHE'
# Seconds between its uploads to the bucket (default 10).
RECORD_UPLOAD_EVERY_S = 'PODRUN_RECORD_UPLOAD_EVERY_S'
