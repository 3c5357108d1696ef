"""A stand-in of the Cloud TPU API's v2 REST endpoint on 127.0.0.1: what
launcher/tpu/tpu_api.py reads (GET .../v2/projects/P/locations/Z/nodes/N).

Each GET of a node answers with the next of the answers queued for it (the
last repeats): a node's JSON, or an HTTP status to fail with (429, 503...).

Example:
  >>> with FakeTpuApi() as api:
  ...   api.queue('proj', 'us-central2-b', 'my-pod', 503, {'state': 'READY'})
  ...   Node('my-pod', 'us-central2-b', 'proj', api_root=api.root).state()
  'READY'
"""

import http.server
import json
import threading
from typing import Any, Union


class FakeTpuApi:
  """The server; a context manager that starts and stops it."""

  def __init__(self):
    self._answers: dict[str, list[Union[int, dict[str, Any]]]] = {}
    self.requests: list[str] = []
    api = self

    class Handler(http.server.BaseHTTPRequestHandler):

      def do_GET(self):  # pylint: disable=invalid-name
        api.requests.append(self.path)
        answers = api._answers.get(self.path)
        if not answers:
          self._send(404, {'error': {'code': 404, 'message': 'not found'}})
          return
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, int):
          self._send(answer, {'error': {'code': answer}})
        else:
          self._send(200, answer)

      def _send(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(data)))
        self.end_headers()
        self.wfile.write(data)

      def log_message(self, *args):
        pass

    self._server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    self.root = f'http://127.0.0.1:{self._server.server_address[1]}'
    self._thread = threading.Thread(target=self._server.serve_forever,
                                    daemon=True)

  def queue(self, project: str, zone: str, tpu: str, *answers:
            Union[int, dict[str, Any]]) -> None:
    """The answers to the next GETs of that node, in order."""
    path = f'/v2/projects/{project}/locations/{zone}/nodes/{tpu}'
    self._answers.setdefault(path, []).extend(answers)

  def __enter__(self) -> 'FakeTpuApi':
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._server.shutdown()
    self._server.server_close()
