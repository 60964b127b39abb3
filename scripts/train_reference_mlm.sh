#!/usr/bin/env bash
# Train the offline reference MLM: a bert-mini (L4/H256) with the bert-base-uncased WordPiece vocabulary,
# from scratch, on the reference corpus of scripts/build_reference_corpus.py.
#
# Sized for about two hours on our shared 2-core CPU (fp32, ~1,700 tokens/s on one thread: 10M tokens);
# minutes on a GPU.
# Resumable: run the same command again after an interruption (Ctrl-C writes a checkpoint; a checkpoint
# is also written every SAVE_EVERY steps) and it continues exactly where it stopped.
#
#   scripts/train_reference_mlm.sh                       # corpus (if absent) + pre-training
#   EVALUATE=1 scripts/train_reference_mlm.sh            # + STS-B / SICK-R before and after Mirror-BERT
#   scripts/train_reference_mlm.sh --stop-after-steps 50 # extra options go to `mirrorbert pretrain-mlm`
#
# Settings (environment variables):
#   MIRRORBERT_DATA  shared data folder            (default: <repo>/../shared/data)
#   WORK             where everything is written   (default: <repo>/runs/reference-mlm)
#   MAX_TOKENS       training budget in tokens     (default: 10000000)
#   BATCH_SIZE       sequences of 128 tokens/step  (default: 64)
#   LR               peak learning rate            (default: 1e-3, 6% warmup, linear decay)
#   DEVICE           auto | cpu | cuda             (default: auto)
#   PRECISION        fp32 | bf16 | fp16            (default: bf16 on CUDA, fp32 otherwise: CPUs without
#                                                   native bf16 (AVX2 only) run bf16 autocast ~10x slower)
#   THREADS          torch CPU threads             (default: torch's; use 1 on a CPU shared with others)
#   SAVE_EVERY       checkpoint every N steps      (default: 100)
#   EVALUATE         1: evaluate and Mirror-tune the result (default: 0)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DATA="${MIRRORBERT_DATA:-$ROOT/../shared/data}"
WORK="${WORK:-$ROOT/runs/reference-mlm}"
MAX_TOKENS="${MAX_TOKENS:-10000000}"
BATCH_SIZE="${BATCH_SIZE:-64}"
LR="${LR:-1e-3}"
DEVICE="${DEVICE:-auto}"
SAVE_EVERY="${SAVE_EVERY:-100}"
EVALUATE="${EVALUATE:-0}"
MIRRORBERT="${MIRRORBERT:-mirrorbert}"
PYTHON="${PYTHON:-python}"

if [[ -z "${PRECISION:-}" ]]; then
    if "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null \
        && [[ "$DEVICE" != "cpu" ]]; then
        PRECISION=bf16
    else
        PRECISION=fp32
    fi
fi
TOKENIZER="$DATA/tokenizers/bert-base-uncased"
CORPUS="$WORK/corpus.txt"
OUTPUT="$WORK/bert-mini-ref"
CHECKPOINTS="$WORK/bert-mini-ref.checkpoints"

if [[ ! -d "$TOKENIZER" ]]; then
    echo "error: tokenizer not found at $TOKENIZER (set MIRRORBERT_DATA to the shared data folder)" >&2
    exit 2
fi
mkdir -p "$WORK"

# 1. the corpus (deterministic; rebuilt only when absent)
if [[ ! -s "$CORPUS" ]]; then
    "$PYTHON" "$ROOT/scripts/build_reference_corpus.py" --data-dir "$DATA" --output "$CORPUS" --tokenizer "$TOKENIZER"
fi

# 2. pre-training, resuming from the newest checkpoint when there is one
if [[ -f "$OUTPUT/config.json" ]]; then
    echo "reference MLM already trained: $OUTPUT"
else
    RESUME=()
    if compgen -G "$CHECKPOINTS/step-*/checkpoint.json" > /dev/null; then
        RESUME=(--resume "$CHECKPOINTS")
        echo "resuming from the newest checkpoint in $CHECKPOINTS"
    fi
    THREAD_ARGS=()
    if [[ -n "${THREADS:-}" ]]; then THREAD_ARGS=(--threads "$THREADS"); fi
    set +e
    "$MIRRORBERT" pretrain-mlm \
        --corpus "$CORPUS" \
        --architecture bert-mini \
        --tokenizer "$TOKENIZER" \
        --output "$OUTPUT" \
        --seq-length 128 \
        --batch-size "$BATCH_SIZE" \
        --max-tokens "$MAX_TOKENS" \
        --lr "$LR" \
        --eval-fraction 0.01 --eval-every 200 --eval-sequences 256 \
        --save-every "$SAVE_EVERY" --checkpoint-dir "$CHECKPOINTS" \
        --cache-dir "$WORK/cache" \
        --device "$DEVICE" --precision "$PRECISION" \
        --seed 42 --log-every 20 \
        "${THREAD_ARGS[@]}" "${RESUME[@]}" "$@"
    status=$?
    set -e
    if [[ $status -ne 0 ]]; then
        echo "pre-training stopped (exit $status); run this script again to resume" >&2
        exit $status
    fi
    if [[ ! -f "$OUTPUT/config.json" ]]; then
        echo "pre-training paused before the end of the budget; run this script again to continue"
        exit 0
    fi
fi

# 3. optional: sentence-level Mirror-BERT on top, STS-B and SICK-R before and after
if [[ "$EVALUATE" == "1" ]]; then
    MIRROR="$WORK/bert-mini-ref-mirror-sentence"
    "$MIRRORBERT" eval --model "$OUTPUT" --tasks sts --sts-sets stsb,sickr --data-dir "$DATA" \
        --device "$DEVICE" --output "$WORK/eval-mlm.json"
    if [[ ! -f "$MIRROR/config.json" ]]; then
        "$MIRRORBERT" train --preset sentence --model "$OUTPUT" \
            --data "$DATA/corpora/stsbenchmark_train_10k_sents_random_sampled.txt" \
            --output "$MIRROR" --device "$DEVICE"
    fi
    "$MIRRORBERT" eval --model "$MIRROR" --tasks sts --sts-sets stsb,sickr --data-dir "$DATA" \
        --device "$DEVICE" --output "$WORK/eval-mirror.json"
fi
