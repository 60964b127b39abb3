#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv. Safe to run repeatedly: it only
# reinstalls when pyproject.toml changed. torch is pinned to 2.13.0 first so that, where a local CPU
# wheel of that version is what the machine offers, pip does not pull the multi-GB CUDA build.
# pip runs quietly; a line on stderr at least every 30 s (MIRRORBERT_PROGRESS_INTERVAL) says what it is
# installing and for how long (scripts/heartbeat.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/heartbeat.sh
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  heartbeat_run "creating $VENV" "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.mirrorbert-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  start=$SECONDS
  heartbeat_run "upgrading pip in $VENV" \
    sh -c '"$1" -m pip install -q --upgrade pip >/dev/null 2>&1' sh "$VENV/bin/python" || true
  if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
    heartbeat_run "installing torch ${TORCH_VERSION:-2.13.0} into $VENV" \
      "$VENV/bin/python" -m pip install -q "torch==${TORCH_VERSION:-2.13.0}" \
      || heartbeat_run "installing torch into $VENV" "$VENV/bin/python" -m pip install -q torch
  fi
  heartbeat_run "installing mirrorbert and its test extras into $VENV" \
    "$VENV/bin/python" -m pip install -q -e ".[test]"
  echo "$(date +%H:%M:%S) setup: $VENV ready in $((SECONDS - start)) s" >&2
  echo "$want" > "$stamp"
fi
