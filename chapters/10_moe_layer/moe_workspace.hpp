/// @file moe_workspace.hpp
/// @brief Internal: where each intermediate of moe_layer_before lives in its workspace. Every region
/// starts on a 256-byte boundary; a null base gives the layout and its size only.
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
  std::int32_t* counts = nullptr;           ///< [E]
  std::int32_t* offsets = nullptr;          ///< [E + 1]
  std::int32_t* row_of_pair = nullptr;      ///< [T · k]
  std::int32_t* token_of_row = nullptr;     ///< [T · k]
  __nv_bfloat16* a = nullptr;               ///< [T · k, H] the permuted token copies
  __nv_bfloat16* gate_up = nullptr;         ///< [T · k, 2I] the up projection, before SiLU · up
  __nv_bfloat16* h = nullptr;               ///< [T · k, I] SiLU(gate) · up
  __nv_bfloat16* expert_out = nullptr;      ///< [T · k, H] the down projection
  __nv_bfloat16* shared_gate_up = nullptr;  ///< [T, 2 I_s]
  __nv_bfloat16* shared_h = nullptr;        ///< [T, I_s]
  __nv_bfloat16* shared_out = nullptr;      ///< [T, H]
  void* permute_scratch = nullptr;          ///< Chapter 5's permutation workspace
  std::size_t permute_scratch_bytes = 0;    ///< its size
  void* grouped_scratch = nullptr;          ///< Chapter 8's grouped GEMM workspace (up and down)
  std::size_t grouped_scratch_bytes = 0;    ///< its size
  std::size_t bytes = 0;                    ///< the whole workspace

  /// The regions for @p tokens tokens of @p c in the workspace at @p base (null: sizes only).
  MoeWorkspace(const MoeConfig& c, std::int64_t tokens, void* base) {
    const std::int64_t pairs = tokens * c.k;
    const std::int64_t h_cols = c.hidden, i_cols = c.intermediate, s_cols = c.shared_intermediate;
    auto* at = static_cast<unsigned char*>(base);
    auto take = [&](auto*& region, std::int64_t elements) {
      using T = std::remove_reference_t<decltype(*region)>;
      region = base != nullptr ? reinterpret_cast<T*>(at + bytes) : nullptr;
      bytes += (static_cast<std::size_t>(elements) * sizeof(T) + 255) / 256 * 256;
    };
    take(logits, tokens * c.experts);
    take(route_weights, pairs);
    take(ids, pairs);
    take(counts, c.experts);
    take(offsets, c.experts + 1);
    take(row_of_pair, pairs);
    take(token_of_row, pairs);
    take(a, pairs * h_cols);
    take(gate_up, pairs * 2 * i_cols);
    take(h, pairs * i_cols);
    take(expert_out, pairs * h_cols);
    take(shared_gate_up, tokens * 2 * s_cols);
    take(shared_h, tokens * s_cols);
    take(shared_out, s_cols > 0 ? tokens * h_cols : 0);
    permute_scratch_bytes = ch05::permute_workspace_bytes({tokens, c.k, c.experts, h_cols});
    grouped_scratch_bytes = std::max(ch08::grouped_gemm_hopper_workspace_bytes({pairs, 2 * i_cols, h_cols, c.experts}),
                                     ch08::grouped_gemm_hopper_workspace_bytes({pairs, h_cols, i_cols, c.experts}));
    unsigned char* scratch = nullptr;
    take(scratch, static_cast<std::int64_t>(permute_scratch_bytes));
    permute_scratch = scratch;
    take(scratch, static_cast<std::int64_t>(grouped_scratch_bytes));
    grouped_scratch = scratch;
  }
};

}  // namespace kc::ch10::detail
