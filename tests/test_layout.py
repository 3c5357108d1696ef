"""The workdir's layout: one place spells its paths and says who writes each.

That a real pod writes nothing else: test_local_pod."""

import ast
import json
import os
import pathlib

import pytest

from runtime.common import handoff
from runtime.common import layout
from tests import helpers

pytestmark = pytest.mark.unit


def test_every_path_is_where_the_docstring_says(tmp_path):
  record = layout.Record(str(tmp_path))
  relative = {
      'summary.json':
          record.summary(),
      'goodput.jsonl':
          record.rollup(),
      'metrics.jsonl':
          record.metrics(),
      'tensorboard':
          record.tensorboard(),
      'device_batch_limit.json':
          record.batch_limit(),
      'ranks/rank_2.json':
          record.result(2),
      'goodput':
          record.ledgers(),
      'goodput/job-a3/rank_1.json':
          record.ledger('job-a3', 1),
      'goodput/job-a3/rank_1.step':
          layout.high_water(record.ledger('job-a3', 1)),
      'stall/rank_0.json':
          record.stall(0),
      'logs/rank_5.log':
          record.process_log(5),
      'logs/attempts.jsonl':
          record.attempts(),
      'logs/job.json':
          record.job(),
      'checkpoints':
          record.checkpoints(),
      'compilation_cache':
          record.compilation_cache(),
      '.podrun/join':
          record.join(),
  }
  for expected, path in relative.items():
    assert os.path.relpath(path, tmp_path) == expected
    assert expected.split('/')[0] in layout.TOP_LEVEL, expected


def test_rank_files_are_read_back_by_index(tmp_path):
  for name in ('rank_0.json', 'rank_10.json', 'rank_2.json', 'rank_2.step',
               'rank_x.json', 'other.json'):
    (tmp_path / name).write_text('{}')
  found = layout.ranks(str(tmp_path))
  assert list(found) == [0, 2, 10]
  assert found[10] == str(tmp_path / 'rank_10.json')
  assert list(layout.ranks(str(tmp_path), '.step')) == [2]
  assert layout.rank_of('goodput/a/rank_12.json') == 12
  assert layout.rank_of('summary.json') is None


def test_attempts_with_ledgers_lists_each_attempts_processes(tmp_path):
  record = layout.Record(str(tmp_path))
  for attempt, index in (('job-a1', 0), ('job-a1', 1), ('job-a2', 0)):
    os.makedirs(os.path.dirname(record.ledger(attempt, index)), exist_ok=True)
    with open(record.ledger(attempt, index), 'w') as f:
      f.write('{}')
  os.makedirs(os.path.join(record.ledgers(), 'empty'))
  assert {
      a: list(r) for a, r in record.attempts_with_ledgers().items()
  } == {
      'job-a1': [0, 1],
      'job-a2': [0]
  }


@pytest.mark.parametrize('relative, writer', [
    ('goodput/job-a1/rank_3.json', 3),
    ('goodput/job-a1/rank_3.step', 3),
    ('stall/rank_1.json', 1),
    ('ranks/rank_0.json', 0),
    ('metrics.jsonl', 0),
    ('tensorboard/events.out.tfevents.1', 0),
    ('run.json', 0),
    ('summary.json', layout.LAUNCHER),
    ('goodput.jsonl', layout.LAUNCHER),
    ('logs/attempts.jsonl', layout.LAUNCHER),
    ('logs/job.json', layout.LAUNCHER),
    ('logs/rank_2.log', layout.LAUNCHER),
])
def test_each_file_has_one_writer(relative, writer):
  assert layout.owner(relative) == writer


def test_what_a_bucket_holds():
  for relative in ('summary.json', 'run.json', 'goodput.jsonl',
                   'logs/attempts.jsonl', 'logs/job.json', 'metrics.jsonl',
                   'goodput/a/rank_0.json'):
    assert layout.mirrored(relative), relative
  for relative in ('checkpoints/10/state', '.podrun/join/rank_0.json',
                   'compilation_cache/x', 'logs/rank_0.log',
                   'metrics.jsonl.tmp123'):
    assert not layout.mirrored(relative), relative


