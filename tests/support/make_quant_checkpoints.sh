#!/bin/sh
# The quantized checkpoints the format tests read (tests/unit/checkpoint_formats_test.cc): a random
# model of each tiny preset, packed by the test-side packer (quant_packer.mjs) into GPTQ, AWQ and
# compressed-tensors variants, each with its F32 reference; every variant on tiny-llama, one of
# each format on the other presets, and the hostile variants on tiny-llama.
#   make_quant_checkpoints.sh TANDEM OUT_DIR
set -eu
tandem=$1
out=$2
here=$(dirname "$0")
rm -rf "$out"
mkdir -p "$out"
make() {
  preset=$1
  shift
  "$tandem" make-model --preset "$preset" --out "$out/$preset/src" --seed 7 --dtype bf16 > /dev/null
  node "$here/quant_packer.mjs" "$out/$preset/src" "$out/$preset" "$@"
}
make tiny-llama
make tiny-mistral gptq-4-g64-asym-act awq-4-g128 ct-8-ch-asym-packedzp
make tiny-qwen2 gptq-8-ch-asym-v2 awq-4-g64 ct-4-g64-asym-int8zp-act
make tiny-qwen3 gptq-4-g32-sym awq-4-g64 ct-8-g64-sym-act
touch "$out/done"
