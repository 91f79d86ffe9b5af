/// @file moe_layer.hpp
/// @brief Chapter 10: the forward pass of a Mixture-of-Experts block on Hopper, built from the earlier
/// chapters' kernels. bf16 activations and weights, fp32 accumulation:
///
///   x [T, H] → router logits x · W_routerᵀ [T, E] (Chapter 7) → top-k routing (Chapter 4) → the
///   token copies permuted into expert order (Chapter 5) → per expert, up [gate; up] and
///   SiLU(gate) · up (Chapters 8 or 9, then 3) → per expert, down (Chapters 8 or 9) → each token's k
///   outputs weighted and summed back into y [T, H] (Chapter 5's combine), plus the shared experts'
///   outputs where the model has them (every token, weight 1).
///
/// Layouts (row-major, device): router [E, H]; the experts' W_up [E + S, 2I, H] (rows 0 .. I-1 the
/// gate projection, I .. 2I-1 the up projection: Chapter 8's SwiGLU halves) and W_down [E + S, H, I],
/// the E routed experts first, then the model's S shared experts (same size: DeepSeek-V3 has one);
/// DeepSeek-V3's correction bias [E] fp32.
///
/// Rules (checked on the host before any CUDA call; kc::InvalidArgument names the broken one):
/// the configuration's (moe_config_rules), T in [0, 2^31 / (k + S)), x, y and every weight of the
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

/// Shared experts a configuration may have (DeepSeek-V3 has one).
inline constexpr int kMaxSharedExperts = 8;

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
  int shared_experts = 0;  ///< S: experts every token goes through with weight 1, of the routed experts' size
};

/// DeepSeek-V3: H 7168, I 2048, 256 experts, top-8 grouped sigmoid routing (8 groups, the best 4 kept,
/// correction bias, scale 2.5), one shared expert.
MoeConfig deepseek_v3();
/// Mixtral 8×7B: H 4096, I 14336, 8 experts, top-2 of a softmax renormalised (the same weights as a
/// softmax over the two chosen logits).
MoeConfig mixtral_8x7b();
/// Qwen3-30B-A3B: H 2048, I 768, 128 experts, top-8 of a softmax, renormalised.
MoeConfig qwen3_30b_a3b();

/// Checks @p config: H and I multiples of 8 in [8, 2^31 - 1], S in [0, 8], the routing's parameters
/// valid for Chapter 4 (E, k, groups) and E + S at most Chapter 5's kMaxExperts. Throws kc::InvalidArgument naming the
/// first rule broken. Host-only.
void moe_config_rules(const MoeConfig& config);

/// Chapter 4's parameters for @p tokens tokens of @p config.
ch04::GatingParams gating_params(const MoeConfig& config, std::int64_t tokens);

/// The layer's weights on the device (see the file's description for the layouts).
struct MoeWeights {
  const __nv_bfloat16* router = nullptr;   ///< [E, H]
  const float* correction_bias = nullptr;  ///< [E], deepseek_v3 only (null: zero bias)
  const __nv_bfloat16* up = nullptr;       ///< [E + S, 2I, H]: the routed experts, then the shared ones
  const __nv_bfloat16* down = nullptr;     ///< [E + S, H, I]: the routed experts, then the shared ones
};

// ------------------------------------------------------------------------------- the two numbers

/// The fewest bytes of one forward pass: x read and y written once, the router (and DeepSeek-V3's
/// correction bias) and the shared experts once, and every routed expert with at least one token
/// (@p counts, [E]) once. Throws kc::InvalidArgument unless @p counts holds E sizes.
/// @param config the layer
/// @param tokens T
/// @param counts [E] tokens per expert (the routing's)
double moe_min_bytes(const MoeConfig& config, std::int64_t tokens, std::span<const std::int32_t> counts);

/// FLOPs of one forward pass: 2 · T · H · E for the router, 2 · T · k · (2I · H + H · I) for the routed
/// experts and 2 · T · S · 3 · I · H for the shared ones (the routing and the combine are negligible
/// and not counted).
double moe_flops(const MoeConfig& config, std::int64_t tokens);

// -------------------------------------------------------------------------------------- before

/// Bytes of device workspace moe_layer_before, moe_layer_after and every step need for @p tokens tokens
/// (every intermediate, each 256-byte aligned).
std::size_t moe_workspace_bytes(const MoeConfig& config, std::int64_t tokens);

/// Checks every rule of this file's description; throws kc::InvalidArgument naming the first one
/// broken. Host-only.
void validate_moe_layer(const MoeConfig& config, std::int64_t tokens, const __nv_bfloat16* x, const MoeWeights& weights,
                        const __nv_bfloat16* y, const void* workspace, std::size_t workspace_bytes);

/// Before: the chain of the earlier chapters' kernels, one launch (or a few) per stage, every
/// intermediate in the workspace: the router GEMM, the routing, the permutation, the up projection
/// (plain), SiLU · up, the down projection (plain), the weighted combine, and each shared expert
/// (dense up, SiLU · up, down, added to y).
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

// --------------------------------------------------------------------------------- the steps, after

