// Tensor Memory Accelerator (TMA) loads, mbarriers and thread-block clusters
// (sm_90a). Each function wraps the PTX named in its comment.
#pragma once

// A CUtensorMap (cuTensorMapEncodeTiled, on the host): 128 opaque bytes,
// passed by value as a __grid_constant__ kernel parameter so that TMA reads
// it from parameter space.
struct __align__(64) TmaDesc { uint64_t opaque[16]; };

DEV uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// mbarrier.init.shared::cta.b64 [bar], count: `count` arrivals complete a phase.
DEV void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(smem_addr(bar)), "r"(count));
}
// fence.mbarrier_init.release.cluster: the inits are visible to the cluster
// (and to the async proxy) before the barrier that follows.
DEV void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar], bytes: this thread's
// arrival, and `bytes` more that the TMA copies of this phase will deliver.
DEV void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
               :: "r"(smem_addr(bar)), "r"(bytes) : "memory");
}

// mbarrier.try_wait.parity.shared::cta.b64 p, [bar], parity, in a loop: until
// the phase of that parity has completed. (A fresh barrier is in phase 0, so
// waiting on parity 1 returns at once: "the slot starts empty".)
DEV void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t a = smem_addr(bar);
  asm volatile("{\n.reg .pred p;\nWAIT_%=:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
               "@!p bra WAIT_%=;\n}\n" :: "r"(a), "r"(parity) : "memory");
}

// %cluster_ctarank: this block's rank in its cluster.
DEV uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// mbarrier.arrive.shared::cta.b64 _, [bar]: one arrival, this block's barrier.
DEV void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(smem_addr(bar)) : "memory");
}

// mapa.shared::cluster.u32 + mbarrier.arrive.shared::cluster.b64: one arrival
// on the barrier at the same offset in block `rank` of the cluster. Default
// (.release.cta) semantics: it only has to order this warp's finished reads
// of the slot before the producer's next TMA write, as for a local arrival;
// a .cluster-scope release would wait for all of the thread's memory traffic.
DEV void mbar_arrive_cluster(uint64_t* bar, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_addr(bar)), "r"(rank));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" :: "r"(remote) : "memory");
}

// barrier.cluster.arrive.release + barrier.cluster.wait.acquire: every thread
// of every block in the cluster. Orders the barrier inits before any remote
// arrival or multicast, and keeps a block alive until its peer is done with it.
DEV void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes:
// the box at (x = inner coordinate, y = row) of the tensor map into shared
// memory, swizzled as the map says; rows and columns outside the tensor
// arrive as zeros. Completion is counted in bytes on `bar`.
DEV void tma_load_2d(void* dst, const TmaDesc* map, int x, int y, uint64_t* bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%2, %3}], [%4];\n"
               :: "r"(smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y),
                  "r"(smem_addr(bar)) : "memory");
}
// ... .multicast::cluster: the same box lands at the same shared-memory offset
// (and signals the barrier at the same offset) in every block of `mask`.
DEV void tma_load_2d_multicast(void* dst, const TmaDesc* map, int x, int y, uint64_t* bar, uint16_t mask) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
               " [%0], [%1, {%2, %3}], [%4], %5;\n"
               :: "r"(smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y),
                  "r"(smem_addr(bar)), "h"(mask) : "memory");
}

// setmaxnreg.{inc,dec}.sync.aligned.u32 N: a warpgroup hands registers back
// (the producer) or takes them (the MMA warpgroups' accumulators).
template <int N> DEV void regs_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(N)); }
template <int N> DEV void regs_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(N)); }
