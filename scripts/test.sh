#!/usr/bin/env bash
# Runs the test suite on 8 emulated CPU devices (tests/conftest.py sets them),
# in 2 pytest-xdist workers, one module to a worker at a time (module-scoped
# servers such as SLURM and fake-gcs-server start once), and prints the fifteen
# slowest tests at the end; a test whose call takes over tests/budget.py's
# MOST_S fails.
#   scripts/test.sh                 # everything
#   scripts/test.sh tests/test_gang.py -k watchdog
#   scripts/test.sh -m "not processes"     # the quick tier
#   PODRUN_TEST_WORKERS=0 scripts/test.sh  # in this process, no workers
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
workers="${PODRUN_TEST_WORKERS:-2}"
parallel=()
[ "$workers" != 0 ] && parallel=(-n "$workers" --dist loadfile)
exec "$venv/bin/python" -m pytest -q --durations=15 "${parallel[@]}" "$@"
