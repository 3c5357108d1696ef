"""The linear regression, run by tests/workloads/probe.py.

  python -m launcher --config=tests/workloads/probe_config.py --local_processes=2 \
      --config.fail_rank=1 --config.fail_step=3
"""

from configs import linear_regression


def get_config():
  config = linear_regression.get_config()
  config.workload = 'tests.workloads.probe:train_and_evaluate'
  config.steps = 20
  config.log_every = 5
  config.fail_rank = -1
  config.fail_step = 3
  config.fail_mode = 'exit'
  config.fail_code = 7
  config.fail_seconds = 0.0
  config.record_ids = False
  config.ballast_floats = 0
  config.per_rank_checkpoint_dir = False
  config.per_rank_local_dir = False
  config.fail_once = False
  config.fail_at_step = 0
  config.flip_rank = -1
  config.flip_step = 0
  config.flip_device = 0
  config.kill_in_local_save = 0
  config.eval_seconds = 0.0
  config.nan_on_padding = False
  config.log_ids = False
  config.step_seconds = 0.0
  config.device_example_seconds = 0.0
  config.slow_below_processes = 0
  config.slow_below_seconds = 0.0
  config.census = False
  # The examples as a grain MapDataset over the same arrays, with a
  # random_map that jitters each record's x by its own draw (a data field:
  # a resumed run must agree on it).
  config.data.grain = False
  # A variable each process prints at its start, as `probe: env NAME=VALUE`
  # ('' for none): what reached it.
  config.echo_env = ''
  # How the probe misbehaves only steers the run: outside the trajectory
  # sections, so a resumed run may change it with no registration.
  return config
