"""What a job keeps so that a stopped or failed attempt resumes exactly.

Two tiers hold the state, and one decision says which copy a run resumes
from. The parts:

- `options`: how a run checkpoints (`Checkpointing`, its `LocalTier`),
  read once from its config: what the modules below take;
- `checkpoint`: the persistent tier, orbax's CheckpointManager over storage
  every process shares (often a bucket), written rarely;
- `local_checkpoint`: the local tier, each process's own copy on its own
  host, written often, so a hard failure costs a few steps;
- `local_cadence`: when the local tier copies, in steps or in seconds;
- `local_leftovers`: other jobs' local copies, removed when no run can use
  them;
- `checkpoint_meta`: what a copy of either tier records about its run, and
  the checks before resuming from it (`CheckpointError`);
- `recovery`: the newest step anyone holds, and who reads it (`plan`);
- `batch_limit`: the first attempt's group size, kept by later attempts on
  other device counts.

Example:
  >>> from runtime.checkpoints import recovery
  >>> recovery.plan({0: [400, 450], 1: []}, persistent_step=0)
  Plan(step=450, tier='peer', source=0, holders=(0,), sources=None)
"""
