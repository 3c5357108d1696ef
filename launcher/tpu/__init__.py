"""The Cloud TPU pod driver: runs a job on every worker of a TPU slice.

scripts/launch_tpu_pod.sh calls `python -m launcher.tpu launch`. The parts:
`driver` (the launch, in order), `attempt` (one run on every worker: its
output and its end), `commands` (gcloud and the shell snippets each worker
runs), `preflight` (the pod through cloud-tpu-client), `bundle` (the code as
one tarball), `accelerators` (what each accelerator type implies) and
`worker` (the standalone half that runs on each worker). Nothing here imports
JAX.
"""
