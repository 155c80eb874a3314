#!/usr/bin/env bash
# The peer benchmarks' tests (tests/peers) in their own environment, .venv-peers: the peers
# extra (Tunix) pins an older transformers than the oracle extra, so it cannot share .venv.
# A missing peer fails here instead of skipping (RLPOST_PEERS_REQUIRED=1).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
if [ ! -x .venv-peers/bin/python ]; then
  "$PY" -m venv .venv-peers
fi
STAMP=".venv-peers/.rlpost-installed-peers"
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
  .venv-peers/bin/python -m pip install -q --upgrade pip
  .venv-peers/bin/python -m pip install -q -e ".[peers]" "pytest>=8" "hypothesis>=6.100"
  touch "$STAMP"
fi
RLPOST_PEERS_REQUIRED=1 .venv-peers/bin/python -m pytest -p no:cacheprovider tests/peers "$@"
