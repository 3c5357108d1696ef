# Sourced by scripts/run.sh and scripts/test.sh: a virtual environment with
# the project installed (and, for the tests, their tools), refreshed whenever
# pyproject.toml (or the constraints file) changes or an extra is missing.
#   PODRUN_PYTHON       the interpreter (3.11 to 3.13); default python3
#   PODRUN_VENV         where the environment lives; default .venv
#   PODRUN_CONSTRAINTS  a pip constraints file, e.g. scripts/oldest.txt for
#                       the oldest supported versions
#   PODRUN_EXTRAS       the extras to install, comma-separated; run.sh's
#                       default none, test.sh's test
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${PODRUN_VENV:-$repo/.venv}"
python="${PODRUN_PYTHON:-python3}"
extras="${PODRUN_EXTRAS-test}"
constraints="${PODRUN_CONSTRAINTS:-}"

if ! "$python" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))' 2>/dev/null; then
  echo "podrun needs Python 3.11 to 3.13; $python is" \
       "$("$python" -V 2>&1 || echo 'not found')." \
       "Set PODRUN_PYTHON to one (scripts/find_python.sh 3.13 finds one)." >&2
  exit 2
fi
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
# The stamp: the hash of what was installed from, then its extras. A run
# after the tests finds the test extra there and installs nothing.
stamp="$venv/.podrun-installed"
hash="$(cat "$repo/pyproject.toml" ${constraints:+"$constraints"} | sha256sum | cut -d' ' -f1)"
read -r had_hash had_extras 2>/dev/null < "$stamp" || true
install=0
if [ "${had_hash:-}" != "$hash" ]; then
  install=1
  had_extras=""
fi
for extra in ${extras//,/ }; do
  case ",${had_extras:-}," in *",$extra,"*) ;; *) install=1 ;; esac
done
if [ "$install" = 1 ]; then
  all="$(echo "${had_extras:-},$extras" | tr ',' '\n' | sed '/^$/d' | sort -u | paste -sd, -)"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet ${constraints:+-c "$constraints"} -e "$repo${all:+[$all]}"
  echo "$hash $all" > "$stamp"
fi
cd "$repo"
