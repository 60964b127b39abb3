#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv. Safe to run repeatedly: it only
# reinstalls when pyproject.toml changed. torch is pinned to 2.13.0 first so that, where a local CPU
# wheel of that version is what the machine offers, pip does not pull the multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.mirrorbert-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
    "$VENV/bin/python" -m pip install -q "torch==${TORCH_VERSION:-2.13.0}" || "$VENV/bin/python" -m pip install -q torch
  fi
  "$VENV/bin/python" -m pip install -q -e ".[test]"
  echo "$want" > "$stamp"
fi
