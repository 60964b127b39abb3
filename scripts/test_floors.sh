#!/usr/bin/env bash
# The floors run: builds .venv-floors with every direct dependency at the lowest version pyproject.toml allows
# (uv's --resolution lowest-direct; the packages those need resolve as usual), torch held at TORCH_VERSION
# (default 2.13.0: the local CPU wheel where pip's find-links offer one), prints the versions it got, then runs
# the default suite there (arguments go to pytest, as for scripts/test.sh). CI runs it beside the
# latest-versions run (scripts/test.sh). Rebuilds only when pyproject.toml or this script changed.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/heartbeat.sh  # a line at least every 30 s while uv and pip install quietly
PYTHON="${PYTHON:-python3}"
VENV="${FLOORS_VENV:-.venv-floors}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
stamp="$VENV/.mirrorbert-floors-installed"
want="$(cat pyproject.toml scripts/test_floors.sh | sha256sum | cut -d' ' -f1) $TORCH_VERSION"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  start=$SECONDS
  # a fresh venv each time: uv keeps an installed version that satisfies a requirement, even above its floor
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  # uv reads no pip configuration: hand it pip's find-links (where a local torch wheel lies) explicitly.
  heartbeat_run "installing uv into $VENV" sh -c '"$1" -m pip install -q "uv>=0.5" 2>/dev/null' sh "$VENV/bin/python"
  uv=("$VENV/bin/uv" pip install -q --python "$VENV/bin/python")
  links="${PIP_FIND_LINKS:-} $("$VENV/bin/python" -m pip config get global.find-links 2>/dev/null || true)"
  for link in $links; do
    uv+=(--find-links "$link")
  done
  # torch first, at its highest build of TORCH_VERSION (a +cpu local wheel sorts above the plain one) ...
  heartbeat_run "installing torch $TORCH_VERSION into $VENV" "${uv[@]}" "torch==$TORCH_VERSION"
  torch_got="$("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("torch"))')"
  # ... then held there exactly while everything else goes to its floor.
  echo "torch==$torch_got" > "$VENV/torch-constraint.txt"
  heartbeat_run "installing the floors into $VENV" \
    "${uv[@]}" --resolution lowest-direct -c "$VENV/torch-constraint.txt" -e ".[test]"
  echo "floors: installed in $((SECONDS - start)) s"
  echo "$want" > "$stamp"
fi
"$VENV/bin/python" - <<'EOF'
from importlib.metadata import version
names = ["torch", "transformers", "tokenizers", "sentence-transformers", "numpy", "scipy", "safetensors",
         "datasets", "pyarrow", "accelerate", "scikit-learn"]
print("floors:", ", ".join(f"{n} {version(n)}" for n in names))
EOF
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1  # one thread, as scripts/test.sh (tests/conftest.py)
export MIRRORBERT_DATA="${MIRRORBERT_DATA:-$(cd .. && pwd)/shared/data}"
# pytest's exit status is this script's: 5 (no test collected) fails CI like any other non-zero one.
exec "$VENV/bin/python" -m pytest -q -m "not slow" "$@"
