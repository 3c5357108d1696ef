"""The lease as an object in a bucket: every change conditional on its
generation.

Cloud Storage gives each write of an object a new generation number and
takes a precondition on it with every write or delete
(`ifGenerationMatch`): 0 for "only if it does not exist", G for "only if it
is still the generation G I read or wrote". So no read-then-write window is
left for two jobs to both take a lease:

- `create`: only where there is none; of two creators exactly one wins;
- `read`: the holder and the generation it is, read as one (the content is
  fetched at the generation its metadata named);
- `replace` (a renewal): only while the lease is still the generation this
  job wrote last, so a renewal never overwrites a taker;
- `delete` (a takeover of a stale lease, a release): only the generation
  read or held; of two takers of one stale lease, the second finds it
  changed.

Calls go through gcsfs's authenticated requests to the JSON API, so
STORAGE_EMULATOR_HOST points them at an emulator as it does gcsfs.

Example:
  >>> generation = create('gs://runs/a/.podrun_lease.json', b'{...}')
  >>> generation = replace('gs://runs/a/.podrun_lease.json', b'{...}',
  ...                      generation)      # raises Changed if taken
"""

import json
from typing import Optional
from urllib.parse import quote

from runtime.common import gcs_auth


class Changed(Exception):
  """The object is not (or no longer) the generation the call was for."""


class Unreadable(Exception):
  """The object exists but cannot be read or parsed: no one can tell who
  holds it."""


def _fs():
  return gcs_auth.filesystem()


def _split(url: str) -> tuple[str, str]:
  bucket, _, key = url[len('gs://'):].partition('/')
  return bucket, key


def read(url: str, fs=None) -> Optional[tuple[dict, int]]:
  """(content as JSON, generation), or None when there is no object.

  Raises:
    Unreadable: for any answer but the object or its absence, or content
      that is not a JSON object.
  """
  fs = fs or _fs()
  bucket, key = _split(url)
  for _ in range(3):  # Replaced between the two requests: read again.
    try:
      meta = fs.call('GET', 'b/{}/o/{}', bucket, key, json_out=True)
      generation = int(meta['generation'])
      _, data = fs.call('GET',
                        'b/{}/o/{}',
                        bucket,
                        key,
                        alt='media',
                        generation=str(generation))
    except FileNotFoundError:
      try:
        fs.call('GET', 'b/{}/o/{}', bucket, key, json_out=True)
      except FileNotFoundError:
        return None
      continue
    except Exception as e:  # pylint: disable=broad-except
      raise Unreadable(f'{url}: {e}') from e
    try:
      content = json.loads(data)
    except ValueError as e:
      raise Unreadable(f'{url} is not JSON: {data[:80]!r}') from e
    if not isinstance(content, dict):
      raise Unreadable(f'{url} is not a JSON object: {data[:80]!r}')
    return content, generation
  raise Unreadable(f'{url} changed under three reads in a row')


_BOUNDARY = 'podrun_lease_boundary'


def _upload(url: str, data: bytes, if_generation: int, fs) -> int:
  """A multipart upload (metadata, then the content), as gcsfs's own: the
  form whose preconditions the emulator, too, enforces."""
  fs = fs or _fs()
  bucket, key = _split(url)
  body = (f'--{_BOUNDARY}\r\nContent-Type: application/json; charset=UTF-8'
          f'\r\n\r\n{json.dumps({"name": key})}\r\n--{_BOUNDARY}\r\n'
          'Content-Type: application/json\r\n\r\n').encode() + data + (
              f'\r\n--{_BOUNDARY}--').encode()
  try:
    answer = fs.call(
        'POST',
        f'{fs._location}/upload/storage/v1/b/{quote(bucket)}/o',  # pylint: disable=protected-access
        uploadType='multipart',
        ifGenerationMatch=str(if_generation),
        headers={'Content-Type': f'multipart/related; boundary={_BOUNDARY}'},
        data=body,
        json_out=True)
  except FileExistsError as e:  # 412, Precondition Failed.
    raise Changed(url) from e
  fs.invalidate_cache()
  return int(answer['generation'])


def create(url: str, data: bytes, fs=None) -> int:
  """Writes the object if none exists; returns its generation.

  Raises:
    Changed: one exists.
  """
  return _upload(url, data, 0, fs)


def replace(url: str, data: bytes, generation: int, fs=None) -> int:
  """Writes the object over `generation`; returns the new generation.

  Raises:
    Changed: the object is another generation, or gone.
  """
  return _upload(url, data, generation, fs)


def delete(url: str, generation: int, fs=None) -> bool:
  """Deletes the object if it is still `generation`; False when it is
  another one (someone wrote it since). True when it is gone already."""
  fs = fs or _fs()
  bucket, key = _split(url)
  try:
    fs.call('DELETE',
            'b/{}/o/{}',
            bucket,
            key,
            ifGenerationMatch=str(generation))
  except FileNotFoundError:
    return True
  except FileExistsError:  # 412.
    return False
  finally:
    fs.invalidate_cache()
  return True
