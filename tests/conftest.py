"""Every test runs with 8 emulated CPU devices, set before JAX is imported."""

import os

os.environ['XLA_FLAGS'] = ' '.join([
    f for f in os.environ.get('XLA_FLAGS', '').split()
    if not f.startswith('--xla_force_host_platform_device_count')
] + ['--xla_force_host_platform_device_count=8'])
os.environ['JAX_PLATFORMS'] = 'cpu'

import shutil  # pylint: disable=g-import-not-at-top,wrong-import-position
import signal  # pylint: disable=g-import-not-at-top,wrong-import-position
import tempfile  # pylint: disable=g-import-not-at-top,wrong-import-position
import uuid  # pylint: disable=g-import-not-at-top,wrong-import-position

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position

_CACHE_DIR = []

# A suite started in the background by a shell without job control inherits
# SIGINT ignored, and so would every launcher it starts (an ignored signal
# stays ignored across exec): the tests that Ctrl-C one would wait out their
# timeouts. Python's own handler, as under a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
  signal.signal(signal.SIGINT, signal.default_int_handler)

# Test tiers (pytest -m): `unit` needs neither devices nor processes,
# `devices` runs in this process on its 8 emulated devices, `processes`
# starts launcher processes (local pods, clusters, the emulated TPU pod, the
# schedulers). Every test module names its one tier in `pytestmark`, so that
# a module's tier says what its tests cost: a test that starts launcher
# processes sits in a `processes` module (test_X_processes.py beside
# test_X.py), and the launchers of tests/ refuse to start elsewhere.
TIERS = ('unit', 'devices', 'processes')


def module_tiers(module) -> list[str]:
  """The tier markers a test module's `pytestmark` names."""
  marks = getattr(module, 'pytestmark', [])
  marks = marks if isinstance(marks, list) else [marks]
  return [m.name for m in marks if m.name in TIERS]


def tier_problems(items) -> list[str]:
  """What breaks the tier rule: a module naming no tier or several, and a
  test marked with a tier other than its module's."""
  problems = set()
  for item in items:
    tiers = module_tiers(item.module)
    if len(tiers) != 1:
      problems.add(f'{item.path.name} names {", ".join(tiers) or "no tier"} '
                   'in `pytestmark`; name exactly one')
      continue
    own = {m.name for m in item.own_markers if m.name in TIERS}
    if own - set(tiers):
      problems.add(f'{item.name} in {item.path.name} ({tiers[0]}) is marked '
                   f'{", ".join(sorted(own))}: move it to a module of that '
                   'tier')
  return sorted(problems)


def pytest_collection_modifyitems(config, items):
  del config
  problems = tier_problems(items)
  if problems:
    raise pytest.UsageError(f'the test tiers ({", ".join(TIERS)}): ' +
                            '; '.join(problems))
  from tests import pairs  # pylint: disable=g-import-not-at-top
  for item in items:
    if pairs.is_version_dependent(item.path.name, item.originalname):
      item.add_marker(pytest.mark.versions)
  items[:] = reordered(items, os.environ.get(ORDER_VARIABLE, ''))


# Runs the modules in another order, to show that no test depends on what
# ran before it: `reverse`, or `shuffle:SEED` (the modules, and the tests
# within each, in a seeded random order). Empty: the order collected.
ORDER_VARIABLE = 'PODRUN_TEST_ORDER'


def reordered(items: list, order: str) -> list:
  """`items` in the order PODRUN_TEST_ORDER names; a module's tests stay
  together, so that its module-scoped fixtures are made once."""
  if not order:
    return list(items)
  modules: dict = {}
  for item in items:
    modules.setdefault(item.path, []).append(item)
  groups = list(modules.values())
  if order == 'reverse':
    return [item for group in reversed(groups) for item in group]
  kind, _, seed = order.partition(':')
  if kind != 'shuffle' or not seed.isdigit():
    raise pytest.UsageError(f'{ORDER_VARIABLE}={order!r}: use reverse or '
                            'shuffle:SEED (SEED a whole number)')
  import random  # pylint: disable=g-import-not-at-top
  shuffler = random.Random(int(seed))
  shuffler.shuffle(groups)
  for group in groups:
    shuffler.shuffle(group)
  return [item for group in groups for item in group]


@pytest.fixture(autouse=True)
def _fresh_process_state():
  """Every test starts from fresh process-wide state, whatever ran before
  it in this process, and leaves none behind (tests/process_state.py)."""
  from tests import process_state  # pylint: disable=g-import-not-at-top
  saved = process_state.fresh()
  yield
  process_state.restore(saved)


@pytest.fixture(autouse=True)
def _launchers_only_in_the_processes_tier(request, monkeypatch):
  """Outside the `processes` tier, the tests' ways to start launcher
  processes fail, naming the test and where it belongs."""
  tiers = module_tiers(request.module)
  if 'processes' in tiers or 'pytester' in request.fixturenames:
    return
  from tests import cluster, helpers, tpu_emulation  # pylint: disable=g-import-not-at-top

  def refuse(*args, **kwargs):
    del args, kwargs
    raise AssertionError(
        f'{request.node.nodeid} starts launcher processes in a '
        f'{"/".join(tiers)}-tier module: move it to a processes-tier module '
        '(tests/test_*_processes.py)')

  monkeypatch.setattr(helpers, 'start_launcher', refuse)
  monkeypatch.setattr(cluster.Cluster, '__init__', refuse)
  monkeypatch.setattr(tpu_emulation.FakePod, 'start', refuse)


