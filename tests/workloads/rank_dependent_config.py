"""The probe, with another learning rate on rank 1: a config that depends on
the process reading it, as one reading a host-local file would.

  python -m launcher --config=tests/workloads/rank_dependent_config.py \
      --local_processes=2    # stops before step 1 with exit 3
"""

import sys

from tests.workloads import probe_config


def get_config():
  config = probe_config.get_config()
  if '--process_id=1' in sys.argv:
    config.optimizer.learning_rate = 0.5
  return config
