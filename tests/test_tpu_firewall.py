"""launcher/tpu/firewall.py: which ports a TPU job's workers must reach,
and which of them a network's firewall rules leave closed."""

import pytest

from launcher.tpu import firewall

pytestmark = pytest.mark.unit

WORKER = '10.130.0.5'
ONE_SLICE = firewall.ports_needed(1, 8080)
TWO_SLICES = firewall.ports_needed(2, 8080)


def _rule(ports=None, protocol='tcp', ranges=('10.128.0.0/9',), **extra):
  allowed = {'IPProtocol': protocol}
  if ports is not None:
    allowed['ports'] = list(ports)
  return {
      'name': 'r',
      'direction': 'INGRESS',
      'allowed': [allowed],
      'sourceRanges': list(ranges),
      **extra
  }


def test_the_ports_of_one_slice_and_of_several():
  assert list(ONE_SLICE) == [8482]
  assert list(TWO_SLICES) == [8476, 8080]


def test_the_default_networks_internal_rule_opens_everything():
  internal = _rule(['0-65535'])
  assert firewall.missing([internal], TWO_SLICES, WORKER) == []
  assert firewall.missing([_rule(protocol='all')], TWO_SLICES, WORKER) == []


def test_an_old_recipe_opens_8476_and_not_jaxs_port_now():
  # JAX 0.8.1 moved the TPU coordinator to 8482 (jax #35905).
  assert firewall.missing([_rule(['8476'])], ONE_SLICE, WORKER) == [8482]
  assert firewall.missing([_rule(['8476', '8080'])], TWO_SLICES, WORKER) == []


@pytest.mark.parametrize(
    'rule',
    [
        _rule(['0-65535'], ranges=('192.168.0.0/16',)),  # other sources
        _rule(['0-65535'], disabled=True),
        _rule(['0-65535'], direction='EGRESS'),
        _rule(['0-65535'], protocol='udp'),
        _rule(['8000-8400']),
    ])
def test_rules_that_do_not_open_the_port_to_the_workers(rule):
  assert firewall.missing([rule], ONE_SLICE, WORKER) == [8482]


def test_a_rule_by_source_tags_is_taken_to_apply():
  tagged = _rule(['8482'], ranges=(), sourceTags=['tpu'])
  assert firewall.missing([tagged], ONE_SLICE, WORKER) == []


def test_the_advice_names_the_network_the_port_and_the_command():
  line = firewall.advice('vpc-a', 8482, "JAX's coordinator", WORKER)
  assert 'network vpc-a' in line and 'tcp:8482' in line
  assert ('gcloud compute firewall-rules create podrun-tcp-8482 '
          '--network=vpc-a --allow=tcp:8482 --source-ranges=10.130.0.5/32'
          in line)
