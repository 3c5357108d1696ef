"""The docs' shell recipes, read from the pages themselves and run: every
`podrun` command for one machine (and the scripts that read what it
wrote) as written, and the multi-host ones against the emulations: the
Cloud TPU ones on the fake gcloud (workers whose image has Python 3.10, as
tpu-ubuntu2204-base has), the Ray one on a local Ray cluster, MNIST in a
fake-gcs-server bucket. A block with a command run nowhere here says so on
its page, and why, in a line above it that opens with `*Not run here` or
`*Partly run here` (test_every_shell_block_is_run_or_says_why).

Each recipe runs as written, but for what names a real machine and what
the emulation needs, all in `_emulated`:
- the bucket `gs://BUCKET` is the emulator's, `/shared` a directory here,
  `--address=auto` the local cluster, `{"GPU": 8}` its `{"host": 1}`;
- the TPU launch gets --skip_preflight (no Cloud TPU API here),
  --worker_python=python3.X (the name --provision_python installs; else a
  worker would pip-install JAX for TPUs) and --log_dir; every job gets
  --local_devices (CPU devices) and a few steps of MNIST.
"""

import json
import re
import shlex
import subprocess
import sys
import time

import pytest

from runtime.workloads import mnist
from tests import gcs as gcs_lib
from tests import helpers
from tests import test_docs_examples
from tests import ray_cluster  # Before Ray: it keeps Ray on 127.0.0.1.
from tests import tpu_emulation

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

# Where the recipes are: the README and every page of the docs.
PAGES = [
    helpers.REPO / 'README.md', *sorted((helpers.REPO / 'docs').rglob('*.md'))
]
SHORT = [
    '--config.steps=3', '--config.global_batch_size=64', '--config.eval_every=0'
]


def recipe(first_words: str, holding: str = '') -> list[str]:
  """The docs' shell command (continuations joined, comments dropped)
  that starts with `first_words` and holds `holding`, as words.

  Raises:
    AssertionError: naming what was looked for, when no command or more
      than one matches.
  """
  found = []
  every_page = '\n'.join(page.read_text() for page in PAGES)
  for block in re.findall(r'```sh\n(.*?)```', every_page, re.S):
    for command in block.replace('\\\n', ' ').splitlines():
      if not command.startswith(first_words.split()[0]):
        continue  # Not a command of that program.
      try:
        words = shlex.split(command, comments=True)
      except ValueError:  # A quote that goes on over lines: not a recipe's.
        continue
      text = ' '.join(words)
      if text.startswith(first_words) and holding in text:
        found.append(words)
  assert len(found) == 1, (
      f'{len(found)} commands of the docs start with {first_words!r} and hold '
      f'{holding!r}: {found}')
  return found[0]


# The multi-host recipes the tests below run: (first words, held words),
# as recipe() finds them.
EMULATED = (('gcloud compute tpus tpu-vm create my-pod', ''),
            ('scripts/launch_tpu_pod.sh --tpu=my-pod', 'linear_regression'),
            ('scripts/launch_tpu_pod.sh --tpu=my-v4-32', '--create'),
            ('podrun-ray --address=auto --num_processes=4 '
             '--resources_per_process={"GPU": 8} --', '--config.data_dir'))
# Scripts a recipe runs on what a local job wrote; the rest (the benchmark,
# MNIST's download) are not run here.
LOCAL_SCRIPTS = ('scripts/goodput.py', 'scripts/plot_metrics.py')
# The console scripts that read what a job wrote, and their modules.
READERS = {('podrun-goodput',): 'launcher.goodput_report'}
_MARKERS = ('*Not run here', '*Partly run here')


def shell_blocks() -> list[tuple[str, str, list[str]]]:
  """(page, the text above the block, its commands) of every sh block;
  continuations joined, comment lines dropped."""
  out = []
  for page in PAGES:
    text = page.read_text()
    for found in re.finditer(r'```sh\n(.*?)```', text, re.S):
      commands = [
          c for c in found.group(1).replace('\\\n', ' ').splitlines()
          if c.strip() and not c.lstrip().startswith('#')
      ]
      out.append(
          (str(page.relative_to(helpers.REPO)),
           text[:found.start()].rstrip().rsplit('\n', 1)[-1].strip(), commands))
  return out


def is_local(words: list[str]) -> bool:
  """A command for one machine that test_every_local_recipe_runs runs."""
  if any('gs://' in w for w in words):
    return False  # A bucket: the emulated TPU recipes' own.
  if words[:1] == ['python'] and len(words) > 1:
    return words[1] in LOCAL_SCRIPTS
  if tuple(words[:1]) in READERS:
    return True
  if words[:1] not in (['podrun'], ['scripts/run.sh']):
    return False
  cluster = ('--num_processes', '--process_id', '--coordinator_address=10.')
  return not any(w.startswith(cluster) for w in words)


