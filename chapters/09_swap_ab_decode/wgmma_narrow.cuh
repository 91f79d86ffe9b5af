/// @file wgmma_narrow.cuh
/// @brief The wgmma shapes Chapter 9 adds to Chapter 7's (hopper_ptx.cuh has N = 128 and 256): m64nNk16
/// for N = 8, 16, 32 and 64, the token side of the swapped tile. One instruction each, bf16 inputs,
/// fp32 accumulators, both operands K-major in shared memory (PTX ISA 9.0, wgmma.mma_async).
#pragma once

#include <cstdint>

#include "hopper_ptx.cuh"

namespace kc::ch09::ptx {

using namespace ch07::ptx;  // Chapter 7's wrappers: mbarriers, TMA loads, descriptors, wgmma fences

/// One wgmma m64nNk16: D[64×N] (+)= A[64×16] · B[N×16]ᵀ, with A and B K-major in shared memory
/// (descriptors @p a_desc, @p b_desc) and D in the N / 2 fp32 registers @p d of each thread (Chapter 7's
/// accumulator_position gives where each lands). @p accumulate = 0 ignores D's old value (scale-d = 0),
/// 1 adds to it. A wgmma names every accumulator register in its operand list, so each N has its own
/// statement, spelled out because inline PTX takes literal operand lists.
template <int N>
__device__ __forceinline__ void wgmma_m64nNk16(float (&d)[N / 2], std::uint64_t a_desc, std::uint64_t b_desc,
                                               int accumulate = 1) {
  static_assert(N == 8 || N == 16 || N == 32 || N == 64, "the swapped tile's token counts");
  if constexpr (N == 8) {
    asm volatile(
        "{\n"
        ".reg .pred accumulate;\n"
        "setp.ne.b32 accumulate, %6, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3"
        "}, %4, %5, accumulate, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "l"(a_desc), "l"(b_desc), "r"(accumulate));
  } else if constexpr (N == 16) {
    asm volatile(
        "{\n"
        ".reg .pred accumulate;\n"
        "setp.ne.b32 accumulate, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7"
        "}, %8, %9, accumulate, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "l"(a_desc), "l"(b_desc), "r"(accumulate));
  } else if constexpr (N == 32) {
    asm volatile(
        "{\n"
        ".reg .pred accumulate;\n"
        "setp.ne.b32 accumulate, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
        "}, %16, %17, accumulate, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(a_desc), "l"(b_desc), "r"(accumulate));
  } else if constexpr (N == 64) {
    asm volatile(
        "{\n"
        ".reg .pred accumulate;\n"
        "setp.ne.b32 accumulate, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, accumulate, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a_desc), "l"(b_desc), "r"(accumulate));
  }
}

}  // namespace kc::ch09::ptx
