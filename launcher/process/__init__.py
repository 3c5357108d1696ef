"""What each process runs to join the job and stay supervised.

Devices and `jax.distributed` (devices.py, distributed.py, roll_call.py),
the run itself (job.py), the watcher beside the workload
(supervisor.py) and the workdir lease (lease.py). Unlike the rest of
`launcher/`, these modules use JAX; every private JAX API they need sits in
runtime/coordination.py.
"""