def is_run_here(command: str) -> bool:
  try:
    words = shlex.split(command, comments=True)
  except ValueError:
    return False
  # Moving about, and the suite itself, which is what CI runs (.ci/run).
  if not words or words[0] in ('cd', 'mkdir', 'scripts/test.sh'):
    return True
  text = ' '.join(words)
  return is_local(words) or any(
      text.startswith(first) and held in text for first, held in EMULATED)


def test_every_shell_block_is_run_or_says_why():
  unsaid, stale = [], []
  for page, above, commands in shell_blocks():
    marked = above.startswith(_MARKERS)
    missing = [c for c in commands if not is_run_here(c)]
    if missing and not marked:
      unsaid.append(f'{page}: {missing[0]!r}')
    if marked and not missing:
      stale.append(f'{page}: {above!r}')
  assert not unsaid, ('commands run by no test, in blocks without a '
                      f'"*Not run here..." line above: {unsaid}')
  assert not stale, f'blocks that say they are not run, and are: {stale}'


# What a command says of itself where it means to train nothing more.
_RESUMES = ('resume', 'already')


def workdir_of(words: list[str]) -> str:
  """The workdir a podrun or scripts/run.sh command writes, as the launcher
  names it: --workdir, else workdirs/<config name>[_<config arg>]
  (launcher/cli.py `config_name`; run.sh's default config is the linear
  regression)."""
  for word in words:
    if word.startswith('--workdir='):
      return word.split('=', 1)[1]
  config = next(
      (w.split('=', 1)[1] for w in words if w.startswith('--config=')),
      'linear_regression.py')
  path, _, arg = config.partition(':')
  name = path.rsplit('/', 1)[-1].rsplit('.', 1)[0]
  return f'workdirs/{name}_{arg}' if arg else f'workdirs/{name}'


def pasted_collisions(commands: list[str]) -> list[str]:
  """The commands of one page that, pasted in order into one directory,
  write a workdir a line above already trained, and do not say they
  resume: each would train nothing (or a mix)."""
  seen, found = {}, []
  for command in commands:
    try:
      words = shlex.split(command, comments=True)
    except ValueError:
      continue
    if not is_local(words) or words[0] == 'python' or '--dry_run' in words:
      continue
    where = workdir_of(words)
    if where in seen and not any(w in command.lower() for w in _RESUMES):
      found.append(f'{command!r} writes {where}, as {seen[where]!r} above')
    seen.setdefault(where, command)
  return found


def test_no_page_s_commands_train_nothing_as_pasted_in_order():
  # The README's second command once reused the first's workdir and
  # trained nothing, exit 0; so did five other pairs.
  assert pasted_collisions([
      'scripts/run.sh',
      'podrun --config=configs/linear_regression.py --local_processes=2'
  ]) == [
      "'podrun --config=configs/linear_regression.py --local_processes=2' "
      "writes workdirs/linear_regression, as 'scripts/run.sh' above"
  ]
  assert pasted_collisions([
      'podrun --config=configs/mlp.py --config.steps=300',
      'podrun --config=configs/mlp.py --config.steps=600   # ...resumes'
  ]) == []
  pages: dict[str, list[str]] = {}
  for page, _, commands in shell_blocks():
    pages.setdefault(page, []).extend(commands)
  found = {page: pasted_collisions(c) for page, c in pages.items()}
  assert {p: f for p, f in found.items() if f} == {}


# The local recipes in three parts of about a minute each alone (each well
# under the suite's budget a test, tests/budget.py, with the suite beside
# it): the pages whose jobs the readers' commands read (MNIST's workdir is
# the README's) in one.
_PARTS = {
    'the README, the deployments and the readers':
        ('README.md', 'docs/deployments/', 'docs/benchmarks.md',
         'docs/reference/goodput.md'),
    'elastic jobs, checkpoints and workloads':
        ('docs/elastic.md', 'docs/reference/checkpoints.md', 'docs/workloads.md'
        ),
    'running jobs and every other page': (),
}


def _part_of(page: str) -> str:
  """The part a page's recipes run in: the first that names it, else the
  last."""
  return next((part for part, prefixes in _PARTS.items()
               if prefixes and page.startswith(prefixes)),
              list(_PARTS)[-1])


