/// @file moe_stages.hpp
/// @brief Internal: the stages every variant of the layer shares (the router and the routing, the
/// shared experts run dense) and the two small kernels of the fused steps (the shared experts' slots,
/// the routing weight of each permuted row).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "moe_layer.hpp"
#include "moe_workspace.hpp"

namespace kc::ch10::detail {

/// The router GEMM (Chapter 7: logits [T, E] = x · routerᵀ, bf16) and the routing on those logits
/// (Chapter 4: at.route_weights and at.ids, [T, k]).
void route(const MoeConfig& config, std::int64_t tokens, const __nv_bfloat16* x, const MoeWeights& weights,
           const MoeWorkspace& at, cudaStream_t stream);

/// Each shared expert s < S on every token, dense: up (Chapter 7's GEMM with expert E + s's [2I, H]),
/// Chapter 3's SiLU · up, down, and Chapter 3's add into y.
void add_dense_shared_experts(const MoeConfig& config, std::int64_t tokens, const __nv_bfloat16* x,
                              const MoeWeights& weights, __nv_bfloat16* y, const MoeWorkspace& at, cudaStream_t stream);

/// slot_ids [T, k + S]: token t's k routed ids, then the shared experts E .. E + S - 1.
void append_shared_slots(std::int64_t tokens, int k, int experts, int shared, const std::int32_t* ids,
                         std::int32_t* slot_ids, cudaStream_t stream);

/// weight_of_row[row_of_pair[t · slots + j]] = the weight of token t's slot j: route_weights[t · k + j]
/// for j < k, 1 for a shared slot (j >= k); pairs with row_of_pair < 0 write nothing.
void scatter_row_weights(std::int64_t tokens, int k, int slots, const float* route_weights,
                         const std::int32_t* row_of_pair, float* weight_of_row, cudaStream_t stream);

}  // namespace kc::ch10::detail
