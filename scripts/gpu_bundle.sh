#!/usr/bin/env bash
# Packs what the GPU checks need to run on a machine that has CUDA but not Tandem's libraries (the
# device machine: CUDA 13, cuBLAS from PyTorch's wheels, no gRPC/Abseil/OpenBLAS): the GPU test
# binaries and the CLI, stripped, with every shared library they load except the C library and CUDA's
# own, into .gpu_bundle/bundle.tar.xz (ignored by git; carry `.gpu_bundle` to the machine).
#   scripts/gpu_bundle.sh [BUILD_DIR]      then, there: scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
OUT=.gpu_bundle
# Only this script's own files: the llama.cpp tarballs beside them stay.
rm -rf "$OUT/stage" "$OUT/run" "$OUT/bundle.tar.xz" && mkdir -p "$OUT/stage/bin" "$OUT/stage/lib"
bins=("$BUILD/tests/gpu/cuda_smoke_test" "$BUILD/tests/gpu/cuda_backend_test" "$BUILD/tests/gpu/kv_link_test"
      "$BUILD/tests/e2e/service_e2e_test" "$BUILD/tests/bench/kv_transfer_bench" "$BUILD/cli/tandem"
      "$BUILD/tests/bench/forward_bench" "$BUILD/tests/bench/spec_bench" "$BUILD/tests/bench/quant_bench" "$BUILD/router/tandem-router" "$BUILD/prefill_worker/tandem-prefill-worker"
      "$BUILD/decode_worker/tandem-decode-worker" "$BUILD/common/cuda_plugin/libtandem_cuda_plugin.so")
for b in "${bins[@]}"; do
  [[ -x "$b" ]] || { echo "gpu_bundle: $b is missing: build it first (cmake --build $BUILD)" >&2; exit 1; }
  cp "$b" "$OUT/stage/bin/" && strip "$OUT/stage/bin/$(basename "$b")"
done
# Libraries by path from ldd, minus glibc's own and CUDA's (the machine brings a matching driver and
# toolkit; its cuBLAS and NCCL may come from PyTorch's nvidia-* wheels, which gpu_check.sh finds).
ldd "${bins[@]}" | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*|libcudart.so*|libcublas*|libnccl*) ;;
    *) cp -L "$lib" "$OUT/stage/lib/" ;;
  esac
done
# xz -9: with the prebuilt llama-server it must stay under the device tool's 64 MiB carry.
XZ_OPT=-9 tar -C "$OUT/stage" -cJf "$OUT/bundle.tar.xz" bin lib
rm -rf "$OUT/stage"
grep -qx '/.gpu_bundle/' .git/info/exclude 2>/dev/null || echo '/.gpu_bundle/' >> .git/info/exclude
ls -l "$OUT/bundle.tar.xz"
