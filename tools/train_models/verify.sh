#!/usr/bin/env bash
# Checks that the shipped models are what the recipe makes, without retraining them in full:
#   1. corpus extraction, tokenizer training and tokenization run again into a scratch directory and
#      must give the committed tokenizer.json byte for byte;
#   2. each model's training re-runs its first CHECK_STEPS steps (default 100) and the parameters must
#      equal, bit for bit, the digests its training recorded (models/*/training_trace.json, taken
#      every 100 steps on the same thread count);
#   3. with FULL=1, the draft (the cheaper one, ~17 min on 2 cores) is retrained in full and its
#      model.safetensors compared byte for byte with the shipped one.
# PyTorch's CPU kernels pick their vector code by processor, so bit equality is promised for the same
# thread count on the same kind of processor as the trace records (x86-64 with AVX-512 here); elsewhere
# the last bits may differ and step 2 says so.
#   tools/train_models/verify.sh [CHECK_STEPS]
set -euo pipefail
cd "$(dirname "$0")/../.."
CHECK_STEPS="${1:-100}"
BUILD_DIR="${TANDEM_BUILD_DIR:-build}"
WORK="$(mktemp -d /tmp/tandem-verify-XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
PY=/usr/bin/python3
cmake --build "$BUILD_DIR" --target tandem >/dev/null
echo "== data and tokenizer (in $WORK)"
$PY tools/train_models/corpus.py "$WORK/corpus"
$PY tools/train_models/bpe.py "$WORK/corpus/train.txt" "$WORK/tokenizer" --vocab-size 4096
$PY tools/train_models/tokenize_corpus.py "$BUILD_DIR/cli/tandem" "$WORK/corpus" "$WORK/tokenizer" "$WORK/ids"
for m in kjv-target kjv-draft; do
  cmp "$WORK/tokenizer/tokenizer.json" "models/$m/tokenizer.json"
done
echo "tokenizer.json identical to the shipped one"
# The traced run's own settings (steps, batch, sequence length, learning rate, seed, threads, device).
traced_args() {
  $PY - "$1" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
print(f"--size {t['size']} --steps {t['steps']} --batch {t['batch']} --seq-len {t['seq_len']} --lr {t['lr']} "
      f"--seed {t['seed']} --threads {t['threads']} --device {t['device']}")
PY
}
for m in kjv-target kjv-draft; do
  trace="models/$m/training_trace.json"
  args=$(traced_args "$trace")
  echo "== $m: the first $CHECK_STEPS steps against its trace ($args)"
  # shellcheck disable=SC2086
  $PY tools/train_models/train.py --ids "$WORK/ids" --tokenizer "$WORK/tokenizer" --out "$WORK/unused" $args \
    --check-trace "$trace" --check-steps "$CHECK_STEPS"
done
if [[ "${FULL:-0}" == 1 ]]; then
  args=$(traced_args models/kjv-draft/training_trace.json)
  echo "== kjv-draft: full retraining ($args)"
  # shellcheck disable=SC2086
  $PY tools/train_models/train.py --ids "$WORK/ids" --tokenizer "$WORK/tokenizer" --out "$WORK/kjv-draft" $args
  cmp "$WORK/kjv-draft/model.safetensors" models/kjv-draft/model.safetensors
  echo "kjv-draft/model.safetensors identical to the shipped one"
fi
echo "verify: the shipped models match the recipe"
