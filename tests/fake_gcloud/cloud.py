"""The emulated Cloud TPU service behind tests/fake_gcloud/gcloud.

State lives under FAKE_TPU_POD_ROOT/.cloud, so that every gcloud call sees
the same service:

  queued/NAME.json   a queued resource: its request and its timeline
  events.jsonl       what happened when (created, preempted, deleted ...)
  answers.jsonl      the state each queued-resources describe answered
  creations          how many queued resources were ever created

A queued resource's state is a function of the clock and its timeline, as
the service reports it: ACCEPTED, then WAITING_FOR_RESOURCES for
FAKE_QR_WAIT_S (default 1; 'inf' never gets capacity; '1,1,30': one value
per creation, the last for the rest), PROVISIONING for
FAKE_QR_PROVISION_S (default 1), then ACTIVE with its nodes READY and
HEALTHY (FAKE_NODE_UNHEALTHY_S, default 0, after ACTIVE the nodes report
health TIMEOUT first). A delete turns it DELETING for FAKE_QR_DELETE_S (default 1), then
it is gone. FAKE_QR_FAIL=K makes the K-th creation end FAILED instead of
ACTIVE.

Spot preemption is scripted: FAKE_QR_PREEMPT_AFTER_S="8,8,8" preempts the
first three creations 8 s after each turns ACTIVE, and
FAKE_QR_PREEMPT_ON_LOG="step 12/,step 24/" the first two once worker 0 of
their first node (or of FAKE_QR_LOG_NODE, where process 0 of a multislice
job logs) has a job whose log holds that text (an event, not a time, so
that a slow machine preempts at the same step; an empty entry never). The nodes turn
PREEMPTED and the queued resource SUSPENDING, then SUSPENDED after a second
(both FAKE_QR_STATE_LAG_S, default 0, after the VMs' shutdown began, as the
service can show it late). Each worker VM gets SIGTERM, and SIGKILL
FAKE_TPU_PREEMPT_GRACE_S (default 2) s later (with FAKE_TPU_PREEMPT_NOTICE=0
SIGKILL alone, at once: a host lost without notice), as a Compute Engine VM's
shutdown does, or at once when the queued resource is deleted meanwhile;
its disk is gone.

A worker VM is its home directory, FAKE_TPU_POD_ROOT/NODE/worker_W, and the
processes whose environment holds FAKE_TPU_VM=ROOT|NODE#INCARNATION/W. A
created node's VMs are killed and their homes removed when it is preempted
or deleted; a recreated node starts with empty homes. A node that no queued
resource created is the pre-existing pod FAKE_TPU_NAME, whose homes are
FAKE_TPU_POD_ROOT/worker_W.

A clock process per queued resource (`gcloud __clock NAME`, detached)
carries out preemption and deletion at their times, and exits once the
queued resource is gone.
"""

import fcntl
import json
import os
import shutil
import signal
import time

QR_PHASES = ('ACCEPTED', 'WAITING_FOR_RESOURCES', 'PROVISIONING', 'ACTIVE')
_ACCEPT_S = 0.3
_SUSPEND_S = 1.0


def root() -> str:
  return os.environ['FAKE_TPU_POD_ROOT']


def cloud_dir() -> str:
  path = os.path.join(root(), '.cloud', 'queued')
  os.makedirs(path, exist_ok=True)
  return os.path.dirname(path)


class locked:
  """The service's one lock: every read-modify-write of its state."""

  def __enter__(self):
    self._file = open(os.path.join(cloud_dir(), 'lock'), 'w')
    fcntl.flock(self._file, fcntl.LOCK_EX)

  def __exit__(self, *exc):
    self._file.close()


def event(kind: str, **fields) -> None:
  with open(os.path.join(cloud_dir(), 'events.jsonl'), 'a') as f:
    f.write(json.dumps({'t': time.time(), 'event': kind, **fields}) + '\n')


def answer(name: str, state: str) -> None:
  with open(os.path.join(cloud_dir(), 'answers.jsonl'), 'a') as f:
    f.write(json.dumps({'name': name, 'state': state}) + '\n')


def _env_s(name: str, default: float) -> float:
  return float(os.environ.get(name, default))


