"""Which replicas of sharded state an elastic job may lose: the one rule the
runtime applies before step 1 (runtime/parallelism/state_layout.py) and the
launcher before it starts a pod (launcher/cli.py), read without JAX.

What an elastic job loses must be whole replicas, so that every other
replica still holds the whole state: a process (a lost host), or a slice
where the job loses and regains whole slices (the TPU driver's
--min_slices).

Example:
  >>> refusal('sharded', 'all', (3, 4))
  "config.state_layout='sharded' with config.replica='all' in an elastic ..."
"""

from typing import Optional


def whole(elastic_slices: bool = False) -> tuple[str, ...]:
  """The replicas an elastic job loses whole."""
  return ('process', 'slice') if elastic_slices else ('process',)


def refusal(state_layout: str,
            replica: str,
            elastic: Optional[tuple[int, int]],
            elastic_slices: bool = False,
            why: str = '') -> Optional[str]:
  """Why a job of this layout and replica cannot be elastic over
  `elastic`, the (fewest, most) processes; None where it can (a fixed
  size, replicated state, or a replica lost whole). `why` names what made
  the job elastic (a flag), for the message."""
  if not elastic or state_layout != 'sharded':
    return None
  allowed = whole(elastic_slices)
  if replica in allowed:
    return None
  unit = 'slice' if elastic_slices else 'process'
  return (f"config.state_layout='sharded' with config.replica={replica!r} in "
          f'an elastic job (processes {elastic[0]}-{elastic[1]}'
          f'{", " + why if why else ""}): a lost {unit} would take shards its '
          "replica's others cannot replace; set config.replica to "
          f"{' or '.join(repr(w) for w in allowed)} (a replica lost and back "
          "whole), run at a fixed size, or keep 'replicated'")
