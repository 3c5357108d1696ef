"""A loop of one's own, reporting progress once a step.

  python -m launcher --config=tests/workloads/own_loop_config.py --local_processes=2
"""

from runtime import config_base


def get_config():
  config = config_base.get_config()
  config.workload = 'tests.workloads.own_loop:train_and_evaluate'
  config.steps = 10
  config.step_seconds = 0.5
  config.report = True
  return config
