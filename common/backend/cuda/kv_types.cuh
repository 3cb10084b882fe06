// KV cache element types for the attention kernels: f32, or BF16/F16 rounded to nearest even when
// written and read back as f32, or FP8 E4M3 rounded to nearest even and saturated to ±448 (no
// scale: values beyond E4M3's range clip), or int8 codes with one f32 scale per token and head
// (KvCacheGeometry's I8 layout: a block's codes, then its scales; KvRows finds both; the writes are
// WriteKvI8's). Device code only (included by .cu files).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/tensor/dtype.h"

namespace tandem::cuda {

__device__ __forceinline__ float LoadKv(const float* p) { return *p; }
__device__ __forceinline__ float LoadKv(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ float LoadKv(const __half* p) { return __half2float(*p); }
// An E4M3 byte as f32 (exact: through F16, which holds every E4M3 value).
__device__ __forceinline__ float Fp8E4M3ToFloat(uint8_t b) {
  __half_raw h;
  h.x = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3).x;
  return __half2float(__half(h));
}
__device__ __forceinline__ float LoadKv(const __nv_fp8_e4m3* p) { return Fp8E4M3ToFloat(p->__x); }
// An int8 code, to be multiplied by its row's scale (KvRows::Scale).
__device__ __forceinline__ float LoadKv(const int8_t* p) { return static_cast<float>(*p); }

template <typename T>
inline constexpr bool kScaledKv = std::is_same_v<T, int8_t>;

// Where a layer's cache of element type T keeps the row of KV head kh at `slot` (head_dim
// elements), and the scale its elements multiply: rows of [kv_heads][head_dim] elements slot after
// slot and scale 1, or (int8) blocks of [block_size][kv_heads][head_dim] codes followed by
// [block_size][kv_heads] f32 scales.
template <typename T>
struct KvRows {
  const T* base;  // the layer's K or V cache
  int64_t num_kv_heads, head_dim, block_size;

  __device__ __forceinline__ int64_t BlockElems() const {
    return block_size * num_kv_heads * head_dim;
  }
  // An int8 block: its codes, then a 4-byte scale per slot and head.
  __device__ __forceinline__ int64_t BlockBytes() const {
    return BlockElems() + block_size * num_kv_heads * 4;
  }
  __device__ __forceinline__ const T* Row(int64_t slot, int64_t kh) const {
    const int64_t row = num_kv_heads * head_dim;
    if constexpr (kScaledKv<T>) {
      return base + (slot / block_size) * BlockBytes() + (slot % block_size) * row + kh * head_dim;
    } else {
      return base + slot * row + kh * head_dim;
    }
  }
  // The scale's address (int8 only).
  __device__ __forceinline__ const float* ScaleAt(int64_t slot, int64_t kh) const {
    const float* scales =
        reinterpret_cast<const float*>(reinterpret_cast<const unsigned char*>(base) +
                                       (slot / block_size) * BlockBytes() + BlockElems());
    return scales + (slot % block_size) * num_kv_heads + kh;
  }
  __device__ __forceinline__ float Scale(int64_t slot, int64_t kh) const {
    if constexpr (kScaledKv<T>) {
      return *ScaleAt(slot, kh);
    } else {
      return 1.f;
    }
  }
};
__device__ __forceinline__ void StoreKv(float* p, float x) { *p = x; }
__device__ __forceinline__ void StoreKv(__nv_bfloat16* p, float x) { *p = __float2bfloat16_rn(x); }
__device__ __forceinline__ void StoreKv(__half* p, float x) { *p = __float2half_rn(x); }
__device__ __forceinline__ void StoreKv(__nv_fp8_e4m3* p, float x) {
  p->__x = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

// kN consecutive cache elements read by one access (2, 4, 8 or 16 bytes; several 16-byte ones past
// that) and kept as raw words until each element is read, as LoadKv reads it: the attention
// kernels' lane loads a whole slice of a K or V row at once. Load's p must be aligned to min(kN ·
// sizeof(T), 16).
template <typename T, int kN>
struct KvVec {
  static constexpr int kBytes = kN * static_cast<int>(sizeof(T));
  static constexpr int kWords = kBytes < 4 ? 1 : kBytes / 4;
  uint32_t w[kWords];

  __device__ __forceinline__ void Load(const T* p) {
    if constexpr (kBytes >= 16) {
#pragma unroll
      for (int i = 0; i < kBytes / 16; ++i) {
        const uint4 v = reinterpret_cast<const uint4*>(p)[i];
        w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
      }
    } else if constexpr (kBytes == 8) {
      const uint2 v = *reinterpret_cast<const uint2*>(p);
      w[0] = v.x, w[1] = v.y;
    } else if constexpr (kBytes == 4) {
      w[0] = *reinterpret_cast<const uint32_t*>(p);
    } else if constexpr (kBytes == 2) {
      w[0] = *reinterpret_cast<const uint16_t*>(p);
    } else {
      static_assert(kBytes == 1, "one 8-bit element");
      w[0] = *reinterpret_cast<const uint8_t*>(p);
    }
  }
  // Element e as f32 (exact: every 16- and 8-bit value is a float).
  __device__ __forceinline__ float operator[](int e) const {
    if constexpr (sizeof(T) == 4) {
      return __uint_as_float(w[e]);
    } else if constexpr (std::is_same_v<T, int8_t>) {
      return static_cast<float>(
          static_cast<int8_t>(w[e / 4] >> (8 * (e % 4))));  // element 0 lowest
    } else if constexpr (sizeof(T) == 1) {
      return Fp8E4M3ToFloat(static_cast<uint8_t>(w[e / 4] >> (8 * (e % 4))));
    } else {
      const uint32_t bits = (w[e / 2] >> (16 * (e % 2))) & 0xffffu;  // element 0 in the low half
      if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        return __uint_as_float(bits << 16);
      } else {
        __half_raw r;
        r.x = static_cast<unsigned short>(bits);
        return __half2float(__half(r));
      }
    }
  }
};

// fn(static_cast<T*>(nullptr)) for the cache's element type T.
template <typename Fn>
cudaError_t WithKvType(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kF32: return fn(static_cast<float*>(nullptr));
    case DType::kBF16: return fn(static_cast<__nv_bfloat16*>(nullptr));
    case DType::kF16: return fn(static_cast<__half*>(nullptr));
    case DType::kF8E4M3: return fn(static_cast<__nv_fp8_e4m3*>(nullptr));
    case DType::kI8: return fn(static_cast<int8_t*>(nullptr));
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace tandem::cuda
