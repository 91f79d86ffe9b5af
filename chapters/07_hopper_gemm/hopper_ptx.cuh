/// @file hopper_ptx.cuh
/// @brief The handful of Hopper instructions the chapter's kernels use, one small wrapper each, in the
/// order a kernel meets them: mbarriers, TMA copies, wgmma, setmaxnreg; then the epilogue that stores
/// the accumulators. Each wrapper is the PTX instruction and nothing else; the comments say what it
/// guarantees (the PTX ISA manual, version 9.0, is the reference for each instruction).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "hopper_launch.hpp"
#include "hopper_tiles.hpp"

// wgmma and setmaxnreg exist only in sm_90a code. CMake compiles this chapter for 90a alone
// (kc_add_chapter's HOPPER option); any other device target is a build mistake, said plainly here.
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "Chapter 7's kernels are sm_90a code: compile them with -gencode arch=compute_90a,code=sm_90a"
#endif

namespace kc::ch07::ptx {

/// The 32-bit shared-memory address of a generic pointer into shared memory (what PTX operands take).
__device__ __forceinline__ std::uint32_t smem_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

/// Rounds the dynamic shared-memory base up to the 1024-byte swizzle atom (the kernels ask for
/// kSwizzleAtomBytes of slack for this).
__device__ __forceinline__ unsigned char* align_to_swizzle_atom(unsigned char* p) {
  const std::uint32_t address = smem_address(p);
  const std::uint32_t aligned = (address + kSwizzleAtomBytes - 1) / kSwizzleAtomBytes * kSwizzleAtomBytes;
  return p + (aligned - address);
}

// ------------------------------------------------------------------------------------------ mbarrier

/// Sets up an mbarrier in phase 0 that completes when @p arrivals threads have arrived and every
/// byte announced with expect_tx has landed.
__device__ __forceinline__ void mbarrier_init(std::uint64_t* bar, std::uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(bar)), "r"(arrivals) : "memory");
}

/// Makes the initialised barriers visible to the copy engine (the async proxy) before any TMA uses
/// them. Follow with __syncthreads so the other threads see them too.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

/// Arrives on @p bar and tells it that @p bytes more will land through TMA copies before it may
/// complete (the full barrier's single arrival: one per stage per round).
__device__ __forceinline__ void mbarrier_arrive_expect_tx(std::uint64_t* bar, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}

/// Arrives on @p bar (a consumer warp saying "I am done reading this stage").
__device__ __forceinline__ void mbarrier_arrive(std::uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_address(bar)) : "memory");
}

/// Waits until the phase of @p bar with parity @p parity has completed. A barrier's phases alternate
/// 0, 1, 0, ...: round r of a stage waits for parity r & 1. try_wait sleeps in hardware for a while
/// before it gives up, so the loop does not hammer shared memory.
__device__ __forceinline__ void mbarrier_wait(std::uint64_t* bar, std::uint32_t parity) {
  std::uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        ".reg .pred complete;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n"
        "selp.u32 %0, 1, 0, complete;\n"
        "}\n"
        : "=r"(done)
        : "r"(smem_address(bar)), "r"(parity)
        : "memory");
  } while (done == 0);
}

// ------------------------------------------------------------------------------- Stream-K's flags (global)

/// Raises the flag at @p flag (global memory) for another CTA of the grid: release at GPU scope, so a
/// thread that sees it (flag_acquire_wait) also sees every write this thread's CTA made before it
/// (the caller passes a barrier of the writing threads first).
__device__ __forceinline__ void flag_release(std::int32_t* flag) {
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(flag) : "memory");
}

/// Waits until the flag at @p flag is up, with acquire semantics at GPU scope: the writes made
/// before flag_release are visible to this thread (and, after a barrier, to its CTA).
__device__ __forceinline__ void flag_acquire_wait(const std::int32_t* flag) {
  std::int32_t up = 0;
  do {
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(up) : "l"(flag) : "memory");
  } while (up == 0);
}

