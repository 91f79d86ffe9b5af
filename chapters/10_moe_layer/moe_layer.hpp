/// @file moe_layer.hpp
/// @brief Chapter 10: the forward pass of a Mixture-of-Experts block on Hopper, built from the earlier
/// chapters' kernels. bf16 activations and weights, fp32 accumulation:
///
///   x [T, H] → router logits x · W_routerᵀ [T, E] (Chapter 7) → top-k routing (Chapter 4) → the
///   token copies permuted into expert order (Chapter 5) → per expert, up [gate; up] and
///   SiLU(gate) · up (Chapters 8 or 9, then 3) → per expert, down (Chapters 8 or 9) → each token's k
///   outputs weighted and summed back into y [T, H] (Chapter 5's combine), plus the shared expert's
///   output where the model has one (dense: Chapters 7 and 3).
///
/// Layouts (row-major, device): router [E, H]; routed experts W_up [E, 2I, H] (rows 0 .. I-1 the gate
/// projection, I .. 2I-1 the up projection: Chapter 8's SwiGLU halves) and W_down [E, H, I]; the
/// shared expert's up [2 I_s, H] and down [H, I_s]; DeepSeek-V3's correction bias [E] fp32.
///
/// Rules (checked on the host before any CUDA call; kc::InvalidArgument names the broken one):
/// the configuration's (moe_config_rules), T in [0, 2^31 / k), x, y and every weight of the
/// configuration not null when T > 0 and 16-byte aligned, y not overlapping x, a workspace of
/// moe_workspace_bytes(config, T) bytes, 256-byte aligned. Every stage's own rules then hold.
///
/// The launch path neither allocates nor synchronises: every intermediate lives in the workspace, and
/// the routing's group sizes stay on the device (the grouped GEMMs read the offsets there).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "moe_gating.hpp"  // Chapter 4: the routing functions