def test_a_bucket_s_record_is_this_machine_s_copy_and_its_checkpoints_the_bucket(
    tmp_path, monkeypatch):
  monkeypatch.setenv('PODRUN_RECORD_CACHE', str(tmp_path))
  record = layout.Record.of('gs://runs/mnist/')
  assert record.workdir == str(tmp_path / 'runs' / 'mnist')
  assert record.bucket == 'gs://runs/mnist'
  assert record.summary() == str(tmp_path / 'runs' / 'mnist' / 'summary.json')
  assert record.checkpoints() == 'gs://runs/mnist/checkpoints'
  local = layout.Record.of('/runs/mnist')
  assert (local.workdir, local.bucket) == ('/runs/mnist', None)
  assert local.checkpoints() == '/runs/mnist/checkpoints'


def _names_used(tree: ast.AST) -> set[str]:
  return ({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} |
          {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)})


def test_no_module_but_the_layout_decides_where_the_record_lives():
  """Where a bucket's record is copied (`local_copy`, PODRUN_RECORD_CACHE)
  is read in layout.py alone (handoff.py names the variable); everyone
  else asks `Record.of`."""
  own = {
      helpers.REPO / 'runtime' / 'common' / name
      for name in ('layout.py', 'handoff.py')
  }
  deciders = []
  for top in ('launcher', 'runtime', 'scripts'):
    for path in sorted((helpers.REPO / top).rglob('*.py')):
      if path in own:
        continue
      used = _names_used(ast.parse(path.read_text(), str(path)))
      if used & {'local_copy', 'RECORD_CACHE'}:
        deciders.append(str(path.relative_to(helpers.REPO)))
  assert not deciders, deciders


def test_a_copy_of_a_buckets_record_is_that_record(tmp_path, monkeypatch):
  """What a workload is handed for a gs:// workdir is this machine's copy;
  its checkpoints are still the bucket's, read from the copy's marker, so
  nothing writes them into the config."""
  from runtime.checkpoints import options as checkpoint_options  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv(handoff.RECORD_CACHE, str(tmp_path))
  record = layout.Record.of('gs://runs/mnist/')
  copy = record.workdir
  assert layout.Record.of(copy).checkpoints() == copy + '/checkpoints'
  (pathlib.Path(copy) / '.podrun').mkdir(parents=True)
  (pathlib.Path(copy) / layout.COPY_OF).write_text(
      json.dumps({
          'url': 'gs://runs/mnist',
          'job_id': 'j'
      }))
  again = layout.Record.of(copy)
  assert again.bucket == 'gs://runs/mnist' and again.workdir == copy
  assert again.checkpoints() == 'gs://runs/mnist/checkpoints'
  from configs import linear_regression  # pylint: disable=g-import-not-at-top
  config = linear_regression.get_config()
  assert checkpoint_options.directory(
      config, layout.Record.of(copy)) == ('gs://runs/mnist/checkpoints')


def test_nothing_writes_the_checkpoint_directory_into_a_config():
  writers = []
  for top in ('launcher', 'runtime'):
    for path in sorted((helpers.REPO / top).rglob('*.py')):
      if path.name == 'config_base.py':  # The default, ''.
        continue
      for node in ast.walk(ast.parse(path.read_text())):
        targets = (node.targets if isinstance(node, ast.Assign) else
                   [node.target] if isinstance(node, (ast.AugAssign,
                                                      ast.AnnAssign)) else [])
        for target in targets:
          for leaf in ast.walk(target):
            if isinstance(leaf, ast.Attribute) and (leaf.attr
                                                    == 'checkpoint_dir'):
              writers.append(f'{path.relative_to(helpers.REPO)}:'
                             f'{node.lineno}')
  assert not writers, writers


def test_the_workdir_a_workload_is_handed_carries_its_record(tmp_path):
  # The launcher knows the bucket; the runtime is told, not left to find
  # a copy_of.json (there is none here).
  record = layout.Record(str(tmp_path / 'copy'), bucket='gs://runs/mnist')
  workdir = layout.Workdir(record)
  assert workdir == str(tmp_path / 'copy')
  assert os.path.join(workdir, 'x') == str(tmp_path / 'copy' / 'x')
  assert layout.Record.of(workdir) is record
  assert layout.Record.of(str(workdir)).bucket is None