// ----------------------------------------------------------------------------------------------- TMA

// --------------------------------------------------------------------- programmatic dependent launch

/// Waits until the grids this one depends on (the previous kernel in the stream, when this one was
/// launched with programmatic stream serialization) have completed and their memory writes are
/// visible. Without such a launch it returns at once.
__device__ __forceinline__ void wait_for_previous_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

/// Lets the next kernel in the stream (launched with programmatic stream serialization) start its
/// blocks once every block of this grid has said so or exited; they still wait_for_previous_grid
/// before touching memory this grid writes.
__device__ __forceinline__ void allow_next_grid() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

/// Copies the box at element coordinates (@p col, @p row) of @p map into shared memory at @p dst;
/// the bytes complete_tx on @p bar. Parts of the box outside the matrix arrive as zeros and still
/// count. @p map must live in kernel parameter space (a __grid_constant__ parameter).
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, std::uint64_t* bar, int col, int row) {
  const auto map_address = reinterpret_cast<std::uint64_t>(map);
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];"
      :
      : "r"(smem_address(dst)), "l"(map_address), "r"(smem_address(bar)), "r"(col), "r"(row)
      : "memory");
}

/// As tma_load_2d, but the box lands at the same shared-memory offset in every CTA of the cluster
/// whose bit is set in @p cta_mask (bit r = the CTA of rank r), and completes bytes on the mbarrier at
/// @p bar's offset in each of them. One read of L2, several CTAs fed: step 5's W slices.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const CUtensorMap* map, std::uint64_t* bar, int col,
                                                      int row, std::uint16_t cta_mask) {
  const auto map_address = reinterpret_cast<std::uint64_t>(map);
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%3, %4}], [%2], %5;"
      :
      : "r"(smem_address(dst)), "l"(map_address), "r"(smem_address(bar)), "r"(col), "r"(row), "h"(cta_mask)
      : "memory");
}

// ------------------------------------------------------------------------------------------ clusters

/// This CTA's rank in its cluster (0 .. cluster size - 1): the bit it answers to in a multicast mask.
__device__ __forceinline__ int cluster_rank() {
  std::uint32_t rank = 0;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return static_cast<int>(rank);
}

/// Arrives on the mbarrier at @p bar's offset in the shared memory of cluster CTA @p cta_rank (this
/// CTA's own included): mapa turns the local address into that CTA's address in the cluster's shared
/// window. The default semantics (release, CTA scope), as CUTLASS's ClusterBarrier uses: what must
/// happen before the refill is the wgmma's reading of the stage, which wait_group has already seen
/// complete; the barrier's phase is what orders the refill after it. Spelling .release.cluster
/// instead costs a MEMBAR.ALL.GPU before every arrive (seen in the SASS), which also waits for this
/// thread's outstanding stores to C.
__device__ __forceinline__ void mbarrier_arrive_cluster(std::uint64_t* bar, int cta_rank) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(smem_address(bar)),
      "r"(cta_rank)
      : "memory");
}

/// Every thread of every CTA of the cluster arrives (release) and then waits (acquire): a
/// __syncthreads for the whole cluster. Step 5 needs it twice: after the barriers are initialised
/// (a peer must not multicast into, or arrive on, a barrier that does not exist yet) and before
/// exiting (a CTA must not leave while its peer may still arrive on its barriers).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}

// --------------------------------------------------------------------------------------------- wgmma

/// The wgmma descriptor of a K-major tile that TMA wrote with 128-byte swizzle at @p tile
/// (hopper_tiles.hpp: smem_descriptor_sw128). @p tile must be 1024-byte aligned.
__device__ __forceinline__ std::uint64_t descriptor_of(const void* tile) {
  return smem_descriptor_sw128(smem_address(tile));
}

/// Orders this warpgroup's earlier register and shared-memory accesses before the wgmma that
/// follow. Needed before the first wgmma and whenever other instructions touched the accumulators.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }

