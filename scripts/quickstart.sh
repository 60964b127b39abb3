#!/usr/bin/env bash
# The main job: Mirror-BERT sentence-level tuning of $MODEL (default bert-base-uncased, from the hub) on the
# paper's 10k STS-B training sentences with the paper's sentence preset, and STS-B dev Spearman before and
# after. Creates .venv on first use. Nothing existing is overwritten: each run writes a new folder in runs/.
#   MODEL=path/to/mlm ./scripts/quickstart.sh           # a local model (needed where the hub is unreachable)
#   MIRRORBERT_DATA=/data ./scripts/quickstart.sh       # data directory (default ../shared/data)
#   TRAIN_ARGS="--steps 20 --precision bf16" ./scripts/quickstart.sh   # extra `mirrorbert train` options
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="${MODEL:-bert-base-uncased}"
DATA_DIR="${MIRRORBERT_DATA:-$(cd .. && pwd)/shared/data}"
OUT="${OUT:-runs/mirror-bert-sentence-$(date +%Y%m%d-%H%M%S)}"
MB=.venv/bin/mirrorbert
export TOKENIZERS_PARALLELISM=false

TRAIN_DATA="$DATA_DIR/corpora/stsbenchmark_train_10k_sents_random_sampled.txt"

hint() {
  echo "quickstart: could not load --model $MODEL. Where the Hugging Face hub is unreachable, pass a local" >&2
  echo "  masked-LM folder instead, e.g.: MODEL=path/to/mlm ./scripts/quickstart.sh" >&2
  echo "  (one can be built offline with: mirrorbert pretrain-mlm --help)" >&2
  exit 2
}

# The data first, with its own message: a missing data directory is not the model's fault.
if [ ! -d "$DATA_DIR" ]; then
  echo "quickstart: data directory $DATA_DIR not found; set MIRRORBERT_DATA=/path/to/data" >&2
  exit 2
fi
if [ ! -f "$TRAIN_DATA" ]; then
  echo "quickstart: $TRAIN_DATA not found: $DATA_DIR is not the shared data directory" \
       "(see its README.md); set MIRRORBERT_DATA=/path/to/data" >&2
  exit 2
fi

bash scripts/setup_env.sh
mkdir -p "$(dirname "$OUT")"
echo "== STS-B dev before Mirror-BERT ($MODEL, mean pooling)"
ERR="$OUT.before.err"
if ! $MB eval --model "$MODEL" --pooling mean --tasks sts --sts-sets stsb --data-dir "$DATA_DIR" \
    --output "$OUT.before.json" 2>"$ERR"; then
  cat "$ERR" >&2
  # only a failure to load the model gets the model hint; anything else speaks for itself above
  if grep -q "error: --model" "$ERR"; then hint; fi
  echo "quickstart: the evaluation before training failed (see the error above)" >&2
  exit 2
fi
cat "$ERR" >&2
rm -f "$ERR"
echo "== Mirror-BERT training (--preset sentence)"
# shellcheck disable=SC2086
$MB train --model "$MODEL" --data "$TRAIN_DATA" \
  --preset sentence --output "$OUT" ${TRAIN_ARGS:-}
echo "== STS-B dev after"
$MB eval --model "$OUT" --tasks sts --sts-sets stsb --data-dir "$DATA_DIR" --output "$OUT.after.json"
.venv/bin/python - "$OUT.before.json" "$OUT.after.json" <<'PY'
import json, sys
def dev(path):
    return json.load(open(path))["tasks"]["sts"]["metrics"]["stsb_dev"]
before, after = dev(sys.argv[1]), dev(sys.argv[2])
print(f"STS-B dev Spearman x100: before {100 * before:.2f}  after {100 * after:.2f}")
PY
echo "model: $OUT"
