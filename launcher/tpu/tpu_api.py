"""The Cloud TPU API's v2 REST endpoint for one node, through google-auth.

What the preflight and the relaunch decision read of a pod: its state,
health, accelerator type, worker endpoints and symptoms, one GET of
`https://tpu.googleapis.com/v2/projects/P/locations/Z/nodes/N` each time
they ask. Every request has a timeout, and a 429 or 5xx answer (or a
connection that fails) is tried again with a growing wait, up to
`attempts` times. The credentials are the Application Default Credentials
(`google.auth.default`), which also name the project when none is given.
`$PODRUN_TPU_API_ROOT` (or `api_root`) points it elsewhere: the tests'
fake TPU API on 127.0.0.1 serves the same requests.

This replaces cloud-tpu-client (last released in 2020, API v1 through
oauth2client), whose pins held protobuf below 4.

Example:
  >>> node = Node('my-pod', 'us-central2-b', project=None)
  >>> node.state(), node.health(), node.accelerator_type()
  ('READY', 'HEALTHY', 'v4-32')
"""

import os
import time
from typing import Any, Callable, Optional

API_ROOT = 'https://tpu.googleapis.com'
# Where the tests' fake TPU API is, when set.
API_ROOT_ENV = 'PODRUN_TPU_API_ROOT'
_SCOPES = ('https://www.googleapis.com/auth/cloud-platform',)
# Symptoms after which the same pod would fail the same way again.
_UNRECOVERABLE_SYMPTOMS = ('OUT_OF_MEMORY', 'HBM_OUT_OF_MEMORY')


class TpuApiError(RuntimeError):
  """The API answered with an error, or not at all, after every try."""


def _session(api_root: str):
  """An authorised requests session, and the credentials' project."""
  import google.auth  # pylint: disable=g-import-not-at-top
  from google.auth import credentials as credentials_lib  # pylint: disable=g-import-not-at-top
  from google.auth.transport import requests as auth_requests  # pylint: disable=g-import-not-at-top
  if api_root != API_ROOT:
    # A stand-in of the API (the tests'): no credentials to find.
    return (auth_requests.AuthorizedSession(
        credentials_lib.AnonymousCredentials()), None)
  credentials, project = google.auth.default(scopes=_SCOPES)
  return auth_requests.AuthorizedSession(credentials), project


class Node:
  """One TPU node (a pod slice) as the Cloud TPU API v2 describes it.

  Args:
    tpu: the node's name.
    zone: its zone.
    project: its project; None: the credentials'.
    api_root: the API's root URL (default $PODRUN_TPU_API_ROOT, else
      API_ROOT).
    timeout_s: each request's.
    attempts: tries of a request that gets 429, 5xx or no answer.
    sleep: waits between tries (the tests pass their own).
  """

  def __init__(self,
               tpu: str,
               zone: str,
               project: Optional[str],
               api_root: Optional[str] = None,
               timeout_s: float = 30.0,
               attempts: int = 5,
               sleep: Callable[[float], None] = time.sleep):
    self.api_root = (api_root or os.environ.get(API_ROOT_ENV) or
                     API_ROOT).rstrip('/')
    self._session, found = _session(self.api_root)
    project = project or found
    if not project:
      raise TpuApiError(
          f'no project for TPU {tpu}: the Application Default Credentials '
          'name none. Give --project.')
    self.path = f'projects/{project}/locations/{zone}/nodes/{tpu}'
    self._tpu, self._timeout_s, self._attempts = tpu, timeout_s, attempts
    self._sleep = sleep

  def _get(self) -> dict[str, Any]:
    import requests  # pylint: disable=g-import-not-at-top
    url = f'{self.api_root}/v2/{self.path}'
    last = ''
    for attempt in range(self._attempts):
      if attempt:
        self._sleep(min(2.0**attempt, 30.0))
      try:
        answer = self._session.get(url, timeout=self._timeout_s)
      except requests.RequestException as e:
        last = f'{type(e).__name__}: {e}'
        continue
      if answer.status_code == 429 or answer.status_code >= 500:
        last = f'HTTP {answer.status_code}: {answer.text[:200]}'
        continue
      if answer.status_code != 200:
        raise TpuApiError(f'GET {url}: HTTP {answer.status_code}: '
                          f'{answer.text[:500]}')
      return answer.json()
    raise TpuApiError(f'GET {url}: no answer after {self._attempts} tries; '
                      f'the last: {last}')

  def name(self) -> str:
    return self._tpu

  def state(self) -> Optional[str]:
    return self._get().get('state')

  def health(self) -> Optional[str]:
    return self._get().get('health')

  def accelerator_type(self) -> Optional[str]:
    return self._get().get('acceleratorType')

  def network_endpoints(self) -> list[dict[str, Any]]:
    return list(self._get().get('networkEndpoints') or [])

  def recoverable(self) -> bool:
    """Whether training on this node can go on: not PREEMPTED or
    TERMINATED, and no out-of-memory symptom (the same job would run out
    again)."""
    node = self._get()
    if node.get('state') in ('PREEMPTED', 'TERMINATED'):
      return False
    return not any(
        s.get('symptomType') in _UNRECOVERABLE_SYMPTOMS
        for s in node.get('symptoms') or [])
