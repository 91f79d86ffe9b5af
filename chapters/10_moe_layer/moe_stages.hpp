/// @file moe_stages.hpp
/// @brief Internal: the layer's stages. Each variant (before, a step) enqueues its launches stage by
/// stage; the benchmark's breakdown runs one stage alone (after a whole run has filled the workspace
/// every stage reads) to time it. Also the stages every variant shares (the router and the routing,
/// the shared experts run dense) and the two small kernels of the fused steps (the shared experts'
/// slots, the routing weight of each permuted row).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <string_view>

#include "moe_layer.hpp"
#include "moe_workspace.hpp"

namespace kc::ch10::detail {

/// The stages of the layer, in order: the router GEMM, the routing, the permutation (with the fused
/// steps' shared slots and row weights), up, SiLU · up (before only), down, the combine, and the
/// shared experts run dense (before, steps 1 to 3).
inline constexpr std::array<std::string_view, 8> kStages{"router", "routing", "permute", "up",
                                                         "swiglu", "down",    "combine", "shared"};

/// moe_layer_before's launches, after its validation: all of them, or only stage @p only's.
void enqueue_before(const MoeConfig& config, std::int64_t tokens, const __nv_bfloat16* x, const MoeWeights& weights,
                    __nv_bfloat16* y, const MoeWorkspace& at, cudaStream_t stream, std::string_view only = {});

/// The fusions a variant of the layer runs (moe_layer.hpp's MoeStep describes each).
struct Fusions {
  bool swiglu_epilogue = false;   ///< SiLU · up in up's epilogue
  bool weight_in_down = false;    ///< the routing weight in down's epilogue, combine_rows
  bool shared_as_expert = false;  ///< the shared experts routed as experts E ..
  bool gather = false;            ///< up gathers its rows from x: no copies (step 5)
  bool router_decode = false;     ///< router_logits_decode up to kRouterDecodeTokens tokens (after)
};

/// The fusions of @p step: its own and every earlier step's.
Fusions fusions_of(MoeStep step);

/// The fusions of `after`: step 4's, and the router's decode kernel.
Fusions after_fusions();

/// The launches of the fused layer, after the layer's validation: all of them, or only stage
/// @p only's.
void enqueue_fused(const Fusions& fusions, const MoeConfig& config, std::int64_t tokens, const __nv_bfloat16* x,
                   const MoeWeights& weights, __nv_bfloat16* y, const MoeWorkspace& at, cudaStream_t stream,
                   std::string_view only = {});

/// The router GEMM (logits [T, E] = x · routerᵀ, bf16: Chapter 7's GEMM, or router_logits_decode
/// when @p decode_router and T <= kRouterDecodeTokens) and the routing on those logits (Chapter 4:
/// at.route_weights and at.ids, [T, k]); only one of the two when @p only names it.
void route(const MoeConfig& config, std::int64_t tokens, const __nv_bfloat16* x, const MoeWeights& weights,
           const MoeWorkspace& at, cudaStream_t stream, std::string_view only = {}, bool decode_router = false);

/// Tokens up to which `after`'s router runs router_logits_decode rather than Chapter 7's GEMM.
inline constexpr int kRouterDecodeTokens = 8;

/// logits[t, e] = x[t] · router[e] in fp32, rounded to bf16, for 1 <= T <= kRouterDecodeTokens: a
/// block per router row, its 16-byte pieces spread over the block's threads, one fp32 sum per token,
/// the block's sum in a fixed order (router_decode.cu). Throws kc::InvalidArgument for T outside
/// that range; the layer's rules (hidden a multiple of 8, x and router 16-byte aligned) hold.
void router_logits_decode(std::int64_t tokens, int experts, std::int64_t hidden, const __nv_bfloat16* x,
                          const __nv_bfloat16* router, __nv_bfloat16* logits, cudaStream_t stream);

/// Each shared expert s < S on every token, dense: up (Chapter 7's GEMM with expert E + s's [2I, H]),
/// Chapter 3's SiLU · up, down, and Chapter 3's add into y.
void add_dense_shared_experts(const MoeConfig& config, std::int64_t tokens, const __nv_bfloat16* x,
                              const MoeWeights& weights, __nv_bfloat16* y, const MoeWorkspace& at, cudaStream_t stream);

/// slot_ids [T, k + S]: token t's k routed ids, then the shared experts E .. E + S - 1.
void append_shared_slots(std::int64_t tokens, int k, int experts, int shared, const std::int32_t* ids,
                         std::int32_t* slot_ids, cudaStream_t stream);

/// a[r] = x[token_of_row[r]] for every row r below offsets_end[0] (the permutation's offsets[E], read on
/// the device), at most @p max_rows: a grid-stride loop over 16-byte pieces of rows, all SMs at once.
void copy_token_rows(std::int64_t max_rows, std::int64_t hidden, const __nv_bfloat16* x,
                     const std::int32_t* token_of_row, const std::int32_t* offsets_end, __nv_bfloat16* a,
                     cudaStream_t stream);

/// weight_of_row[row_of_pair[t · slots + j]] = the weight of token t's slot j: route_weights[t · k + j]
/// for j < k, 1 for a shared slot (j >= k); pairs with row_of_pair < 0 write nothing.
void scatter_row_weights(std::int64_t tokens, int k, int slots, const float* route_weights,
                         const std::int32_t* row_of_pair, float* weight_of_row, cudaStream_t stream);

}  // namespace kc::ch10::detail