namespace kc::ch10 {

/// One MoE block's shape and routing.
struct MoeConfig {
  std::string name;               ///< the benchmark label's model part: "dsv3", "mixtral", ...
  std::int64_t hidden = 0;        ///< H, a multiple of 8
  std::int64_t intermediate = 0;  ///< I of each routed expert, a multiple of 8
  int experts = 0;                ///< E, in [1, ch04::kMaxExperts]
  int k = 0;                      ///< experts per token
  ch04::Scoring scoring = ch04::Scoring::softmax_then_topk;  ///< the router's function
  bool renormalize = false;                                  ///< softmax_then_topk: weights divided by their sum
  int n_group = 1;                                           ///< deepseek_v3: expert groups
  int topk_group = 1;                                        ///< deepseek_v3: groups kept per token
  float routed_scaling_factor = 1.0f;                        ///< deepseek_v3: factor on the final weights
  std::int64_t shared_intermediate = 0;                      ///< I_s of the shared expert; 0: none
};

/// DeepSeek-V3: H 7168, I 2048, 256 experts, top-8 grouped sigmoid routing (8 groups, the best 4 kept,
/// correction bias, scale 2.5), one shared expert of I_s 2048.
MoeConfig deepseek_v3();
/// Mixtral 8×7B: H 4096, I 14336, 8 experts, top-2 of a softmax renormalised (the same weights as a
/// softmax over the two chosen logits).
MoeConfig mixtral_8x7b();
/// Qwen3-30B-A3B: H 2048, I 768, 128 experts, top-8 of a softmax, renormalised.
MoeConfig qwen3_30b_a3b();

/// Checks @p config: H and I (and I_s when not 0) multiples of 8 in [8, 2^31 - 1], the routing's
/// parameters valid for Chapter 4 (E, k, groups). Throws kc::InvalidArgument naming the first rule
/// broken. Host-only.
void moe_config_rules(const MoeConfig& config);

/// Chapter 4's parameters for @p tokens tokens of @p config.
ch04::GatingParams gating_params(const MoeConfig& config, std::int64_t tokens);

/// The layer's weights on the device (see the file's description for the layouts).
struct MoeWeights {
  const __nv_bfloat16* router = nullptr;       ///< [E, H]
  const float* correction_bias = nullptr;      ///< [E], deepseek_v3 only (null: zero bias)
  const __nv_bfloat16* up = nullptr;           ///< [E, 2I, H]
  const __nv_bfloat16* down = nullptr;         ///< [E, H, I]
  const __nv_bfloat16* shared_up = nullptr;    ///< [2 I_s, H], when the model has a shared expert
  const __nv_bfloat16* shared_down = nullptr;  ///< [H, I_s], when the model has a shared expert
};

// ------------------------------------------------------------------------------- the two numbers

/// The fewest bytes of one forward pass: x read and y written once, the router (and DeepSeek-V3's
/// correction bias) and the shared expert once, and every routed expert with at least one token
/// (@p counts, [E]) once. Throws kc::InvalidArgument unless @p counts holds E sizes.
/// @param config the layer
/// @param tokens T
/// @param counts [E] tokens per expert (the routing's)
double moe_min_bytes(const MoeConfig& config, std::int64_t tokens, std::span<const std::int32_t> counts);

/// FLOPs of one forward pass: 2 · T · H · E for the router, 2 · T · k · (2I · H + H · I) for the routed
/// experts and 2 · T · (2 I_s · H + H · I_s) for the shared one (the routing and the combine are
/// negligible and not counted).
double moe_flops(const MoeConfig& config, std::int64_t tokens);

// -------------------------------------------------------------------------------------- before

/// Bytes of device workspace moe_layer_before needs for @p tokens tokens (every intermediate, each
/// 256-byte aligned).
std::size_t moe_workspace_bytes(const MoeConfig& config, std::int64_t tokens);

/// Checks every rule of this file's description; throws kc::InvalidArgument naming the first one
/// broken. Host-only.
void validate_moe_layer(const MoeConfig& config, std::int64_t tokens, const __nv_bfloat16* x, const MoeWeights& weights,
                        const __nv_bfloat16* y, const void* workspace, std::size_t workspace_bytes);

/// Before: the chain of the earlier chapters' kernels, one launch (or a few) per stage, every
/// intermediate in the workspace: the router GEMM, the routing, the permutation, the up projection
/// (plain), SiLU · up, the down projection (plain), the weighted combine, and the shared expert (up,
/// SiLU · up, down, added to y).
/// @param config the layer
/// @param tokens T
/// @param x [T, H] tokens
/// @param weights the layer's weights
/// @param y [T, H] output
/// @param workspace device scratch of moe_workspace_bytes(config, tokens), 256-byte aligned
/// @param workspace_bytes its size
/// @param stream the stream to enqueue on
void moe_layer_before(const MoeConfig& config, std::int64_t tokens, const __nv_bfloat16* x, const MoeWeights& weights,
                      __nv_bfloat16* y, void* workspace, std::size_t workspace_bytes, cudaStream_t stream = nullptr);

/// Where moe_layer_before keeps the routing in its workspace, for tests that compare it: weights
/// [T, k] fp32 and ids [T, k] int32.
struct MoeRoutingView {
  const float* weights = nullptr;        ///< [T, k]
  const std::int32_t* ids = nullptr;     ///< [T, k]
  const std::int32_t* counts = nullptr;  ///< [E]
};

/// The routing inside @p workspace after moe_layer_before (same config and tokens).
MoeRoutingView moe_routing_in(const MoeConfig& config, std::int64_t tokens, const void* workspace);

// ------------------------------------------------------------------------------- fp64 references

/// Router logits in double from the bf16 inputs: logits[t, e] = x[t] · router[e].
/// @param x [T, H]
/// @param router [E, H]
/// @param hidden H
std::vector<double> logits_reference(std::span<const __nv_bfloat16> x, std::span<const __nv_bfloat16> router,
                                     std::int64_t hidden);

/// One expert's output for one token in double: down · (silu(gate · x) ⊙ (up · x)).
/// @param x_row [H] the token
/// @param up [2I, H] the expert's gate rows, then its up rows
/// @param down [H, I]
/// @param intermediate I
std::vector<double> expert_reference(std::span<const __nv_bfloat16> x_row, std::span<const __nv_bfloat16> up,
                                     std::span<const __nv_bfloat16> down, std::int64_t intermediate);

}  // namespace kc::ch10
