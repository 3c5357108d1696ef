"""Whether the VPC lets a TPU job's workers reach each other on the ports
the job needs: JAX's coordinator and, across slices, MEGASCALE's.

A missing rule does not fail anything at once: jax.distributed.initialize
waits for the coordinator until its timeout, so a job hangs for minutes
without saying why. The driver reads the network's rules before it starts
the job and names each port that no rule opens to the workers (JAX moved
its TPU coordinator port from 8476 to 8482 in 0.8.1, while older firewall
recipes open 8476).

Example:
  >>> missing(rules, {8482: "JAX's coordinator"}, '10.130.0.5')
  [8482]
"""

import ipaddress
from typing import Iterable

# JAX's coordinator on one TPU slice (JAX 0.8.1 on), and the one podrun
# names for a multislice job (launcher/tpu/worker.py).
SLICE_COORDINATOR_PORT = 8482
MULTISLICE_COORDINATOR_PORT = 8476


def ports_needed(num_slices: int, megascale_port: int) -> dict[int, str]:
  """{port: what listens there} that every worker must reach."""
  if num_slices <= 1:
    return {SLICE_COORDINATOR_PORT: "JAX's coordinator"}
  return {
      MULTISLICE_COORDINATOR_PORT: "JAX's coordinator (slice 0)",
      megascale_port: 'MEGASCALE (--megascale_port)'
  }


def _covers(spec: str, port: int) -> bool:
  low, _, high = spec.partition('-')
  return int(low) <= port <= int(high or low)


def _allows(rule: dict, port: int) -> bool:
  for allowed in rule.get('allowed') or []:
    protocol = str(allowed.get('IPProtocol', '')).lower()
    if protocol not in ('tcp', 'all', '6'):
      continue
    ports = allowed.get('ports')
    if not ports or any(_covers(str(p), port) for p in ports):
      return True
  return False


def _from(rule: dict, source: str) -> bool:
  """Whether the rule admits traffic from `source` by its address. A rule
  by source tags or service accounts is taken to admit it: the workers'
  tags are not read here."""
  ranges = rule.get('sourceRanges') or []
  if not ranges:
    return bool(rule.get('sourceTags') or rule.get('sourceServiceAccounts'))
  address = ipaddress.ip_address(source)
  return any(address in ipaddress.ip_network(r, strict=False) for r in ranges)


def missing(rules: Iterable[dict], ports: dict[int, str],
            source: str) -> list[int]:
  """The ports of `ports` that no enabled ingress rule opens to `source`
  (a worker's internal address), sorted."""
  live = [
      r for r in rules if not r.get('disabled') and
      r.get('direction', 'INGRESS') == 'INGRESS' and _from(r, source)
  ]
  return sorted(p for p in ports if not any(_allows(r, p) for r in live))


def advice(network: str, port: int, what: str, source: str) -> str:
  """One line naming a missing rule and the command that adds one."""
  return (f'no firewall rule of network {network} lets the workers reach '
          f'tcp:{port} ({what}): the job would wait in '
          'jax.distributed.initialize until its timeout. Add one: gcloud '
          f'compute firewall-rules create podrun-tcp-{port} '
          f'--network={network} --allow=tcp:{port} '
          f'--source-ranges={source}/32 (or the subnet\'s range)')
