/// @file decode_cases.hpp
/// @brief The chapter's benchmark cases: decode-sized groups of DeepSeek-V3, Mixtral and
/// Qwen3-30B-A3B experts, equal or routed by Chapter 4's DeepSeek-V3 routing. Host-only; the
/// benchmark, the CPU tests and the lesson share them.
#pragma once

#include <cstdint>
#include <vector>

#include "grouped_gemm.hpp"  // Chapter 5: GroupedCase

namespace kc::ch09 {

/// The seed of the routed cases' logits.
inline constexpr std::uint64_t kRoutedLogitSeed = 9;

/// @p tokens tokens routed top-8 over DeepSeek-V3's 256 experts by Chapter 4's fp64 reference of its
/// grouped routing (8 groups, the best 4 kept, scaling factor 2.5, zero correction bias), from logits
/// uniform in [-4, 4] drawn with @p seed; the group sizes are the routing's expert counts (8 · tokens
/// rows). Labelled `dsv3_decode_T<tokens>_E256_k8_N4096_K7168` (DeepSeek-V3's up projection).
/// Throws kc::InvalidArgument for tokens < 1.
ch05::GroupedCase routed_decode_case(std::int64_t tokens, std::uint64_t seed = kRoutedLogitSeed);

/// The chapter's benchmark cases, in this order: DeepSeek-V3 up (N 4096, K 7168) with 32 experts of
/// 1, 2, 4, 8, 16, 32, 64, 128 and 256 rows (the crossover); routed_decode_case for 1, 8, 32 and 128
/// tokens; Mixtral up (N 28672, K 4096), 8 experts of 1, 4, 16 and 64 rows; Qwen3-30B-A3B gate and up
/// (N 1536, K 2048), 128 experts of 1, 4 and 16 rows.
std::vector<ch05::GroupedCase> decode_benchmark_cases();

}  // namespace kc::ch09
