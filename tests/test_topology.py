import jax
import pytest
from ml_collections import config_dict

from runtime import topology

pytestmark = pytest.mark.unit


def _config_topology(**values):
  t = config_dict.ConfigDict()
  t.num_processes = config_dict.placeholder(int)
  t.local_devices = config_dict.placeholder(int)
  t.platform = config_dict.placeholder(str)
  for k, v in values.items():
    setattr(t, k, v)
  return t


def test_current_sees_eight_devices():
  topo = topology.current()
  assert jax.device_count() == 8
  assert (topo.process_count, topo.local_device_count, topo.global_device_count,
          topo.platform) == (1, 8, 8, 'cpu')


def test_matching_topology_passes():
  expected = topology.expectations(_config_topology(num_processes=1,
                                                    local_devices=8,
                                                    platform='CPU'),
                                   process_index=(0, '--process_id'))
  topology.check(expected, topology.current())


def test_mismatch_names_every_factor():
  expected = topology.expectations(
      _config_topology(num_processes=4, local_devices=2, platform='tpu'))
  actual = topology.Topology(process_index=0,
                             process_count=2,
                             local_device_count=4,
                             global_device_count=8,
                             platform='cpu',
                             device_kind='cpu')
  with pytest.raises(topology.TopologyMismatchError) as e:
    topology.check(expected, actual)
  message = str(e.value)
  assert '3 factors' in message
  assert 'num_processes: config.topology.num_processes expects 4, but 2' in message
  assert 'local_devices: config.topology.local_devices expects 2, but 4' in message
  assert 'platform: config.topology.platform expects tpu, but cpu' in message


def test_uneven_pod_is_refused():
  actual = topology.Topology(0, 2, 4, 6, 'cpu', 'cpu')
  with pytest.raises(topology.TopologyMismatchError, match='uneven pod'):
    topology.check([], actual)


def test_config_and_flags_that_disagree_are_refused_before_start():
  with pytest.raises(topology.TopologyMismatchError) as e:
    topology.expectations(_config_topology(num_processes=4),
                          num_processes=(2, '--local_processes'))
  assert 'config.topology.num_processes=4 but --local_processes=2' in str(
      e.value)