@pytest.mark.parametrize('part', list(_PARTS))
def test_every_local_recipe_runs(tmp_path, part):
  """About a minute a part: every podrun command of the docs for one
  machine (twenty, local pods among them) as written, 2 steps each, then
  the scripts that read what they wrote; from a directory of their own with
  podrun's configs and synthetic MNIST in data/mnist, as a clone has them.
  Commands that run the same argv (`scripts/run.sh` is podrun after its
  install, and every job's steps are 2) run once."""
  (tmp_path / 'configs').symlink_to(helpers.REPO / 'configs')
  for name, body in test_docs_examples.project_files().items():
    (tmp_path / f'{name}.py').write_text(body)  # The docs' my_project.
  mnist.write_synthetic(str(tmp_path / 'data' / 'mnist'),
                        num_train=512,
                        num_test=64)
  seen = {}
  for page, _, commands in shell_blocks():
    if _part_of(page) != part:
      continue
    for command in commands:
      try:
        words = shlex.split(command, comments=True)
      except ValueError:  # A quote that goes on over lines: a remote shell's.
        continue
      if is_local(words):
        seen.setdefault(tuple(_argv(words, tmp_path)), (page, command, words))
  # The jobs first, then the scripts that read what they wrote.
  for argv, (page, command, words) in sorted(
      seen.items(),
      key=lambda s: s[1][2][0] == 'python' or tuple(s[1][2][:1]) in READERS):
    result = subprocess.run(list(argv),
                            cwd=tmp_path,
                            env=helpers.launcher_env(),
                            capture_output=True,
                            text=True,
                            timeout=240)
    assert result.returncode == 0, (
        f'{page}: {command}\n{result.stdout[-2000:]}{result.stderr[-3000:]}')
  assert len(seen) >= 4, seen


def _argv(words: list[str], tmp_path) -> list[str]:
  """What the test runs for a recipe's words: a script by its path, a
  reader by its module, podrun (and scripts/run.sh, podrun after its
  install) as the launcher's module with 2 steps."""
  words = _emulated(words, {'/tmp/': f'{tmp_path}/'})
  if words[0] == 'python':
    return [sys.executable, str(helpers.REPO / words[1]), *words[2:]]
  if tuple(words[:1]) in READERS:
    return [sys.executable, '-m', READERS[tuple(words[:1])], *words[1:]]
  given = [w for w in words[1:] if not w.startswith('--config.steps=')]
  default = ([] if words[0] == 'podrun' or any(
      w.startswith('--config=') for w in words) else
             ['--config=configs/linear_regression.py'])
  return [
      sys.executable, '-m', 'launcher', *default, *given, '--config.steps=2'
  ]


def _emulated(words: list[str], replace: dict[str, str]) -> list[str]:
  """`words` with each `replace` key replaced, in every word."""
  out = []
  for word in words:
    for old, new in replace.items():
      word = word.replace(old, new)
    out.append(word)
  return out


def _tpu_args(words: list[str], logs) -> list[str]:
  """A launch_tpu_pod.sh recipe's words, with the emulation's own flags
  before `--` and CPU devices after it."""
  at = words.index('--')
  return [
      *words[1:at], '--skip_preflight',
      f'--worker_python={tpu_emulation.WORKER_PYTHON}', f'--log_dir={logs}',
      *words[at:], '--local_devices=4'
  ]


@pytest.fixture
def gcs(tmp_path):
  with gcs_lib.FakeGcs(tmp_path / 'gcs') as server:
    server.bucket('bucket')
    local = tmp_path / 'mnist'
    mnist.write_synthetic(str(local), num_train=512, num_test=64)
    for path in sorted(local.iterdir()):
      server.write('bucket', f'mnist-data/{path.name}', path.read_bytes())
    yield server


def _pod(tmp_path, gcs, **env) -> tpu_emulation.FakePod:
  """Four workers (a v4-32) on the Ubuntu 22.04 image, reaching the bucket."""
  ubuntu = tpu_emulation.ubuntu_2204_path(tmp_path)
  paths = {f'FAKE_TPU_WORKER_PATH_{w}': ubuntu for w in range(4)}
  return tpu_emulation.FakePod(tmp_path,
                               workers=4,
                               FAKE_TPU_WORKER_ENV=json.dumps(gcs.env()),
                               **paths,
                               **gcs.env(),
                               **env)


def _run(pod, args, timeout=240) -> helpers.Result:
  started = time.monotonic()
  proc = subprocess.Popen([tpu_emulation.SCRIPT, *args],
                          cwd=helpers.REPO,
                          env=pod.env,
                          stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE,
                          text=True,
                          start_new_session=True)
  try:
    return helpers.finish(proc, timeout, started)
  finally:
    helpers.kill_group(proc)
    pod.kill_leftovers()


