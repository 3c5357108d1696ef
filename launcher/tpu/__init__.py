"""The Cloud TPU pod driver: runs a job on every worker of one or more TPU
slices, and with --create makes and babysits the slices.

scripts/launch_tpu_pod.sh calls `python -m launcher.tpu launch` (also
`podrun-tpu`, `__main__`). The parts: `driver` (the launch, in order),
`flags` (its command line), `control` (--dry_run, --status, --stop),
`slices` (what the job runs on: slices that stand, the one this launch
created and babysits, or an elastic group of them, `elastic`), `queued`
(the queued resource a launch creates, waits for and deletes), `babysit`
(noticing a lost slice and bringing it back), `attempt` (one run
on every worker of every slice: its output and its end), `commands`
(gcloud and the shell snippets each worker runs), `preflight` (the pod
through the Cloud TPU API's REST endpoint, `tpu_api`), `bundle` (the code as one tarball), and the
standalone half that runs on each worker under its system Python, `worker`
with its accelerator check `worker_accelerator`. What each accelerator type
implies is in runtime/common/accelerators.py. Nothing here imports JAX.
"""
