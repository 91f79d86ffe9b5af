// Argument checks shared by the chapter's launch functions and its reference. Host code only, so the
// CPU tests exercise every rule without a GPU.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>

#include "kc/check.hpp"
#include "kc/validate.hpp"
#include "moe_gating.hpp"

namespace kc::ch04 {

namespace {
std::string str(std::int64_t v) { return std::to_string(v); }

// The rules on the parameters alone (the reference checks these too; it has no device pointers).
void validate_params(const GatingParams& p) {
  if (p.num_tokens < 0) throw InvalidArgument("num_tokens (" + str(p.num_tokens) + ") must be >= 0");
  if (p.num_experts < 1) throw InvalidArgument("num_experts (" + str(p.num_experts) + ") must be >= 1");
  if (p.num_experts > kMaxExperts) {
    throw InvalidArgument("num_experts (" + str(p.num_experts) + ") must be <= " + str(kMaxExperts));
  }
  if (p.k < 1) throw InvalidArgument("k (" + str(p.k) + ") must be >= 1");
  if (p.k > p.num_experts) {
    throw InvalidArgument("k (" + str(p.k) + ") must be <= num_experts (" + str(p.num_experts) + ")");
  }
  if (p.k > kMaxK) throw InvalidArgument("k (" + str(p.k) + ") must be <= " + str(kMaxK));
  if (p.scoring != Scoring::softmax_then_topk && p.scoring != Scoring::topk_then_softmax &&
      p.scoring != Scoring::deepseek_v3) {
    throw InvalidArgument("scoring (" + str(static_cast<int>(p.scoring)) + ") must be a Scoring value");
  }
  if (p.scoring != Scoring::deepseek_v3) return;
  if (p.n_group < 1 || p.n_group > kMaxGroups) {
    throw InvalidArgument("n_group (" + str(p.n_group) + ") must be in [1, " + str(kMaxGroups) + "]");
  }
  if (p.num_experts % p.n_group != 0) {
    throw InvalidArgument("num_experts (" + str(p.num_experts) + ") must be divisible by n_group (" + str(p.n_group) +
                          ")");
  }
  if (p.topk_group < 1) throw InvalidArgument("topk_group (" + str(p.topk_group) + ") must be >= 1");
  if (p.topk_group > p.n_group) {
    throw InvalidArgument("topk_group (" + str(p.topk_group) + ") must be <= n_group (" + str(p.n_group) + ")");
  }
  const int in_kept_groups = p.topk_group * (p.num_experts / p.n_group);
  if (p.k > in_kept_groups) {
    throw InvalidArgument("k (" + str(p.k) + ") must be <= topk_group * experts per group (" + str(in_kept_groups) +
                          ")");
  }
  if (!std::isfinite(p.routed_scaling_factor) || p.routed_scaling_factor <= 0.0f) {
    throw InvalidArgument("routed_scaling_factor (" + std::to_string(p.routed_scaling_factor) +
                          ") must be finite and > 0");
  }
}
}  // namespace

void validate_gating(const GatingParams& params, const void* logits, const float* correction_bias,
                     const GatingOutputs& out, std::size_t logits_element_bytes) {
  validate_params(params);
  if (correction_bias != nullptr && params.scoring != Scoring::deepseek_v3) {
    throw InvalidArgument("correction_bias must be null unless scoring is deepseek_v3");
  }
  if (params.num_tokens == 0) return;
  if (logits == nullptr) throw InvalidArgument("logits must not be null when num_tokens > 0");
  if (out.weights == nullptr) throw InvalidArgument("out.weights must not be null when num_tokens > 0");
  if (out.ids == nullptr) throw InvalidArgument("out.ids must not be null when num_tokens > 0");
  // The outputs must not overlap each other or the inputs: the kernels read logits and bias while
  // other blocks write the outputs. Empty ranges overlap nothing (kc::overlaps).
  const auto tk = static_cast<std::uint64_t>(params.num_tokens) * static_cast<std::uint64_t>(params.k);
  const auto e = static_cast<std::uint64_t>(params.num_experts);
  const struct {
    const char* name;
    const void* p;
    std::uint64_t bytes;
  } ranges[] = {{"logits", logits, static_cast<std::uint64_t>(params.num_tokens) * e * logits_element_bytes},
                {"correction_bias", correction_bias, correction_bias != nullptr ? e * sizeof(float) : 0},
                {"out.weights", out.weights, tk * sizeof(float)},
                {"out.ids", out.ids, tk * sizeof(std::int32_t)},
                {"out.counts", out.counts, out.counts != nullptr ? e * sizeof(std::int32_t) : 0}};
  for (std::size_t i = 0; i < std::size(ranges); ++i) {
    for (std::size_t j = std::max<std::size_t>(i + 1, 2); j < std::size(ranges); ++j) {  // the inputs may share
      if (ranges[i].p != nullptr && ranges[j].p != nullptr &&
          overlaps(ranges[i].p, ranges[i].bytes, ranges[j].p, ranges[j].bytes)) {
        throw InvalidArgument(std::string(ranges[i].name) + " and " + ranges[j].name + " must not overlap");
      }
    }
  }
}

// Exposed to the reference (same translation unit family, declared where used).
void validate_gating_params(const GatingParams& params) { validate_params(params); }

bool gating_rows_fit_int32(const GatingParams& params) {
  return params.num_experts > 0 && params.num_tokens <= (std::int64_t{1} << 30) / params.num_experts;
}

}  // namespace kc::ch04
