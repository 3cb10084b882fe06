#!/usr/bin/env bash
# The whole recipe of Tandem's small trained models, deterministic given the seed: extract the King
# James Bible from Debian's packages and split it (corpus.py), train a byte-level BPE tokenizer on
# the training split (bpe.py), tokenize the corpus with Tandem's own tokenizer (tokenize_corpus.py),
# train the target (~6.8M parameters) and the draft (~0.9M) with PyTorch on the CPU (train.py), and
# export both as Hugging Face directories under models/.
#   tools/train_models/train_all.sh [TARGET_STEPS] [DRAFT_STEPS]
# Defaults (2000 and 1500 steps of 16 × 128 tokens) take about 110 minutes on 2 CPU cores (the
# target ~92, the draft ~17); a GPU trains them in minutes. The model cards record what was run, and
# training_trace.json the parameter digests every 100 steps that verify.sh checks a re-run against.
set -euo pipefail
cd "$(dirname "$0")/../.."
TARGET_STEPS="${1:-2000}"
DRAFT_STEPS="${2:-1500}"
SEED="${TANDEM_TRAIN_SEED:-0}"
BUILD_DIR="${TANDEM_BUILD_DIR:-build}"
WORK="${TANDEM_TRAIN_WORK:-.cache/train_models}"
PY=/usr/bin/python3  # Debian's interpreter: python3-torch and python3-regex are installed for it

need=()
for p in bible-kjv bible-kjv-text python3-torch python3-regex; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if ((${#need[@]})); then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
cmake -S . -B "$BUILD_DIR" -G Ninja >/dev/null
cmake --build "$BUILD_DIR" --target tandem

mkdir -p "$WORK"
$PY tools/train_models/corpus.py "$WORK/corpus"
$PY tools/train_models/bpe.py "$WORK/corpus/train.txt" "$WORK/tokenizer" --vocab-size 4096
$PY tools/train_models/tokenize_corpus.py "$BUILD_DIR/cli/tandem" "$WORK/corpus" "$WORK/tokenizer" "$WORK/ids"
$PY tools/train_models/train.py --ids "$WORK/ids" --tokenizer "$WORK/tokenizer" --out models/kjv-target \
  --size target --steps "$TARGET_STEPS" --batch 16 --seq-len 128 --lr 2e-3 --seed "$SEED" --threads "$(nproc)" \
  --device "${TANDEM_TRAIN_DEVICE:-cpu}"
$PY tools/train_models/train.py --ids "$WORK/ids" --tokenizer "$WORK/tokenizer" --out models/kjv-draft \
  --size draft --steps "$DRAFT_STEPS" --batch 16 --seq-len 128 --lr 3e-3 --seed "$SEED" --threads "$(nproc)" \
  --device "${TANDEM_TRAIN_DEVICE:-cpu}"
du -sh models/kjv-target models/kjv-draft
