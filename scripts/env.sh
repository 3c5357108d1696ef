# Sourced by scripts/run.sh and scripts/test.sh: a virtual environment in
# .venv with the project and its test tools installed, refreshed whenever
# pyproject.toml changes. PODRUN_PYTHON picks the interpreter (3.11+).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${PODRUN_VENV:-$repo/.venv}"
python="${PODRUN_PYTHON:-python3}"

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "podrun needs Python 3.11 or newer; $python is $("$python" -V 2>&1)." \
       "Set PODRUN_PYTHON to one." >&2
  exit 2
fi
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
stamp="$venv/.podrun-installed"
want="$(sha256sum "$repo/pyproject.toml" | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet -e "$repo[test]"
  echo "$want" > "$stamp"
fi
cd "$repo"
