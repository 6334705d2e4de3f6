// Small device primitives. Each wraps one PTX instruction (named in its comment)
// so that the kernels read as data movement + math, not inline assembly.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;

#define DEV __device__ __forceinline__

// cp.async.cg.shared.global [dst], [src], 16, src_bytes: 16-byte async copy that
// bypasses L1; src_bytes = 0 zero-fills (used to predicate tails).
template <int BYTES>
DEV void cp_async(void* smem, const void* gmem, bool pred) {
  uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  int n = pred ? BYTES : 0;
  if (BYTES == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(s), "l"(gmem), "r"(n));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" :: "r"(s), "l"(gmem), "n"(BYTES), "r"(n));
  }
}
// cp.async.commit_group
DEV void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// cp.async.wait_group N: at most N most recent groups still in flight.
template <int N>
DEV void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }

// bar.sync id, threads: wait for `threads` threads (whole warps) of the block
// on named barrier id (0 is __syncthreads' own; 1-15 for subsets of warps).
DEV void bar_sync(int id, int threads) { asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(threads) : "memory"); }

// ldmatrix.sync.aligned.m8n8.x4.shared.b16: four 8x8 b16 tiles, lane i gives row address i.
DEV void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16: as above, each tile transposed.
DEV void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}

// lop3.b32 d, a, b, c, LUT: any 3-input bitwise function in one instruction.
template <int LUT>
DEV uint32_t lop3(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, %4;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c), "n"(LUT));
  return d;
}
// (a & b) | c, the LUT for lop3 derived from a=0xF0, b=0xCC, c=0xAA.
constexpr int LOP_AND_OR = (0xF0 & 0xCC) | 0xAA;

// ld.global.nc.v4: 16-byte read-only load (weights, scales are never written).
DEV uint4 ldg16(const void* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

// ld.global.nc.L1::no_allocate.v4/v2/b32: weights read exactly once (GEMV
// stream) skip L1, leaving it to the activations, scales and zero points.
DEV uint4 ldg16_stream(const void* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}
DEV uint2 ldg8_stream(const void* p) {
  uint2 r;
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];\n" : "=r"(r.x), "=r"(r.y) : "l"(p));
  return r;
}
DEV uint32_t ldg4_stream(const void* p) {
  uint32_t r;
  asm("ld.global.nc.L1::no_allocate.b32 %0, [%1];\n" : "=r"(r) : "l"(p));
  return r;
}

// Warp-wide sum through shfl.sync.bfly.
DEV float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Numeric conversions to/from the compute (mma operand) types.
DEV float to_float(half x) { return __half2float(x); }
DEV float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
DEV float to_float(float x) { return x; }
template <typename T> DEV T from_float(float x);
template <> DEV half from_float<half>(float x) { return __float2half_rn(x); }
template <> DEV __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> DEV float from_float<float>(float x) { return x; }

// e8m0 (OCP MX shared exponent) -> float: 2^(e - 127), built in the exponent field.
DEV float e8m0_to_float(uint8_t e) {
  return e == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(static_cast<uint32_t>(e) << 23);
}

// Epilogue activations (fp32).
DEV float act_relu(float x) { return fmaxf(x, 0.f); }
DEV float act_silu(float x) { return x / (1.f + __expf(-x)); }
DEV float act_gelu(float x) { return 0.5f * x * (1.f + erff(x * 0.70710678118654752f)); }
DEV float act_none(float x) { return x; }
