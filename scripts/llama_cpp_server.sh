#!/usr/bin/env bash
# Builds llama.cpp's llama-server for sm_90 (H100/H200) here, where the CUDA toolkit compiles but no GPU
# runs, and packs it with the shared libraries it loads beyond the C library and CUDA's own into
# .gpu_bundle/llama-server.tar.xz, with llama.cpp's convert_hf_to_gguf.py, its gguf-py and the
# tokenizers: gpu_check.sh's llama stage then skips its six-minute build on the device, and
# .gpu_bundle/llama.cpp-src.tar.xz need not be carried. The source is .gpu_bundle/llama.cpp-src.tar.xz (scripts/llama_cpp_source.sh). On 2 cores the
# build takes about an hour; it runs at the lowest priority, reusing BUILD_DIR when run again.
# llama.cpp's code is only built and run, never part of Tandem.
#   scripts/llama_cpp_server.sh [BUILD_DIR]      (default /tmp/tandem-llama-build)
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=.gpu_bundle/llama.cpp-src.tar.xz
[[ -f $SRC ]] || { echo "llama_cpp_server: $SRC is missing: run scripts/llama_cpp_source.sh" >&2; exit 1; }
B="${1:-/tmp/tandem-llama-build}"
mkdir -p "$B"
[[ -d $B/src/llama.cpp ]] || { mkdir -p "$B/src" && tar -C "$B/src" -xJf "$SRC"; }
# Portable host code (no -march=native of this machine), one static binary, the CUDA kernels for sm_90.
nice -n 19 cmake -S "$B/src/llama.cpp" -B "$B/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DGGML_NATIVE=OFF \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF > "$B/configure.log"
echo "llama_cpp_server: building in $B/build (progress: $B/build.log)"
nice -n 19 cmake --build "$B/build" -j"$(nproc)" --target llama-server > "$B/build.log"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/llama.cpp"
cp "$B/build/bin/llama-server" "$stage/bin/" && strip "$stage/bin/llama-server"
# The converter to GGUF and the tokenizers the stage needs, so that the source need not travel too:
# convert_hf_to_gguf.py, gguf-py, and every local module or package it imports (newer llama.cpp keeps
# the model classes in conversion/).
cp -r "$B/src/llama.cpp/convert_hf_to_gguf.py" "$B/src/llama.cpp/gguf-py" "$stage/llama.cpp/"
for m in $(sed -nE 's/^(from|import) ([A-Za-z_][A-Za-z0-9_]*).*/\2/p' "$B/src/llama.cpp/convert_hf_to_gguf.py" | sort -u); do
  for f in "$B/src/llama.cpp/$m" "$B/src/llama.cpp/$m.py"; do if [[ -e $f ]]; then cp -r "$f" "$stage/llama.cpp/"; fi; done
done
cp -r "$B/src/tokenizers" "$stage/"
ldd "$B/build/bin/llama-server" | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*|libcudart.so*|libcublas*|libnccl*) ;;
    *) cp -L "$lib" "$stage/lib/" ;;
  esac
done
mkdir -p .gpu_bundle
# The device tool carries 64 MiB in all, the Tandem bundle included: compress hard.
XZ_OPT="${XZ_OPT:--9 -T0}" tar -C "$stage" -cJf .gpu_bundle/llama-server.tar.xz bin lib llama.cpp tokenizers
grep -qx '/.gpu_bundle/' .git/info/exclude 2>/dev/null || echo '/.gpu_bundle/' >> .git/info/exclude
ls -l .gpu_bundle/llama-server.tar.xz
