// Warpgroup MMA primitives (sm_90a only: included by wgmma kernels alone,
// since plain sm_80/sm_90 PTX has none of these instructions).
#pragma once

// Matrix descriptor (PTX ISA, "Matrix Descriptor Format") of a K-major tile
// in the 128-byte swizzle: 128-byte rows, 8-row atoms of 1024 bytes; the
// tile starts on a 1024-byte boundary. Bits 0-13: start address >> 4;
// 16-29: leading byte offset >> 4 (unused for swizzled K-major, 1 by
// convention); 32-45: stride byte offset >> 4 (next 8-row atom); 62-63:
// swizzle mode (1 = 128 bytes). Adding 2 to the descriptor advances the start
// by 32 bytes = one k step inside the atom; the hardware swizzles the final
// address, so that stays consistent with the XOR layout the tile was written in.
DEV uint64_t wgmma_desc(const void* smem) {
  uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return static_cast<uint64_t>((s & 0x3FFFF) >> 4) | (1ull << 16) | (static_cast<uint64_t>(1024 >> 4) << 32) |
         (1ull << 62);
}
// wgmma.fence.sync.aligned: orders register accesses to the accumulators before the next wgmma.
DEV void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
// wgmma.commit_group.sync.aligned: closes the group of wgmma issued so far.
DEV void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// wgmma.wait_group.sync.aligned N: at most N groups still running.
template <int N>
DEV void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory"); }
// fence.proxy.async.shared::cta: this thread's generic-proxy shared-memory
// writes (st.shared of decoded weights, cp.async data) become visible to the
// async proxy that wgmma reads operands through. Then a barrier.
DEV void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Empty asm that "reads and writes" every accumulator register: the compiler
// may not move their accesses across it (they are in flight between wgmma and
// its wait). S32: the registers hold s32 sums (int8 wgmma) in the float array.
template <bool S32, int NT>
DEV void acc_fence(float (&acc)[NT][4]) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if (S32) asm volatile("" : "+r"(reinterpret_cast<int&>(acc[j][q])) :: "memory");
      else asm volatile("" : "+f"(acc[j][q]) :: "memory");
    }
}