/// The fusions of the chapter, each a step on the one before:
///   1. row_parallel_copy: the permutation writes its index maps only, and the token copies are one
///                        row-parallel kernel (copy_token_rows): every SM copies, not one warp per
///                        256 pairs.
///   2. swiglu_epilogue:  SiLU(gate) · up in the up projection's epilogue (Chapter 8's swiglu): the
///                        [rows, 2I] intermediate and the elementwise pass are gone.
///   3. weight_in_down:   the routing weight applied in the down projection's epilogue (row_scale, one
///                        weight per permuted row), and the combine an unweighted sum (combine_rows).
///   4. shared_as_expert: the shared experts as experts E .. E + S - 1 of the grouped GEMMs, every
///                        token routed to them with weight 1: their tiles run in the same launches as
///                        the routed experts', and the combine adds them (no dense GEMMs, no extra add).
///   5. gather_in_up:     the up projection loads its token rows from x through the permutation's
///                        token_of_row (one-row TMA boxes), in both of Chapter 9's dispatch's kernels:
///                        no copies at all. At best level with step 4 (decode), and slower the more
///                        rows a tile has: `after` leaves it out.
/// `after` is step 4 with the router's decode kernel: at T <= 8 tokens the router logits come from
/// a kernel of a block per router row, not from Chapter 7's GEMM, whose one tile walks all of K alone.
enum class MoeStep {
  row_parallel_copy,  ///< step 1
  swiglu_epilogue,    ///< step 2
  weight_in_down,     ///< step 3
  shared_as_expert,   ///< step 4
  gather_in_up,       ///< step 5
};

/// Every step, in order.
inline constexpr MoeStep kMoeSteps[] = {MoeStep::row_parallel_copy, MoeStep::swiglu_epilogue, MoeStep::weight_in_down,
                                        MoeStep::shared_as_expert, MoeStep::gather_in_up};

/// The benchmark variant name of @p step: "step1_row_parallel_copy", "step2_swiglu_epilogue",
/// "step3_weight_in_down", "step4_shared_as_expert", "step5_gather_in_up". Throws kc::InvalidArgument
/// for a value that is not a MoeStep.
const char* to_string(MoeStep step);

/// The layer with the fusions up to @p step (same arguments and rules as moe_layer_before).
/// @param step the step
/// @param config the layer
/// @param tokens T
/// @param x [T, H] tokens
/// @param weights the layer's weights
/// @param y [T, H] output
/// @param workspace device scratch of moe_workspace_bytes(config, tokens), 256-byte aligned
/// @param workspace_bytes its size
/// @param stream the stream to enqueue on
void moe_layer_step(MoeStep step, const MoeConfig& config, std::int64_t tokens, const __nv_bfloat16* x,
                    const MoeWeights& weights, __nv_bfloat16* y, void* workspace, std::size_t workspace_bytes,
                    cudaStream_t stream = nullptr);

/// After: every fusion that pays. Per launch: the router (its decode kernel up to 8 tokens, Chapter
/// 7's GEMM above), the routing, the shared slots, the permutation's index maps and the row weights,
/// the row-parallel token copies, up with SwiGLU in its epilogue, down with the row weights (each
/// grouped GEMM Chapter 9's dispatch) and the combine.
/// @param config the layer
/// @param tokens T
/// @param x [T, H] tokens
/// @param weights the layer's weights
/// @param y [T, H] output
/// @param workspace device scratch of moe_workspace_bytes(config, tokens), 256-byte aligned
/// @param workspace_bytes its size
/// @param stream the stream to enqueue on
void moe_layer_after(const MoeConfig& config, std::int64_t tokens, const __nv_bfloat16* x, const MoeWeights& weights,
                     __nv_bfloat16* y, void* workspace, std::size_t workspace_bytes, cudaStream_t stream = nullptr);

/// Slots a token's combine may sum: k (at most 32) and the shared experts.
inline constexpr int kMaxCombineSlots = 32 + kMaxSharedExperts;

/// Checks combine_rows' rules: T in [0, 2^31 - 1], slots in [1, kMaxCombineSlots], T · slots at most
/// 2^31 - 1, hidden a multiple of 8 in [8, 2^31 - 1]; when T > 0, rows, row_of_pair and y not null,
/// rows and y 16-byte aligned, y overlapping neither rows ([T · slots, H]) nor row_of_pair. Throws
/// kc::InvalidArgument naming the first rule broken. Host-only.
void validate_combine_rows(std::int64_t tokens, int slots, std::int64_t hidden, const __nv_bfloat16* rows,
                           const std::int32_t* row_of_pair, const __nv_bfloat16* y);

/// The combine of the fused steps: y[t] = Σ_j rows[row_of_pair[t · slots + j]], j = 0 .. slots - 1 in
/// order, in fp32, rounded once to bf16 (sum_slot_rows in combine_slots.hpp); a negative row adds
/// nothing. The rows carry their routing weights already (the down projection's row_scale epilogue):
/// no weights here. Deterministic: no atomics, the same bits on every run.
/// @param tokens T
/// @param slots rows per token (k, plus S when the shared experts are routed)
/// @param hidden H, columns of rows and y
/// @param rows [T · slots, H] the permuted expert outputs
/// @param row_of_pair [T, slots] where each (token, slot) went (Chapter 5's permutation)
/// @param y [T, H] output
/// @param stream the stream to enqueue on
void combine_rows(std::int64_t tokens, int slots, std::int64_t hidden, const __nv_bfloat16* rows,
                  const std::int32_t* row_of_pair, __nv_bfloat16* y, cudaStream_t stream = nullptr);

/// Where the layer (before, any step, after) keeps the routing in its workspace, for tests that
/// compare it: weights [T, k] fp32, ids [T, k] int32 and the routed experts' counts [E].
struct MoeRoutingView {
  const float* weights = nullptr;        ///< [T, k]
  const std::int32_t* ids = nullptr;     ///< [T, k]
  const std::int32_t* counts = nullptr;  ///< [E]
};

/// The routing inside @p workspace after a launch of the layer (same config and tokens).
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
