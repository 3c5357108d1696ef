#!/usr/bin/env bash
# Prints the path of a Python interpreter of version X.Y, or says where it
# looked and exits 2.
#   scripts/find_python.sh 3.13
# Looks for pythonX.Y on PATH, then under pyenv (`pyenv prefix`, or
# ${PYENV_ROOT:-~/.pyenv}/versions/X.Y.*).
set -euo pipefail
want="${1:?usage: scripts/find_python.sh X.Y}"
is_version() {
  "$1" -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$want'.split('.'))))" 2>/dev/null
}
candidates=()
command -v "python$want" >/dev/null 2>&1 && candidates+=("$(command -v "python$want")")
if command -v pyenv >/dev/null 2>&1; then
  for v in $(pyenv versions --bare 2>/dev/null | grep -E "^$want(\.[0-9]+)?$" | sort -rV); do
    candidates+=("$(pyenv prefix "$v")/bin/python$want")
  done
fi
for d in $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}/versions/$want".* 2>/dev/null | sort -rV); do
  candidates+=("$d/bin/python$want")
done
for c in "${candidates[@]}"; do
  if [ -x "$c" ] && is_version "$c"; then
    echo "$c"
    exit 0
  fi
done
echo "find_python: no Python $want found: not python$want on PATH, not under" \
     "pyenv (${PYENV_ROOT:-$HOME/.pyenv}/versions). Install it, e.g. \`pyenv" \
     "install $want\`, or set PODRUN_PYTHON." >&2
exit 2
