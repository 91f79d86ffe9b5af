// The chapter's benchmark cases (decode_cases.hpp).
#include "decode_cases.hpp"

#include <cstddef>
#include <sstream>
#include <vector>

#include "kc/check.hpp"
#include "kc/random.hpp"
#include "moe_gating.hpp"  // Chapter 4: the DeepSeek-V3 routing reference

namespace kc::ch09 {

ch05::GroupedCase routed_decode_case(std::int64_t tokens, std::uint64_t seed) {
  if (tokens < 1) throw InvalidArgument("tokens must be at least 1");
  ch04::GatingParams params;
  params.num_tokens = tokens;
  params.num_experts = 256;
  params.k = 8;
  params.scoring = ch04::Scoring::deepseek_v3;
  params.n_group = 8;
  params.topk_group = 4;
  params.routed_scaling_factor = 2.5f;
  std::vector<double> logits(static_cast<std::size_t>(tokens) * params.num_experts);
  fill_uniform(std::span<double>(logits), seed, -4.0, 4.0);
  ch05::GroupedCase cs;
  cs.sizes = ch04::gating_reference(params, logits).counts;
  std::ostringstream label;
  label << "dsv3_decode_T" << tokens << "_E256_k8_N4096_K7168";
  cs.label = label.str();
  cs.shape = {tokens * params.k, 4096, 7168, params.num_experts};
  return cs;
}

std::vector<ch05::GroupedCase> decode_benchmark_cases() {
  std::vector<ch05::GroupedCase> cases;
  for (int rows : {1, 2, 4, 8, 16, 32, 64, 128, 256}) cases.push_back(ch05::uniform_case(32, rows, 4096, 7168));
  for (int tokens : {1, 8, 32, 128}) cases.push_back(routed_decode_case(tokens));
  for (int rows : {1, 4, 16, 64}) cases.push_back(ch05::uniform_case(8, rows, 28672, 4096));
  for (int rows : {1, 4, 16}) cases.push_back(ch05::uniform_case(128, rows, 1536, 2048));
  return cases;
}

}  // namespace kc::ch09
