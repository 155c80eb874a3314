# Shared by quickstart.sh and test.sh: create or reuse .venv and install rlpost with the given extras.
# Usage: source scripts/_venv.sh EXTRAS   (e.g. "hf" or "test,hf,oracle")
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
EXTRAS="$1"
STAMP=".venv/.rlpost-installed-$(echo "$EXTRAS" | tr ',' '-')"
# Reinstall only when pyproject.toml or the lock file changed since the last install with these
# extras. requirements.lock pins every package to the versions CI runs (pip constraints: only the
# packages these extras need are installed).
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ] || [ requirements.lock -nt "$STAMP" ]; then
  python -m pip install -q --upgrade pip
  python -m pip install -q -e ".[${EXTRAS}]" -c requirements.lock
  touch "$STAMP"
fi
