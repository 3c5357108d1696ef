"""What only the launcher's side uses, JAX-free: the cluster's variables
(`cluster`), a rank's output prefix and the console's filter
(`output_prefix`), the workload's lookup (`workload`), a bucket's workdir
kept in step with this machine's copy (`record_mirror`), the job's goodput
from every ledger (`goodput_rollup`) and its phases after a fault
(`time_to_recover`), the user's project as files that travel
(`project`), a launcher flag read as absl reads it (`flag_values`), and
the job's certificate authority (`job_tls`). launcher/process/ imports it
too; runtime/ never does (tests/test_boundary.py)."""
