/// @file combine_slots.hpp
/// @brief Chapter 10's combine, the part a thread computes: eight columns of one token's output, the
/// sum of the token's permuted rows in slot order. A `__host__ __device__` function, so the CPU tests
/// check it value by value and the kernel (combine_rows.cu) calls the same code.
///
/// The rows arrive weighted (the down projection's epilogue applied the routing weights), so the
/// combine is a plain sum. It is deterministic: slot 0, then 1, ..., in fp32, one rounding to bf16 at
/// the end. Another order (atomics, a tree) rounds differently, so two runs, or two GPUs, would not
/// agree bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kc::ch10 {

/// Eight consecutive columns of one row, in fp32.
struct Columns8 {
  float v[8];  ///< the values
};

/// The sum, in slot order, of the rows @p row_of_slot[0 .. slots - 1] of one token, eight columns at a
/// time: out.v[c] = (((row_0[c] + row_1[c]) + row_2[c]) + ...) in fp32, starting from 0. A slot whose
/// row is negative (an expert id that was dropped) adds nothing.
/// @param row_of_slot the token's rows of the permuted output, one per slot
/// @param slots k + S
/// @param load_row load_row(row) gives the eight columns of that row, as Columns8
#pragma nv_exec_check_disable  // load_row is a host lambda in the CPU tests, a device one in the kernel
template <class LoadRow>
__host__ __device__ inline Columns8 sum_slot_rows(const std::int32_t* row_of_slot, int slots, const LoadRow& load_row) {
  Columns8 sum{};
  // exercise 1: Add the token's rows in slot order, j = 0, 1, ..., slots - 1, skipping a slot whose
  // exercise 1: row is negative. Each column is its own fp32 sum that starts at zero (sum is zeroed).
  // stub: (void)row_of_slot, (void)slots, (void)load_row;
  for (int j = 0; j < slots; ++j) {
    const std::int32_t row = row_of_slot[j];
    if (row < 0) continue;
    const Columns8 r = load_row(row);
    for (int c = 0; c < 8; ++c) sum.v[c] += r.v[c];
  }
  // end exercise 1
  return sum;
}

}  // namespace kc::ch10