# Every process a processes-tier test starts (launchers, ranks, emulated
# workers, srun's tasks) inherits this variable, with a value of the test's
# own: once the test is over, none may be left (docs/tests.md).
SURVIVOR_MARK = 'PODRUN_TEST_PROCESSES'
_SURVIVOR_WAIT_S = 15.0


@pytest.fixture(autouse=True)
def _no_process_survives_its_test(request, monkeypatch):
  """Fails a processes-tier test that leaves a process of its own behind,
  naming it, after stopping it by its id."""
  if 'processes' not in module_tiers(request.module):
    yield
    return
  from tests import helpers  # pylint: disable=g-import-not-at-top
  mark = f'{os.getpid()}-{uuid.uuid4().hex[:12]}'
  monkeypatch.setenv(SURVIVOR_MARK, mark)
  yield
  entry = f'{SURVIVOR_MARK}={mark}'
  if helpers.wait_for(lambda: not helpers.processes_with_env(entry),
                      _SURVIVOR_WAIT_S):
    return
  left = {pid: _command_line(pid) for pid in helpers.processes_with_env(entry)}
  for pid in left:
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
  pytest.fail(f'{request.node.nodeid} left {len(left)} process(es) running '
              f'{_SURVIVOR_WAIT_S:g} s after it ended (now killed): ' +
              '; '.join(f'{pid}: {cmd}' for pid, cmd in left.items()))


@pytest.fixture(scope='session')
def probe_2x4_straight(tmp_path_factory):
  """The workdir of the probe job trained helpers.STRAIGHT_STEPS steps on
  2 processes x 4 devices without interruption (every step logged, a
  checkpoint every 10): what the resumed runs of test_preemption,
  test_buckets and test_tpu_fleet are compared with, trained once."""
  from tests import helpers  # pylint: disable=g-import-not-at-top
  workdir = tmp_path_factory.mktemp('probe_2x4_straight')
  result = helpers.run_launcher([
      f'--config={helpers.PROBE_CONFIG}', '--config.log_every=1',
      '--config.checkpoint_every=10',
      f'--config.steps={helpers.STRAIGHT_STEPS}', '--local_processes=2',
      '--local_devices=4', f'--workdir={workdir}'
  ],
                                timeout=200)
  assert result.returncode == 0, result.output
  return workdir


def _command_line(pid: int) -> str:
  try:
    with open(f'/proc/{pid}/cmdline', 'rb') as f:
      return f.read().replace(b'\0', b' ').decode(errors='replace')[:200]
  except OSError:
    return '?'


def pytest_report_header(config):
  del config
  import sys  # pylint: disable=g-import-not-at-top
  import jaxlib  # pylint: disable=g-import-not-at-top
  return (f'podrun: Python {sys.version.split()[0]}, jax {jax.__version__}, '
          f'jaxlib {jaxlib.__version__}')


def pytest_configure(config):
  del config
  # The in-process tests train the same small models many times: JAX's
  # persistent compilation cache, as the launcher uses it, compiles each
  # program once per session.
  _CACHE_DIR.append(tempfile.mkdtemp(prefix='podrun_test_compilation_'))
  # Local checkpoint copies of failed runs stay behind by design; the tests'
  # go to a directory of their own, removed at the end, not to /dev/shm.
  _CACHE_DIR.append(tempfile.mkdtemp(prefix='podrun_test_local_tier_'))
  os.environ['PODRUN_LOCAL_CHECKPOINT_DIR'] = _CACHE_DIR[-1]
  # The same for the copies of workdirs in a bucket, unless a test gives
  # each of its "machines" one (tests/test_buckets.py).
  _CACHE_DIR.append(tempfile.mkdtemp(prefix='podrun_test_record_'))
  os.environ['PODRUN_RECORD_CACHE'] = _CACHE_DIR[-1]
  jax.config.update('jax_compilation_cache_dir', _CACHE_DIR[0])
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
  jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
  count = jax.device_count()
  if count != 8:
    raise pytest.UsageError(
        f'the tests need 8 emulated CPU devices, JAX sees {count}: something '
        'initialised JAX before tests/conftest.py set XLA_FLAGS.')


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  """A call over tests/budget.MOST_S fails, whatever it asserted."""
  del item
  outcome = yield
  report = outcome.get_result()
  if call.when != 'call' or not report.passed:
    return
  from tests import budget  # pylint: disable=g-import-not-at-top
  over = budget.over_most(call.duration)
  if over:
    report.outcome = 'failed'
    report.longrepr = over


def pytest_terminal_summary(terminalreporter):
  """Names the tests over tests/budget.SLOW_S that do not say why."""
  from tests import budget  # pylint: disable=g-import-not-at-top
  durations = {}
  for reports in terminalreporter.stats.values():
    for report in reports:
      if getattr(report, 'when', None) == 'call':
        durations[report.nodeid] = report.duration
  slow = budget.unexplained(durations, terminalreporter.config.rootpath)
  if slow:
    terminalreporter.section('tests over the budget that do not say why')
    terminalreporter.write_line(
        f'over {budget.SLOW_S:g} s without a docstring saying why '
        '(docs/tests.md): ' + '; '.join(slow))


def pytest_unconfigure(config):
  del config
  for directory in _CACHE_DIR:
    shutil.rmtree(directory, ignore_errors=True)