def _per_creation_s(name: str, creation: int, default: float) -> float:
  """One value for every creation ('2'), or one each ('1,1,30'; the last
  for the creations after)."""
  values = [v for v in os.environ.get(name, '').split(',') if v.strip()]
  if not values:
    return default
  return float(values[min(creation, len(values)) - 1])


def _qr_path(name: str) -> str:
  return os.path.join(cloud_dir(), 'queued', f'{name}.json')


def load(name: str):
  try:
    with open(_qr_path(name)) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def save(qr: dict) -> None:
  tmp = _qr_path(qr['name']) + '.tmp'
  with open(tmp, 'w') as f:
    json.dump(qr, f)
  os.replace(tmp, _qr_path(qr['name']))


def all_names() -> list[str]:
  folder = os.path.join(cloud_dir(), 'queued')
  return sorted(n[:-5] for n in os.listdir(folder) if n.endswith('.json'))


def _next_creation() -> int:
  path = os.path.join(cloud_dir(), 'creations')
  try:
    with open(path) as f:
      number = int(f.read()) + 1
  except (OSError, ValueError):
    number = 1
  with open(path, 'w') as f:
    f.write(str(number))
  return number


def _scripted(name: str, creation: int):
  values = [v for v in os.environ.get(name, '').split(',') if v.strip()]
  return float(values[creation - 1]) if creation <= len(values) else None


def new_queued_resource(name: str, node_ids: list[str], request: dict) -> dict:
  """Records a new queued resource and its timeline (times are epochs)."""
  creation = _next_creation()
  now = time.time()
  waiting = now + _ACCEPT_S
  provisioning = waiting + _per_creation_s('FAKE_QR_WAIT_S', creation, 1)
  active = provisioning + _env_s('FAKE_QR_PROVISION_S', 1)
  preempt_after = _scripted('FAKE_QR_PREEMPT_AFTER_S', creation)
  qr = {
      'name': name,
      'node_ids': node_ids,
      'request': request,
      'creation': creation,
      'created': now,
      'waiting': waiting,
      'provisioning': provisioning,
      'active': active,
      'failed': str(creation) == os.environ.get('FAKE_QR_FAIL'),
      'preempted': (None if preempt_after is None else active + preempt_after),
      'deleting': None
  }
  save(qr)
  event('created', name=name, creation=creation, nodes=node_ids)
  return qr


def qr_state(qr: dict, now: float) -> str:
  """The queued resource's state at `now`, as the service reports it."""
  if qr['deleting'] is not None:
    return 'DELETING'
  shown = (None if qr['preempted'] is None else qr['preempted'] +
           _env_s('FAKE_QR_STATE_LAG_S', 0))
  if shown is not None and now >= shown:
    return 'SUSPENDED' if now >= shown + _SUSPEND_S else 'SUSPENDING'
  for phase, start in zip(reversed(QR_PHASES),
                          ('active', 'provisioning', 'waiting', 'created')):
    if now >= qr[start]:
      return 'FAILED' if phase == 'ACTIVE' and qr['failed'] else phase
  return 'ACCEPTED'


def node_state(qr: dict, now: float):
  """(state, health) of the queued resource's nodes, or None: no node."""
  state = qr_state(qr, now)
  if state in ('ACCEPTED', 'WAITING_FOR_RESOURCES', 'FAILED'):
    return None
  if state == 'PROVISIONING':
    return 'CREATING', None
  if state == 'DELETING':
    return 'DELETING', None
  if state in ('SUSPENDING', 'SUSPENDED'):
    return 'PREEMPTED', None
  if now < qr['active'] + _env_s('FAKE_NODE_UNHEALTHY_S', 0):
    return 'READY', 'TIMEOUT'  # Up, but its health check not yet passed.
  return 'READY', 'HEALTHY'


def owner_of(node: str):
  """The queued resource that created `node`, or None."""
  for name in all_names():
    qr = load(name)
    if qr and node in qr['node_ids']:
      return qr
  return None


def _vm_prefix(node: str, creation) -> str:
  """What every process of one incarnation of a node's VMs carries, the
  emulated service's root first: two tests' services on one machine may
  both have a node fleet-run-0 in its first incarnation, and one's
  preemption must never reach the other's VMs."""
  return f'{root()}|{node}#{creation}/'


def vm_marker(node: str, qr: dict, worker: int) -> str:
  return f'{_vm_prefix(node, qr["creation"])}{worker}'


