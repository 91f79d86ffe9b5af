/// @file moe_gating_after.cu
/// @brief gating_after(): validation, then the fused kernel for the routing. Softmax routings run
/// step 3's batched epilogue where it applies (step3_batched_epilogue.cu), else step 2's lean rounds
/// (step2_lean_rounds.cu), or step 1's packed-key kernel when T · E passes 2^30 (its row counters are
/// 64-bit); DeepSeek-V3 runs its grouped kernel (deepseek_v3_grouped_routing.cu). Counts are fused
/// into the gating kernel unless the caller asks for the separate counting kernel.
#include <cstdint>
#include <string>
#include <type_traits>

#include "fused_launch.cuh"
#include "kc/check.hpp"
#include "moe_gating.hpp"

namespace kc::ch04 {

namespace {

using fused::LaunchOn;

// Clusters pay only where the flush is large. A clustered launch of the same grid measured about
// 1.2 to 1.6 us slower at T = 4096 with E = 64 and 128 (2 and 4 lines of counts); at E = 256 (8
// lines, 4096 requests unclustered) it was 1.7 us faster. So only routings with more experts than
// this flush in clusters.
constexpr int kFlushClustersAboveExperts = 128;

template <typename T>
void gating_after_impl(const GatingParams& p, const T* logits, const float* bias, const GatingOutputs& out,
                       cudaStream_t stream, CountMode count_mode) {
  validate_gating(p, logits, bias, out, sizeof(T));
  if (count_mode != CountMode::fused_atomics && count_mode != CountMode::separate_kernel &&
      count_mode != CountMode::automatic) {
    throw InvalidArgument("count_mode (" + std::to_string(static_cast<int>(count_mode)) +
                          ") must be a CountMode value");
  }
  if (p.num_tokens == 0) {
    // No rows: no kernel, but the counts are still written (all zero), as the header promises.
    if (out.counts != nullptr) {
      check(cudaMemsetAsync(out.counts, 0, static_cast<std::size_t>(p.num_experts) * sizeof(std::int32_t), stream));
    }
    return;
  }
  const fused::Gpu gpu = fused::current_gpu();  // asked once a launch
  // Fused counting measured faster than the separate kernel at every benchmark case.
  if (count_mode == CountMode::automatic) count_mode = CountMode::fused_atomics;
  std::int32_t* kernel_counts = count_mode == CountMode::fused_atomics ? out.counts : nullptr;
  // Programmatic dependent launch needs sm_90 (griddepcontrol); older GPUs run the same kernels one
  // after the other.
  const bool early = gpu.sm90_or_later;
  const LaunchOn on{stream, early, early && kernel_counts != nullptr && p.num_experts > kFlushClustersAboveExperts,
                    gpu};
  if (kernel_counts != nullptr) fused::launch_zero_counts(kernel_counts, p.num_experts, on);

  // 16-byte vectors when every row starts 16-byte aligned; otherwise one element per load.
  constexpr int kVector = 16 / sizeof(T);
  const bool vector = p.num_experts % kVector == 0 && reinterpret_cast<std::uintptr_t>(logits) % 16 == 0;
  if (p.scoring == Scoring::deepseek_v3) {
    const fused::DeepSeekArgs a{bias,          out.weights, out.ids,   kernel_counts, p.num_tokens,
                                p.num_experts, p.k,         p.n_group, p.topk_group,  p.routed_scaling_factor};
    vector ? fused::launch_deepseek_v3<T, kVector>(logits, a, on) : fused::launch_deepseek_v3<T, 1>(logits, a, on);
  } else {
    const fused::SoftmaxArgs a{out.weights,
                               out.ids,
                               kernel_counts,
                               p.num_tokens,
                               p.num_experts,
                               p.k,
                               p.scoring == Scoring::softmax_then_topk && !p.renormalize};
    if (!gating_rows_fit_int32(p)) {  // 32-bit row counters would overflow: step 1's kernel
      vector ? fused::launch_packed_keys<T, kVector>(logits, a, on) : fused::launch_packed_keys<T, 1>(logits, a, on);
    } else {
      bool done = false;
      if constexpr (std::is_same_v<T, float>) done = vector && fused::launch_batched_epilogue(logits, a, on);
      if (!done) {
        vector ? fused::launch_lean_rounds<T, kVector>(logits, a, on) : fused::launch_lean_rounds<T, 1>(logits, a, on);
      }
    }
  }
  check_launch();
  if (out.counts != nullptr && count_mode == CountMode::separate_kernel) {
    fused::launch_count_experts(out.ids, p.num_tokens * p.k, p.num_experts, out.counts, on);
  }
}

}  // namespace

void gating_after(const GatingParams& params, const float* logits, const float* correction_bias,
                  const GatingOutputs& out, cudaStream_t stream, CountMode count_mode) {
  gating_after_impl(params, logits, correction_bias, out, stream, count_mode);
}

void gating_after(const GatingParams& params, const __nv_bfloat16* logits, const float* correction_bias,
                  const GatingOutputs& out, cudaStream_t stream, CountMode count_mode) {
  gating_after_impl(params, logits, correction_bias, out, stream, count_mode);
}

}  // namespace kc::ch04
