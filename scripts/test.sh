#!/usr/bin/env bash
# The test command: builds .venv if needed, then runs the default suite (tiny local models, no network;
# tests marked `slow` are left out: `./scripts/test.sh -m slow` runs those, `-m ""` everything; CI runs both).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# One thread (tests/conftest.py holds torch there too): the suite takes the same time on 2 cores or 64, and
# OpenMP's spin-waiting on a busy machine (4x slower at default threads on a shared 2-core box) is gone.
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
export MIRRORBERT_DATA="${MIRRORBERT_DATA:-$(cd .. && pwd)/shared/data}"
# The OpenAI-compatible server parity test (tests/integrations/test_clients.py) runs Infinity from its own
# environment, which scripts/setup_infinity.sh builds (CI does, .ci/run): once that is complete, the test uses it.
if [ -z "${MIRRORBERT_INFINITY_EMB:-}" ] && [ -f .venv-infinity/.mirrorbert-infinity-installed ]; then
  export MIRRORBERT_INFINITY_EMB="$PWD/.venv-infinity/bin/infinity_emb"
fi
exec .venv/bin/python -m pytest -q -m "not slow" "$@"
