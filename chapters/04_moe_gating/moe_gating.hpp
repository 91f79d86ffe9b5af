/// @file moe_gating.hpp
/// @brief Chapter 4: the MoE router. Router logits [T, E] in, the k chosen experts of every token out:
/// weights [T, k] (fp32), expert ids [T, k] (int32) and per-expert token counts [E] (int32).
///
/// Semantics shared by every path (the fp64 reference, the three-kernel "before" and the fused "after"):
/// - Softmax routings rank experts by logit, largest first; equal logits put the lower expert id
///   first. Softmax is increasing, so this is the order of the probabilities, but ranking the
///   logits is exact whatever the rounding: probabilities that underflow to 0 (logits of ±1e4) still
///   rank by logit, never by id. Each output row is in that order, so its weights never increase.
/// - DeepSeek-V3 selects by sigmoid(logit) + bias within the kept groups; each output row is sorted
///   by weight (the unbiased score), largest first, equal weights by lower id.
/// - NaN ranks below every number (below −Inf) and weighs 0. A +Inf logit wins: the +Inf logits
///   share the probability mass equally and every other expert gets 0. A row with no logit above −Inf
///   (all −Inf and/or NaN) gets weights 0 (its ids are still the k best by the rules above).
///   Finite logits never give a NaN weight.
/// - Counts, when out.counts is not null, are always overwritten: counts[e] = the number of
///   (token, slot) pairs that chose expert e. With T = 0 no kernel runs and the E counts are zeroed
///   by a cudaMemsetAsync on the stream.
/// - No output may overlap another argument. Nothing is allocated or synchronised on the launch
///   path, so it can be captured in a CUDA graph; bad arguments throw kc::InvalidArgument before
///   anything is launched.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace kc::ch04 {

/// Largest number of experts a router may have.
inline constexpr int kMaxExperts = 512;
/// Largest k (experts chosen per token).
inline constexpr int kMaxK = 32;
/// Largest number of expert groups (DeepSeek-V3 routing).
inline constexpr int kMaxGroups = 32;

/// How a router turns logits into a choice of experts and their weights.
enum class Scoring {
  /// softmax over all E logits, then the k largest probabilities (Mixtral, Qwen3-MoE). With
  /// GatingParams::renormalize the k weights are divided by their sum.
  softmax_then_topk,
  /// the k largest logits, then a softmax over those k: the same experts and the same weights as
  /// softmax_then_topk with renormalisation, without exponentiating the other E − k logits.
  topk_then_softmax,
  /// DeepSeek-V3: score = sigmoid(logit); selection uses score + correction_bias; experts form
  /// n_group equal groups ranked by the sum of their top-2 biased scores (top-1 when a group has one
  /// expert); only the best topk_group groups compete; weights are the unbiased scores of the chosen
  /// experts divided by their sum, times routed_scaling_factor.
  deepseek_v3,
};

/// The shape and routing options of one gating call.
struct GatingParams {
  std::int64_t num_tokens = 0;                   ///< T, rows of logits (>= 0)
  int num_experts = 0;                           ///< E, columns of logits, in [1, kMaxExperts]
  int k = 0;                                     ///< experts per token, in [1, min(E, kMaxK)]
  Scoring scoring = Scoring::softmax_then_topk;  ///< the routing function
  bool renormalize = false;                      ///< softmax_then_topk: divide the k weights by their sum
  int n_group = 1;                               ///< deepseek_v3: number of expert groups (divides E)
  int topk_group = 1;                            ///< deepseek_v3: groups kept per token (<= n_group)
  float routed_scaling_factor = 1.0f;            ///< deepseek_v3: factor applied to the final weights
};

/// Where a gating call writes. weights and ids are [T, k] row-major; counts is [E] or null
/// (null: do not count).
struct GatingOutputs {
  float* weights = nullptr;        ///< [T, k] routing weights
  std::int32_t* ids = nullptr;     ///< [T, k] expert ids
  std::int32_t* counts = nullptr;  ///< [E] tokens per expert, or null
};

/// How the fused path counts tokens per expert.
enum class CountMode {
  fused_atomics,    ///< in the gating kernel: a shared-memory histogram per block, flushed with E atomics
  separate_kernel,  ///< a second tiny kernel that reads the ids back and counts them the same way
  automatic,        ///< the launch picks fused_atomics (on sm_90, for E > 128, the blocks of a cluster
                    ///< sum their histograms first), measured faster than separate_kernel at every case
};

/// Checks every rule (T >= 0, 1 <= E <= 512, 1 <= k <= min(E, 32), the DeepSeek-V3 group rules,
/// pointers, no overlap between an output and any other argument) and throws kc::InvalidArgument
/// naming the first one broken, e.g. "k (9) must be <= num_experts (8)" or "out.weights and out.ids
/// must not overlap". Host-only, and it reads no pointer; every launch function calls it first.
/// @param params shape and options
/// @param logits the logits [T, E] (fp32 or bf16)
/// @param correction_bias deepseek_v3's bias [E] or null (null = zero bias); must be null otherwise
/// @param out the outputs
/// @param logits_element_bytes bytes of one logit: 4 (fp32) or 2 (bf16)
void validate_gating(const GatingParams& params, const void* logits, const float* correction_bias,
                     const GatingOutputs& out, std::size_t logits_element_bytes = sizeof(float));

