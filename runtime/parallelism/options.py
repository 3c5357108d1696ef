"""What a config says of the parallelism and of where the state lives, read
once into a typed value: `Placement`. The plan of a run and a user's own
loop take it instead of the ConfigDict (`mapping.from_placement`,
`state_layout.replica_of`).

Example:
  >>> placement = Placement.of(config)    # config.state_layout='sharded'
  >>> placement.parallelism, placement.chosen, placement.replica
  ('shard_map', True, 'process')
"""

import dataclasses
from typing import Any

# The axis every device of every process sits on, unless config.axis_name
# names another.
DATA_AXIS = 'devices'


@dataclasses.dataclass(frozen=True)
class Placement:
  """The parallelism and the state's layout a config asks for.

  Attributes:
    parallelism: 'pmap' or 'shard_map' (runtime/parallelism/mapping.py);
      where config.parallelism is '', shard_map for a sharded state (pmap
      holds every argument whole on every device), else pmap.
    chosen: whether `parallelism` was chosen so (config.parallelism '').
    axis_name: the batch axis's name, a Python identifier.
    state_layout: config.state_layout, as given ('replicated' or 'sharded';
      state_layout.replica_of refuses any other).
    replica: config.replica, as given ('process', 'slice' or 'all').
    shard_dims: config.shard_dims, 'PATTERN=DIM,...' (state_layout.parse_dims).
  """
  parallelism: str = 'pmap'
  chosen: bool = True
  axis_name: str = DATA_AXIS
  state_layout: str = 'replicated'
  replica: str = 'process'
  shard_dims: str = ''

  @classmethod
  def of(cls, config: Any) -> 'Placement':
    """Reads a config made from runtime/config_base.py (fields left out take
    their defaults there).

    Raises:
      ValueError: an axis name that is not a Python identifier.
    """
    axis = config.get('axis_name') or DATA_AXIS
    if not isinstance(axis, str) or not axis.isidentifier():
      raise ValueError(f'config.axis_name={axis!r}; give a name such as '
                       f'\'batch\' (Flax\'s examples) or {DATA_AXIS!r}')
    layout = config.get('state_layout', 'replicated')
    named = config.get('parallelism') or ''
    chosen = 'shard_map' if layout == 'sharded' else 'pmap'
    return cls(parallelism=named or chosen,
               chosen=not named,
               axis_name=axis,
               state_layout=layout,
               replica=config.get('replica', 'process'),
               shard_dims=config.get('shard_dims', '') or '')