/// Closes the wgmma issued since the last commit into one group that can be waited for.
__device__ __forceinline__ void wgmma_commit_group() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }

/// Waits until at most @p Pending committed groups are still running: 0 waits for all; 1 lets the
/// last group run on while the caller releases the stage the one before it read.
template <int Pending>
__device__ __forceinline__ void wgmma_wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(Pending) : "memory");
}

/// Tells the compiler the accumulators are read and written here, so that it neither moves their
/// uses across a wgmma wait nor keeps stale copies: the wgmma asm statements write them behind the
/// compiler's back, asynchronously.
template <int Count>
__device__ __forceinline__ void fence_accumulators(float (&acc)[Count]) {
#pragma unroll
  for (int i = 0; i < Count; ++i) asm volatile("" : "+f"(acc[i])::"memory");
}

// A wgmma names every accumulator register in its operand list, so each N has its own statement.
// The lists below are spelled out because inline PTX takes literal operand lists.

/// One wgmma m64n128k16: D[64×128] (+)= A[64×16] · B[128×16]ᵀ, with A and B K-major in shared memory
/// (descriptors @p a_desc, @p b_desc) and D in the 64 fp32 registers @p d of each thread.
/// @p accumulate = 0 ignores D's old value (scale-d = 0), 1 adds to it.
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], std::uint64_t a_desc, std::uint64_t b_desc,
                                                 int accumulate = 1) {
  asm volatile(
      "{\n"
      ".reg .pred accumulate;\n"
      "setp.ne.b32 accumulate, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, accumulate, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a_desc), "l"(b_desc), "r"(accumulate));
}

/// One wgmma m64n256k16: D[64×256] (+)= A[64×16] · B[256×16]ᵀ, with A and B K-major in shared memory
/// (descriptors @p a_desc, @p b_desc) and D in the 128 fp32 registers @p d of each thread.
/// @p accumulate = 0 ignores D's old value (scale-d = 0), 1 adds to it.
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], std::uint64_t a_desc, std::uint64_t b_desc,
                                                 int accumulate = 1) {
  asm volatile(
      "{\n"
      ".reg .pred accumulate;\n"
      "setp.ne.b32 accumulate, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, accumulate, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),
        "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]),
        "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]),
        "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]),
        "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]),
        "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),
        "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]),
        "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]),
        "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(a_desc), "l"(b_desc), "r"(accumulate));
}

// ----------------------------------------------------------------------------------------- registers

/// Lowers this warpgroup's register limit to @p Registers (a producer that needs few).
template <int Registers>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(Registers));
}

/// Raises this warpgroup's register limit to @p Registers, waiting until the block's pool has them.
template <int Registers>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(Registers));
}

// ------------------------------------------------------------------------------------------ epilogue

/// Stores one warpgroup's 64 × N fp32 accumulators, rounded to bf16, into C at (@p row0, @p col0),
/// masking rows >= m and columns >= n. Adjacent register pairs are adjacent columns: one 4-byte store
/// per pair when out.paired_stores (N even, c 4-byte aligned), two 2-byte stores otherwise.
template <int Count>
__device__ __forceinline__ void store_accumulators(const float (&acc)[Count], const detail::Output& out, int row0,
                                                   int col0) {
  const int thread = static_cast<int>(threadIdx.x % kWarpgroupThreads);
#pragma unroll
  for (int i = 0; i < Count; i += 2) {
    const FragmentPosition at = accumulator_position(thread, i);
    const int row = row0 + at.row, col = col0 + at.col;
    if (row >= out.m || col >= out.n) continue;
    __nv_bfloat16* dst = out.c + static_cast<std::size_t>(row) * out.n + col;
    if (out.paired_stores) {
      *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(acc[i], acc[i + 1]);
    } else {
      dst[0] = __float2bfloat16_rn(acc[i]);
      if (col + 1 < out.n) dst[1] = __float2bfloat16_rn(acc[i + 1]);
    }
  }
}