/// Bytes of device workspace gating_before() needs for @p params (0 when T = 0).
std::size_t gating_before_workspace_bytes(const GatingParams& params);

/// Before: what frameworks run, three kernels through global memory — a scoring kernel (softmax or
/// sigmoid + bias) writing [T, E] scores, a top-k kernel, and a normalise/count kernel.
/// topk_then_softmax skips the first kernel. @p workspace holds at least
/// gating_before_workspace_bytes(params) bytes (256-byte aligned, as cudaMalloc returns).
/// @param params shape and options
/// @param logits [T, E] fp32 logits
/// @param correction_bias deepseek_v3 only: [E] bias or null
/// @param out outputs
/// @param workspace device scratch, see gating_before_workspace_bytes()
/// @param workspace_bytes its size
/// @param stream the stream to enqueue on
void gating_before(const GatingParams& params, const float* logits, const float* correction_bias,
                   const GatingOutputs& out, void* workspace, std::size_t workspace_bytes,
                   cudaStream_t stream = nullptr);
/// gating_before() for bf16 logits (the probabilities and scores are still fp32).
/// @param params shape and options
/// @param logits [T, E] bf16 logits
/// @param correction_bias deepseek_v3 only: [E] bias or null
/// @param out outputs
/// @param workspace device scratch, see gating_before_workspace_bytes()
/// @param workspace_bytes its size
/// @param stream the stream to enqueue on
/// cudaStream_t)
void gating_before(const GatingParams& params, const __nv_bfloat16* logits, const float* correction_bias,
                   const GatingOutputs& out, void* workspace, std::size_t workspace_bytes,
                   cudaStream_t stream = nullptr);

/// After: one fused kernel. Each row's logits are loaded once (16-byte vectors) into registers,
/// selected with warp-level primitives, normalised in registers and stored once; counts are
/// fused (a shared-memory histogram per block) or counted by a second tiny kernel (@p count_mode;
/// by default the launch picks, CountMode::automatic).
///
/// On sm_90 the kernels launch early, as programmatic dependents of the kernel before them on
/// @p stream: they wait for it before reading the logits or writing any output, but DeepSeek-V3's
/// kernel reads @p correction_bias before that wait, while kernels enqueued before it may still be
/// running. So the bias, a model parameter, may be written by a kernel on @p stream only if an
/// operation that is not a kernel (a copy, a memset, a synchronisation) comes between that kernel
/// and this call.
/// @param params shape and options
/// @param logits [T, E] fp32 logits
/// @param correction_bias deepseek_v3 only: [E] bias or null; read before the wait (see above)
/// @param out outputs
/// @param stream the stream to enqueue on
/// @param count_mode how counts are produced when out.counts is not null
void gating_after(const GatingParams& params, const float* logits, const float* correction_bias,
                  const GatingOutputs& out, cudaStream_t stream = nullptr, CountMode count_mode = CountMode::automatic);
/// gating_after() for bf16 logits (16-byte loads of 8 logits, fp32 math).
/// @param params shape and options
/// @param logits [T, E] bf16 logits
/// @param correction_bias deepseek_v3 only: [E] bias or null; read before the wait (see the fp32 overload)
/// @param out outputs
/// @param stream the stream to enqueue on
/// @param count_mode how counts are produced when out.counts is not null
void gating_after(const GatingParams& params, const __nv_bfloat16* logits, const float* correction_bias,
                  const GatingOutputs& out, cudaStream_t stream = nullptr, CountMode count_mode = CountMode::automatic);

/// True when the lean fused softmax kernels (steps 2 and 3) can run @p params: they count rows and
/// output elements in 32-bit integers, so num_tokens · num_experts must be at most 2^30 (T · k is
/// then smaller too, since k <= E). gating_after() runs step 1's kernel, which counts in 64 bits,
/// otherwise.
/// @param params shape and options (already valid)
bool gating_rows_fit_int32(const GatingParams& params);

/// The fp64 CPU reference's result.
struct GatingReference {
  std::vector<double> weights;       ///< [T, k]
  std::vector<std::int32_t> ids;     ///< [T, k]
  std::vector<std::int32_t> counts;  ///< [E]
};

/// The ground truth, in double on the host, with the semantics described at the top of this file.
/// Throws kc::InvalidArgument on bad @p params or when a span has the wrong length.
/// @param params shape and options
/// @param logits [T, E] logits widened to double
/// @param correction_bias [E] (deepseek_v3) or empty (zero bias)
GatingReference gating_reference(const GatingParams& params, std::span<const double> logits,
                                 std::span<const double> correction_bias = {});

}  // namespace kc::ch04
