#!/usr/bin/env bash
# The Infinity server's own environment (.venv-infinity), for the OpenAI-compatible server parity test
# (tests/integrations/test_clients.py; docs/guide/serving.md). Infinity pins numpy<2 and sentence-transformers<4
# (hence transformers<5 and huggingface_hub<1), which .venv has left behind, so it cannot live there.
# torch comes first, as in .venv: `pip install torch==TORCH_VERSION` (the local CPU wheel where pip's find-links
# offer one), then held there by a constraint while Infinity and what it needs install, so no other torch (a
# multi-GB CUDA build) is ever downloaded; an install that pulled CUDA packages anyway fails here.
# Rebuilt from nothing only when this script or TORCH_VERSION changed (CI caches the folder like .venv-floors);
# prints the path of its infinity_emb last. scripts/test.sh points the test at it when it is complete.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/heartbeat.sh  # a line on stderr at least every 30 s while pip installs quietly
PYTHON="${PYTHON:-python3}"
VENV="${INFINITY_VENV:-.venv-infinity}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
INFINITY_VERSION="0.0.78"
stamp="$VENV/.mirrorbert-infinity-installed"
want="$(sha256sum scripts/setup_infinity.sh | cut -d' ' -f1) $TORCH_VERSION"
no_cuda() {
  if "$VENV/bin/python" -m pip list --format=freeze 2>/dev/null | grep -qi '^nvidia-'; then
    echo "setup_infinity: CUDA packages were installed into $VENV (no local CPU wheel of torch $TORCH_VERSION?);" \
         "torch must be the CPU build" >&2
    exit 1
  fi
}
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  start=$SECONDS
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)  # its output to stderr: stdout is the path
  heartbeat_run "installing torch $TORCH_VERSION into $VENV" "${pip[@]}" "torch==$TORCH_VERSION" >&2
  no_cuda
  torch_got="$("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("torch"))')"
  # the versions this recipe was tested with; Infinity's own ranges leave the rest free to drift
  cat > "$VENV/constraints.txt" <<EOF
torch==$torch_got
sentence-transformers==3.4.1
transformers==4.57.6
huggingface-hub==0.36.2
tokenizers==0.22.2
numpy==1.26.4
fastapi==0.165.0
starlette==1.10.0
pydantic==2.14.4
pydantic-core==2.50.5
scipy==1.17.1
scikit-learn==1.9.1
safetensors==0.8.0
uvicorn==0.32.1
EOF
  heartbeat_run "installing Infinity $INFINITY_VERSION into $VENV" \
    "${pip[@]}" -c "$VENV/constraints.txt" "infinity-emb[server,torch]==$INFINITY_VERSION" >&2
  no_cuda
  "$VENV/bin/infinity_emb" v2 --help >/dev/null  # imports the server's whole stack (or fails here)
  echo "infinity: installed in $((SECONDS - start)) s (torch $torch_got)" >&2
  echo "$want" > "$stamp"
fi
echo "$(cd "$VENV" && pwd)/bin/infinity_emb"
