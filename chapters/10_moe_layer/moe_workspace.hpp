/// @file moe_workspace.hpp
/// @brief Internal: where each intermediate of the layer (before, the steps, after) lives in its
/// workspace. Every region starts on a 256-byte boundary; a null base gives the layout and its size
/// only. The permuted rows are sized for the most any variant makes: T · (k + S), when the shared
/// experts are routed as experts E .. E + S - 1.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "grouped_gemm.hpp"         // Chapter 5: the permutation's workspace
#include "hopper_grouped_gemm.hpp"  // Chapter 8: the grouped GEMM's workspace
#include "moe_layer.hpp"

namespace kc::ch10::detail {

/// The regions of the workspace for one configuration and token count.
struct MoeWorkspace {
  __nv_bfloat16* logits = nullptr;          ///< [T, E] router logits
  float* route_weights = nullptr;           ///< [T, k]
  std::int32_t* ids = nullptr;              ///< [T, k]
  std::int32_t* slot_ids = nullptr;         ///< [T, k + S] the ids with the shared experts' slots
  std::int32_t* counts = nullptr;           ///< [E + S]
  std::int32_t* offsets = nullptr;          ///< [E + S + 1]
  std::int32_t* row_of_pair = nullptr;      ///< [T · (k + S)]
  std::int32_t* token_of_row = nullptr;     ///< [T · (k + S)]
  float* weight_of_row = nullptr;           ///< [T · (k + S)] the routing weight of each permuted row
  __nv_bfloat16* a = nullptr;               ///< [T · (k + S), H] the permuted token copies
  __nv_bfloat16* gate_up = nullptr;         ///< [T · k, 2I] the up projection, before SiLU · up (before only)
  __nv_bfloat16* h = nullptr;               ///< [T · (k + S), I] SiLU(gate) · up
  __nv_bfloat16* expert_out = nullptr;      ///< [T · (k + S), H] the down projection
  __nv_bfloat16* shared_gate_up = nullptr;  ///< [T, 2I] a dense shared expert's up projection
  __nv_bfloat16* shared_h = nullptr;        ///< [T, I]
  __nv_bfloat16* shared_out = nullptr;      ///< [T, H]
  void* permute_scratch = nullptr;          ///< Chapter 5's permutation workspace
  std::size_t permute_scratch_bytes = 0;    ///< its size
  void* grouped_scratch = nullptr;          ///< Chapter 8's grouped GEMM workspace (up and down)
  std::size_t grouped_scratch_bytes = 0;    ///< its size
  std::size_t bytes = 0;                    ///< the whole workspace

  /// The regions for @p tokens tokens of @p c in the workspace at @p base (null: sizes only).
  MoeWorkspace(const MoeConfig& c, std::int64_t tokens, void* base) {
    const int s = c.shared_experts, slots = c.k + s, experts = c.experts + s;
    const std::int64_t pairs = tokens * c.k, rows = tokens * slots;
    const std::int64_t h_cols = c.hidden, i_cols = c.intermediate;
    auto* at = static_cast<unsigned char*>(base);
    auto take = [&](auto*& region, std::int64_t elements) {
      using T = std::remove_reference_t<decltype(*region)>;
      region = base != nullptr ? reinterpret_cast<T*>(at + bytes) : nullptr;
      bytes += (static_cast<std::size_t>(elements) * sizeof(T) + 255) / 256 * 256;
    };
    take(logits, tokens * c.experts);
    take(route_weights, pairs);
    take(ids, pairs);
    take(slot_ids, rows);
    take(counts, experts);
    take(offsets, experts + 1);
    take(row_of_pair, rows);
    take(token_of_row, rows);
    take(weight_of_row, rows);
    take(a, rows * h_cols);
    take(gate_up, pairs * 2 * i_cols);
    take(h, rows * i_cols);
    take(expert_out, rows * h_cols);
    const std::int64_t dense = s > 0 ? tokens : 0;
    take(shared_gate_up, dense * 2 * i_cols);
    take(shared_h, dense * i_cols);
    take(shared_out, dense * h_cols);
    permute_scratch_bytes = std::max(ch05::permute_workspace_bytes({tokens, c.k, c.experts, h_cols}),
                                     ch05::permute_workspace_bytes({tokens, slots, experts, h_cols}));
    grouped_scratch_bytes = std::max(ch08::grouped_gemm_hopper_workspace_bytes({rows, 2 * i_cols, h_cols, experts}),
                                     ch08::grouped_gemm_hopper_workspace_bytes({rows, h_cols, i_cols, experts}));
    unsigned char* scratch = nullptr;
    take(scratch, static_cast<std::int64_t>(permute_scratch_bytes));
    permute_scratch = scratch;
    take(scratch, static_cast<std::int64_t>(grouped_scratch_bytes));
    grouped_scratch = scratch;
  }
};

}  // namespace kc::ch10::detail
