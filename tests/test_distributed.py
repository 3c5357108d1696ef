import pytest

from launcher.process import distributed
from launcher.common import cluster

pytestmark = pytest.mark.unit


def _options(**kwargs):
  return distributed.Options(**kwargs)


def test_plan():
  assert distributed.plan(_options(), env={}) == distributed.SINGLE
  slurm = {'SLURM_JOB_ID': '1', 'SLURM_STEP_NODELIST': 'n[1-2]',
           'SLURM_NTASKS': '2', 'SLURM_PROCID': '0', 'SLURM_LOCALID': '0'}
  assert distributed.plan(_options(), env=slurm) == distributed.DETECT
  explicit = _options(coordinator_address='10.0.0.1:1234', num_processes=2,
                      process_id=1)
  assert distributed.plan(explicit, env=slurm) == distributed.EXPLICIT


@pytest.mark.parametrize('kwargs, message', [
    (dict(num_processes=2), '--num_processes=2 given without '
     '--coordinator_address and --process_id'),
    (dict(coordinator_address='h:1', num_processes=2, process_id=2),
     '--process_id=2 is outside [0, 2)'),
    (dict(coordinator_address='nohostport', num_processes=2, process_id=0),
     "'nohostport' is not HOST:PORT"),
])
def test_plan_refuses_inconsistent_flags(kwargs, message):
  with pytest.raises(distributed.DistributedInitError) as e:
    distributed.plan(_options(**kwargs), env={})
  assert message in str(e.value)


def test_split_address_handles_ipv6():
  assert distributed.split_address('[::1]:8476') == ('::1', 8476)
  assert distributed.split_address('10.0.0.2:8476') == ('10.0.0.2', 8476)


def test_proxy_warning_and_exemption():
  env = {'https_proxy': 'http://proxy:3128', 'no_proxy': 'example.com'}
  warnings = cluster.proxy_warnings('10.0.0.2', env)
  assert len(warnings) == 1 and 'https_proxy' in warnings[0]
  cluster.exempt_from_proxy(['10.0.0.2'], env)
  assert env['no_proxy'] == 'example.com,10.0.0.2'
  assert env['NO_PROXY'] == '10.0.0.2'
  assert cluster.proxy_warnings('10.0.0.2', env) == []
  assert cluster.proxy_warnings('10.0.0.2', {}) == []


@pytest.mark.parametrize('env, name', [
    ({}, None),
    ({'SLURM_JOB_ID': '1', 'SLURM_STEP_NODELIST': 'n1', 'SLURM_NTASKS': '1',
      'SLURM_PROCID': '0', 'SLURM_LOCALID': '0'}, 'slurm'),
    ({'SLURM_JOB_ID': '1'}, None),  # An allocation, but not inside srun.
    ({'OMPI_MCA_orte_hnp_uri': '1.0;tcp://10.0.0.1:1'}, 'open_mpi'),
    ({'TPU_WORKER_HOSTNAMES': 'a,b'}, 'gke_tpu'),
    ({'KUBERNETES_SERVICE_HOST': '10.0.0.1', 'JOB_COMPLETION_INDEX': '3'},
     'kubernetes'),
    ({'KUBERNETES_SERVICE_HOST': '10.0.0.1'}, None),
])
def test_cluster_detection_reads_the_environment(env, name):
  assert cluster.detect(env) == name


def test_the_coordinator_listens_where_the_job_names_it():
  assert distributed.bind_address('127.0.0.1:8476') == (
      '127.0.0.1:8476', 'the address --coordinator_address names')
  assert distributed.bind_address('[::1]:8476')[0] in ('[::1]:8476', None)
  # Not this machine's: every interface, JAX's default, and why.
  bind, why = distributed.bind_address('192.0.2.7:8476')  # TEST-NET-1
  assert bind is None and why.startswith('192.0.2.7 is not an address of')
