/// @file mma_sm80.cuh
/// @brief The four PTX instructions of the sm_80 tensor-core path, one small wrapper each:
/// cp.async (global → shared without passing through registers), ldmatrix (shared → the register
/// fragments mma expects) and mma.sync m16n8k16 bf16 with fp32 accumulators.
///
/// They are inline PTX because CUDA C++ has no plain function for them that a learner can read
/// line by line (the WMMA API hides the fragment layout this chapter teaches). Every wrapper runs on
/// sm_80 and later, Hopper included. This file is the only place they are written.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace kc::ch02::sm80 {

/// The 32-bit shared-memory address PTX wants for @p pointer (a generic pointer into `__shared__`).
__device__ __forceinline__ std::uint32_t shared_address(const void* pointer) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(pointer));
}

/// Starts an asynchronous 16-byte copy global → shared (cp.async.cg: cached in L2 only, since the
/// tile is used once from shared memory). When @p valid is false the source size is 0: nothing is
/// read and the 16 shared bytes are zero-filled, which is how out-of-range rows and the K tail become
/// zeros that add nothing to the dot products. @p global must be a valid address either way.
/// @param shared destination (16-byte aligned shared address)
/// @param global source (16-byte aligned)
/// @param valid copy the bytes (true) or write zeros (false)
__device__ __forceinline__ void cp_async_16(std::uint32_t shared, const void* global, bool valid) {
  const int source_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared), "l"(global), "r"(source_bytes)
               : "memory");
}

/// Closes the group of cp.async issued since the last commit: wait_group counts these groups.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

/// Waits until at most @p kPending of this thread's committed groups are still in flight. The copies
/// of other threads are visible only after a __syncthreads() that follows the wait.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

/// ldmatrix.x4: the warp loads four 8×8 matrices of 16-bit values. Lane i supplies the address of
/// one 16-byte row: row i % 8 of matrix i / 8. Afterwards register j of lane l holds matrix j's row
/// l / 4, elements 2·(l % 4) and 2·(l % 4) + 1 — exactly the layout mma.sync wants for its operands.
/// @param regs the four 32-bit registers (two bf16 each), one per matrix
/// @param row_address this lane's row (shared address, 16-byte aligned)
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&regs)[4], std::uint32_t row_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(regs[0]), "=r"(regs[1]), "=r"(regs[2]), "=r"(regs[3])
               : "r"(row_address)
               : "memory");
}

/// d += a · b for one warp: a is a 16×16 bf16 tile (row-major fragment, 4 registers), b a 16×8 bf16
/// tile (column-major fragment, 2 registers), d a 16×8 fp32 tile (4 registers per lane). Products
/// are exact in fp32 and accumulated in fp32. With g = lane / 4 and t = lane % 4, lane holds
///   a[0] = A[g][2t, 2t+1]    a[1] = A[g+8][2t, 2t+1]    a[2] = A[g][2t+8, 2t+9]    a[3] = A[g+8][2t+8, 2t+9]
///   b[0] = B[2t, 2t+1][g]    b[1] = B[2t+8, 2t+9][g]
///   d[0], d[1] = D[g][2t, 2t+1]                         d[2], d[3] = D[g+8][2t, 2t+1]
/// @param d accumulator fragment, updated in place
/// @param a A fragment
/// @param b B fragment
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const std::uint32_t (&a)[4],
                                               const std::uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

}  // namespace kc::ch02::sm80
