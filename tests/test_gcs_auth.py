"""gcs_auth: one search for credentials per process, every gcsfs client
after it takes its answer."""

import json
import logging as stdlib_logging

import fsspec.config
import gcsfs
import pytest

from runtime.common import gcs_auth

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path):
  """No search made yet, fsspec's config and gcsfs's instances this test's
  own, and no credentials of this machine's user."""
  monkeypatch.setattr(gcs_auth, '_search', None)
  monkeypatch.setattr(gcs_auth, '_found', {})
  monkeypatch.setattr(fsspec.config, 'conf', {})
  gcsfs.GCSFileSystem.clear_instance_cache()
  monkeypatch.setenv('HOME', str(tmp_path / 'home'))
  monkeypatch.setenv('CLOUDSDK_CONFIG', str(tmp_path / 'gcloud'))
  for name in ('STORAGE_EMULATOR_HOST', 'GOOGLE_APPLICATION_CREDENTIALS',
               'GOOGLE_CLOUD_PROJECT'):
    monkeypatch.delenv(name, raising=False)
  yield
  gcsfs.GCSFileSystem.clear_instance_cache()


def _service_account_key(path) -> str:
  """A key file google.auth reads without the network (made here)."""
  from cryptography.hazmat.primitives import serialization  # pylint: disable=g-import-not-at-top
  from cryptography.hazmat.primitives.asymmetric import rsa  # pylint: disable=g-import-not-at-top
  key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
  pem = key.private_bytes(serialization.Encoding.PEM,
                          serialization.PrivateFormat.PKCS8,
                          serialization.NoEncryption()).decode()
  path.write_text(
      json.dumps({
          'type': 'service_account',
          'project_id': 'keyed-project',
          'private_key_id': 'k1',
          'private_key': pem,
          'client_email': 'runner@keyed-project.iam.gserviceaccount.com',
          'client_id': '1',
          'token_uri': 'https://oauth2.googleapis.com/token'
      }))
  return str(path)


def test_an_emulator_takes_no_credentials_and_every_client_is_anonymous(
    monkeypatch):
  monkeypatch.setenv('STORAGE_EMULATOR_HOST', 'http://127.0.0.1:9')
  arguments, source = gcs_auth.find_token()
  assert arguments == {'token': 'anon'}
  assert '127.0.0.1:9' in source
  gcs_auth.wait()
  # Two threads' or two argument sets' file systems: each its own
  # instance, both anonymous without a search of their own.
  one = gcsfs.GCSFileSystem()
  two = gcsfs.GCSFileSystem(finalize_on_close=True)
  assert one is not two
  assert one.credentials.credentials is None
  assert two.credentials.credentials is None
  assert one.credentials.method == two.credentials.method == 'anon'


def test_a_key_file_is_found_once_and_handed_to_every_client(
    monkeypatch, tmp_path):
  key = _service_account_key(tmp_path / 'key.json')
  monkeypatch.setenv('GOOGLE_APPLICATION_CREDENTIALS', key)
  searches = []
  real = gcs_auth.find_token
  monkeypatch.setattr(gcs_auth, 'find_token',
                      lambda: searches.append(1) or real())
  gcs_auth.start()
  gcs_auth.start()
  assert gcs_auth.wait() >= 0.0
  assert gcs_auth.wait() == 0.0
  assert len(searches) == 1
  fs = gcs_auth.filesystem()
  found = fsspec.config.conf['gs']['token']
  assert fs.credentials.credentials is found
  assert found.service_account_email == (
      'runner@keyed-project.iam.gserviceaccount.com')
  assert found.scopes == list(gcs_auth._SCOPES)  # pylint: disable=protected-access
  assert fs.project == 'keyed-project'


def test_no_credentials_anywhere_is_anonymous_once(monkeypatch):
  monkeypatch.setenv('GCE_METADATA_HOST', '127.0.0.1:9')
  monkeypatch.setenv('GCE_METADATA_IP', '127.0.0.1:9')
  arguments, source = gcs_auth.find_token()
  assert arguments == {'token': 'anon'}
  assert source.startswith('none found, anonymous')


def test_gcsfs_login_cache_is_left_to_gcsfs(monkeypatch, tmp_path):
  monkeypatch.setenv('GCE_METADATA_HOST', '127.0.0.1:9')
  monkeypatch.setenv('GCE_METADATA_IP', '127.0.0.1:9')
  (tmp_path / 'home').mkdir()
  (tmp_path / 'home' / '.gcs_tokens').write_bytes(b'')
  arguments, source = gcs_auth.find_token()
  assert arguments == {}
  assert '.gcs_tokens' in source


def test_the_users_own_fsspec_token_wins(monkeypatch):
  monkeypatch.setenv('STORAGE_EMULATOR_HOST', 'http://127.0.0.1:9')
  fsspec.config.conf['gs'] = {'token': 'cloud'}
  gcs_auth.wait()
  assert fsspec.config.conf['gs'] == {'token': 'cloud'}
  assert fsspec.config.conf['gcs'] == {'token': 'anon'}


def test_a_slow_search_is_said_with_what_to_set(monkeypatch, caplog):
  monkeypatch.setattr(gcs_auth, 'SLOW_S', -1.0)
  monkeypatch.setenv('STORAGE_EMULATOR_HOST', 'http://127.0.0.1:9')
  with caplog.at_level(stdlib_logging.WARNING):
    gcs_auth.wait()
  said, = [
      r.getMessage()
      for r in caplog.records
      if 'finding Google credentials took' in r.getMessage()
  ]
  assert 'GOOGLE_APPLICATION_CREDENTIALS' in said
  assert 'the emulator at http://127.0.0.1:9' in said
