"""The JAX-free leaves that both sides of the project import.

The supervisor (launcher/ outside launcher/rank/) never loads JAX, and
nothing in runtime/ imports launcher/, so what both need sits here, low:
exit codes and the errors that carry them (`exit_codes`), whole-file writes
(`files`), the environment variables the launcher hands its processes
(`env_vars`), what a scheduler's variables say (`cluster`), the accelerator
types (`accelerators`), how a process's output is prefixed
(`output_prefix`), finding the workload (`workload`), the progress pipe
(`progress`), the goodput ledger and its roll-up (`goodput`) and the time
to recover (`time_to_recover`).

Nothing here imports JAX or anything outside runtime/common/;
tests/test_boundary.py checks both.
"""
