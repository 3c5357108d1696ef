"""The JAX-free leaves that both sides of the project import.

The supervisor (launcher/ outside launcher/process/) never loads JAX, and
nothing in runtime/ imports launcher/, so what both need sits here, low:
exit codes and the errors that carry them (`exit_codes`), whole-file writes
(`files`), what the launcher tells its processes and their variables
(`handoff`), the accelerator types (`accelerators`), the old spellings
still kept (`deprecations`), the progress pipe (`progress`), the goodput
ledger a process writes (`goodput`) and the records it holds (`records`),
the workdir's layout: where each file of the record lives and who writes
it (`layout`), flat config fields (`mappings`) and the credentials for a
bucket (`gcs_auth`).
What only the launcher's side reads lives in launcher/common/.

Nothing here imports JAX or anything outside runtime/common/;
tests/test_boundary.py checks both.
"""