// ------------------------------------------------------------------------- the TMA-store epilogue (step 6)

/// Waits until the @p threads threads (a multiple of 32) of the named barrier @p id have all arrived:
/// a __syncthreads for one warpgroup (id 0 is __syncthreads' own; the consumers use 1 and 2).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

/// Makes this thread's ordinary shared-memory writes (st.shared, stmatrix) visible to the async proxy
/// (TMA), which reads the staged C next. Every writing thread runs it before the barrier that
/// precedes the TMA store.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

/// stmatrix .x4: the warp stores four 8 × 8 bf16 matrices to shared memory. Lane l gives the address
/// @p row_address of row l % 8 of matrix l / 8; register i of every lane (@p r0 .. @p r3) holds that
/// lane's bf16 pair of matrix i: row lane / 4, columns 2 · (lane % 4) and + 1 (stmatrix_row).
__device__ __forceinline__ void stmatrix_x4(std::uint32_t row_address, std::uint32_t r0, std::uint32_t r1,
                                            std::uint32_t r2, std::uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared::cta.b16 [%0], {%1, %2, %3, %4};" ::"r"(row_address), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

/// Copies the box staged at @p src in shared memory to element coordinates (@p col, @p row) of
/// @p map's matrix in global memory; the parts of the box outside the matrix are not written. The copy
/// joins this thread's current bulk group (bulk_commit_group closes it).
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, const void* src, int col, int row) {
  const auto map_address = reinterpret_cast<std::uint64_t>(map);
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%2, %3}], [%1];" ::"l"(map_address),
               "r"(smem_address(src)), "r"(col), "r"(row)
               : "memory");
}

/// Closes this thread's bulk copies issued since the last commit into one group.
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

/// Waits until at most @p Pending of this thread's bulk groups are still reading their shared-memory
/// source: the staging buffer may be overwritten (the global writes may still be in flight).
template <int Pending>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(Pending) : "memory");
}

/// Waits until at most @p Pending of this thread's bulk groups are still running, global writes included.
template <int Pending>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(Pending) : "memory");
}

/// Packs two fp32 into one 32-bit register of two bf16 (round to nearest even), low half first.
__device__ __forceinline__ std::uint32_t pack_bf16x2(float low, float high) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
  return *reinterpret_cast<const std::uint32_t*>(&pair);
}

/// Writes @p Steps · 16 columns of one warpgroup's 64 × N fp32 accumulators, from column
/// 16 · @p first_step on, rounded to bf16, into its staging buffer at @p staging (1024-byte aligned)
/// in the swizzled box layout of c_staging_offset (column 16 · first_step lands at column 0): one
/// stmatrix .x4 per 16 columns per thread, each storing 8 rows of 16 bytes per matrix into 8
/// different 16-byte chunks of the 128-byte swizzle, so no two lanes of a phase share a bank.
/// @p first_step must be known after unrolling (the accumulators must stay in registers).
template <int Steps, int Count>
__device__ __forceinline__ void stage_accumulators(const float (&acc)[Count], unsigned char* staging, int first_step) {
  static_assert(Steps * 8 <= Count, "no more columns than the accumulators hold");
  const int thread = static_cast<int>(threadIdx.x % kWarpgroupThreads);
  const int warp = thread / 32, lane = thread % 32;
  const std::uint32_t base = smem_address(staging);
#pragma unroll
  for (int step = 0; step < Steps; ++step) {
    const FragmentPosition row = stmatrix_row(warp, lane, step);
    const float* a = acc + 8 * (first_step + step);
    stmatrix_x4(base + static_cast<std::uint32_t>(c_staging_offset(row.row, row.col)), pack_bf16x2(a[0], a[1]),
                pack_bf16x2(a[2], a[3]), pack_bf16x2(a[4], a[5]), pack_bf16x2(a[6], a[7]));
  }
}

}  // namespace kc::ch07::ptx