def node_home(node: str, worker: int, created: bool) -> str:
  if not created:
    return os.path.join(root(), f'worker_{worker}')
  return os.path.join(root(), node, f'worker_{worker}')


def _vm_processes(prefix: str) -> list[int]:
  marker = f'FAKE_TPU_VM={prefix}'.encode()
  found = []
  for pid in os.listdir('/proc'):
    if not pid.isdigit() or int(pid) == os.getpid():
      continue
    try:
      with open(f'/proc/{pid}/environ', 'rb') as f:
        if any(e.startswith(marker) for e in f.read().split(b'\0')):
          found.append(int(pid))
    except OSError:
      continue
  return found


def _signal_all(pids: list[int], signum: int) -> None:
  for pid in pids:
    try:
      os.kill(pid, signum)
    except ProcessLookupError:
      pass


def shut_down(qr: dict, grace: float) -> None:
  """The VMs of every node of `qr` go: SIGTERM, SIGKILL after grace (at
  once when the queued resource is deleted meanwhile), disks removed."""
  prefixes = [_vm_prefix(node, qr['creation']) for node in qr['node_ids']]
  if grace > 0 or os.environ.get('FAKE_TPU_PREEMPT_NOTICE', '1') != '0':
    for prefix in prefixes:
      _signal_all(_vm_processes(prefix), signal.SIGTERM)
  deadline = time.monotonic() + grace
  while time.monotonic() < deadline and any(_vm_processes(p) for p in prefixes):
    if (load(qr['name']) or {}).get('deleting') is not None:
      break  # A delete ends the VMs at once, their shutdown or not.
    time.sleep(0.1)
  for prefix in prefixes:
    _signal_all(_vm_processes(prefix), signal.SIGKILL)
  # kill() returns before its target is gone: on a loaded machine a VM's
  # process can still finish a write after the disks went, and so bring a
  # worker's directory back. The disks go once the VMs are gone.
  deadline = time.monotonic() + 10
  while time.monotonic() < deadline and any(_vm_processes(p) for p in prefixes):
    time.sleep(0.05)
  for node in qr['node_ids']:
    shutil.rmtree(os.path.join(root(), node), ignore_errors=True)


def _log_shows(qr: dict, text: str) -> bool:
  node = os.environ.get('FAKE_QR_LOG_NODE') or qr['node_ids'][0]
  jobs = os.path.join(root(), node, 'worker_0', 'podrun', 'jobs')
  try:
    names = os.listdir(jobs)
  except OSError:
    return False
  for job in names:
    try:
      with open(os.path.join(jobs, job, 'log'), errors='replace') as f:
        if text in f.read():
          return True
    except OSError:
      continue
  return False


def _preempt_on_log(name: str, qr: dict, now: float) -> None:
  text = _scripted_text('FAKE_QR_PREEMPT_ON_LOG', qr['creation'])
  if (text and qr['preempted'] is None and qr['deleting'] is None and
      qr_state(qr, now) == 'ACTIVE' and _log_shows(qr, text)):
    with locked():
      qr = load(name)
      if qr is not None and qr['deleting'] is None:
        qr['preempted'] = now
        save(qr)


def _scripted_text(name: str, creation: int):
  values = os.environ.get(name, '').split(',')
  return values[creation - 1] if creation <= len(values) else None


def clock(name: str) -> int:
  """Carries out one queued resource's preemption and deletion."""
  creation = load(name)['creation']
  preempted_done = False
  while True:
    qr = load(name)
    if qr is None or qr['creation'] != creation:
      return 0
    now = time.time()
    _preempt_on_log(name, qr, now)
    qr = load(name) or qr
    if (not preempted_done and qr['preempted'] is not None and
        now >= qr['preempted'] and qr['deleting'] is None):
      event('preempted', name=name, creation=creation)
      notice = os.environ.get('FAKE_TPU_PREEMPT_NOTICE', '1') != '0'
      shut_down(qr, _env_s('FAKE_TPU_PREEMPT_GRACE_S', 2) if notice else 0)
      preempted_done = True
    if qr['deleting'] is not None and now >= qr['deleting'] + _env_s(
        'FAKE_QR_DELETE_S', 1):
      shut_down(qr, 0)
      with locked():
        os.remove(_qr_path(name))
      event('deleted', name=name, creation=creation)
      return 0
    time.sleep(0.1)
