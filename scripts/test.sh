#!/usr/bin/env bash
# Runs the test suite on 8 emulated CPU devices (tests/conftest.py sets them).
#   scripts/test.sh                 # everything
#   scripts/test.sh tests/test_gang.py -k watchdog
#   scripts/test.sh -m "not processes"     # the quick tier, about 45 s
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
exec "$venv/bin/python" -m pytest -q "$@"
