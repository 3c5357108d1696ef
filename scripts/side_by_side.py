"""Medians of alternated rounds and their ratios to a baseline, for the
benchmarks that compare places side by side in one run.

Example:
  >>> rounds = {'local': [{'save_s': 0.1}], 'bucket': [{'save_s': 0.3}]}
  >>> report({'rounds': 1}, rounds, out='')['bucket_over_local']
  {'save_s': 3.0}
"""

import json
import pathlib
import statistics
from typing import Optional


def report(results: dict,
           rounds: dict[str, list[dict]],
           out: str,
           baseline: Optional[str] = 'local') -> dict:
  """Adds each place's medians and each other place's ratios to
  `baseline` (None: no ratios) to `results`, prints them as JSON and
  writes them to `out` (unless '')."""
  for where, found in rounds.items():
    results[where] = {
        k: statistics.median(r[k] for r in found) for k in found[0]
    }
  for where in rounds if baseline else ():
    if where != baseline:
      results[f'{where}_over_{baseline}'] = {
          k: results[where][k] / results[baseline][k] for k in results[baseline]
      }
  text = json.dumps(results, indent=2)
  print(text)
  if out:
    pathlib.Path(out).write_text(text + '\n')
  return results