def test_the_tpu_quick_recipe_on_an_existing_slice(tmp_path, gcs):
  """About 20 s: four workers provisioned with Python, then the job."""
  # `gcloud compute tpus tpu-vm create my-pod ... v4-32` is the emulation's
  # own pod, of that name and type.
  create = recipe('gcloud compute tpus tpu-vm create my-pod')
  assert '--accelerator-type=v4-32' in create
  pod = _pod(tmp_path,
             gcs,
             FAKE_TPU_NAME='my-pod',
             FAKE_TPU_ACCELERATOR_TYPE='v4-32')
  words = recipe('scripts/launch_tpu_pod.sh --tpu=my-pod', 'linear_regression')
  result = _run(
      pod, _tpu_args(_emulated(words, {'gs://BUCKET': 'gs://bucket'}),
                     pod.logs))
  assert result.returncode == 0, result.output
  assert 'installing Python' in result.stderr  # --provision_python did.
  summary = json.loads(gcs.read('bucket', 'lr/summary.json'))
  assert (summary['process_count'], summary['device_count']) == (4, 16)


def test_the_tpu_spot_recipe_creates_trains_on_mnist_and_deletes(tmp_path, gcs):
  """About 30 s: a queued resource created, four workers provisioned, MNIST
  from the bucket, the slice deleted after."""
  words = recipe('scripts/launch_tpu_pod.sh --tpu=my-v4-32', '--create')
  pod = _pod(tmp_path,
             gcs,
             FAKE_QR_WAIT_S='0.5',
             FAKE_QR_PROVISION_S='0.5',
             FAKE_TPU_NAME='unused')
  result = _run(pod, [
      *_tpu_args(_emulated(words, {'gs://BUCKET': 'gs://bucket'}), pod.logs),
      *SHORT
  ])
  assert result.returncode == 0, result.output
  assert 'installing Python' in result.stderr
  assert ('the job ended (--delete_after): deleting queued resource '
          'my-v4-32') in result.stderr
  assert pod.queued_resources() == []
  summary = json.loads(gcs.read('bucket', 'mnist/summary.json'))
  assert (summary['process_count'], summary['device_count']) == (4, 16)


def _podrun_ray(nodes: int, words: list[str], replace: dict[str, str], *more:
                str) -> helpers.Result:
  """A docs' podrun-ray command on a Ray cluster of `nodes` nodes of its
  own on this machine, `replace`d words swapped (the cluster's address
  for 'auto' among them) and `more` flags added, to its end."""
  with ray_cluster.RayCluster(nodes=nodes) as cluster:
    emulated = _emulated(words, {
        '--address=auto': f'--address={cluster.address}',
        **replace
    })
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, '-m', 'launcher.ray', *emulated[1:], *more],
        cwd=helpers.REPO,
        env=helpers.launcher_env(**ray_cluster.ENV),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True)
    try:
      return helpers.finish(proc, 200, started)
    finally:
      helpers.kill_group(proc)


def test_the_ray_one_node_try_out_runs_as_pasted(tmp_path):
  """About 20 s: docs/deployments/ray.md's first recipe, its podrun-ray
  line as written (the address and the workdir aside) on one node."""
  pytest.importorskip('ray')
  words = recipe('podrun-ray --address=auto --num_processes=1')
  assert words.index('--') < words.index('--local_devices=4'), words
  result = _podrun_ray(1, words, {'/tmp/podrun-ray-try': str(tmp_path)}, *SHORT)
  assert result.returncode == 0, result.output
  summary = helpers.read_json(tmp_path / 'summary.json')
  assert (summary['process_count'], summary['device_count']) == (1, 4)


def test_the_ray_recipe_on_a_local_cluster(tmp_path):
  """About 25 s: a 4-node Ray cluster of its own, then MNIST from /shared."""
  pytest.importorskip('ray')
  shared = tmp_path / 'shared'
  mnist.write_synthetic(str(shared / 'mnist-data'), num_train=512, num_test=64)
  words = recipe('podrun-ray --address=auto --num_processes=4 '
                 '--resources_per_process={"GPU": 8} --')
  result = _podrun_ray(4, words, {
      '{"GPU": 8}': '{"host": 1}',
      '/shared': str(shared)
  }, '--local_devices=2', *SHORT)
  assert result.returncode == 0, result.output
  summary = helpers.read_json(shared / 'mnist' / 'summary.json')
  assert (summary['process_count'], summary['device_count']) == (4, 8)
