"""What only the launcher's side uses, JAX-free: the cluster's variables
(`cluster`), a rank's output prefix and the console's filter
(`output_prefix`), the workload's lookup (`workload`), and the copy of a
bucket's workdir on this machine (`record_mirror`). launcher/rank/ imports
it too; runtime/ never does (tests/test_boundary.py)."""
