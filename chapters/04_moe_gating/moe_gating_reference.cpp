// The fp64 CPU reference: the chapter's semantics written as plainly as possible. Every kernel is
// compared with it, so it sorts instead of selecting cleverly, and it states each rule once.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "kc/check.hpp"
#include "moe_gating.hpp"

namespace kc::ch04 {

void validate_gating_params(const GatingParams& params);  // moe_gating_validate.cpp

namespace {

// The ranking rule used for experts and for groups: larger value first; NaN below everything
// (below -Inf); equal values (including -0 == +0 and two NaNs) put the lower id first. It is a
// strict total order, so std::sort gives one answer.
bool ranks_before(double a, int id_a, double b, int id_b) {
  const bool nan_a = std::isnan(a), nan_b = std::isnan(b);
  if (nan_a || nan_b) return nan_a == nan_b ? id_a < id_b : nan_b;
  if (a != b) return a > b;
  return id_a < id_b;
}

// Indices of the k best values of `values` among `allowed`, best first.
std::vector<int> top_k(const std::vector<double>& values, const std::vector<bool>& allowed, int k) {
  std::vector<int> order;
  for (int i = 0; i < static_cast<int>(values.size()); ++i)
    if (allowed[i]) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return ranks_before(values[a], a, values[b], b); });
  order.resize(static_cast<std::size_t>(k));
  return order;
}

// Softmax numerators with the NaN/Inf policy: relative to the largest non-NaN logit m, a finite m
// gives exp(x - m) (NaN -> 0); m = +Inf gives 1 for each +Inf logit and 0 elsewhere; no logit above
// -Inf gives all zeros (the weights are then 0).
std::vector<double> softmax_mass(const double* row, int e) {
  double m = -std::numeric_limits<double>::infinity();
  for (int i = 0; i < e; ++i)
    if (!std::isnan(row[i])) m = std::max(m, row[i]);
  std::vector<double> mass(static_cast<std::size_t>(e), 0.0);
  if (m == -std::numeric_limits<double>::infinity()) return mass;
  for (int i = 0; i < e; ++i) {
    if (std::isnan(row[i])) continue;
    if (std::isinf(m)) {
      mass[i] = row[i] == m ? 1.0 : 0.0;
    } else {
      mass[i] = std::exp(row[i] - m);
    }
  }
  return mass;
}

void route_softmax(const GatingParams& p, const double* row, double* weights, std::int32_t* ids) {
  const int e = p.num_experts;
  const std::vector<double> logits(row, row + e);
  // The ranking of the probabilities is the ranking of the logits: rank the logits (exact).
  const std::vector<int> chosen = top_k(logits, std::vector<bool>(static_cast<std::size_t>(e), true), p.k);
  const std::vector<double> mass = softmax_mass(row, e);
  double denom = 0.0;
  const bool over_k = p.scoring == Scoring::topk_then_softmax || p.renormalize;
  if (over_k) {
    for (int id : chosen) denom += mass[id];
  } else {
    denom = std::accumulate(mass.begin(), mass.end(), 0.0);
  }
  for (int j = 0; j < p.k; ++j) {
    ids[j] = chosen[j];
    weights[j] = denom > 0.0 ? mass[chosen[j]] / denom : 0.0;
  }
}

void route_deepseek_v3(const GatingParams& p, const double* row, std::span<const double> bias, double* weights,
                       std::int32_t* ids) {
  const int e = p.num_experts;
  const int group_size = e / p.n_group;
  std::vector<double> score(static_cast<std::size_t>(e)), choice(static_cast<std::size_t>(e));
  for (int i = 0; i < e; ++i) {
    score[i] = 1.0 / (1.0 + std::exp(-row[i]));  // NaN stays NaN; -Inf -> 0; +Inf -> 1
    choice[i] = score[i] + (bias.empty() ? 0.0 : bias[i]);
  }
  // Group score: the sum of the group's two best biased scores (by the ranking rule; a NaN among
  // them makes the group NaN, which ranks last). A group of one expert scores that expert.
  std::vector<double> group_score(static_cast<std::size_t>(p.n_group));
  for (int g = 0; g < p.n_group; ++g) {
    std::vector<bool> in_group(static_cast<std::size_t>(e), false);
    for (int i = g * group_size; i < (g + 1) * group_size; ++i) in_group[i] = true;
    const std::vector<int> best = top_k(choice, in_group, std::min(2, group_size));
    group_score[g] = 0.0;
    for (int id : best) group_score[g] += choice[id];
  }
  const std::vector<int> kept =
      top_k(group_score, std::vector<bool>(static_cast<std::size_t>(p.n_group), true), p.topk_group);
  // Experts of the other groups are excluded from the selection (not given a zero score).
  std::vector<bool> allowed(static_cast<std::size_t>(e), false);
  for (int g : kept)
    for (int i = g * group_size; i < (g + 1) * group_size; ++i) allowed[i] = true;
  std::vector<int> chosen = top_k(choice, allowed, p.k);
  // Weights: the unbiased scores (a NaN weighs 0), renormalised, scaled; rows sorted by weight.
  std::vector<double> w(static_cast<std::size_t>(e), 0.0);
  double sum = 0.0;
  for (int id : chosen) {
    w[id] = std::isnan(score[id]) ? 0.0 : score[id];
    sum += w[id];
  }
  std::sort(chosen.begin(), chosen.end(), [&](int a, int b) { return ranks_before(w[a], a, w[b], b); });
  for (int j = 0; j < p.k; ++j) {
    ids[j] = chosen[j];
    weights[j] = sum > 0.0 ? w[chosen[j]] / sum * static_cast<double>(p.routed_scaling_factor) : 0.0;
  }
}

}  // namespace

GatingReference gating_reference(const GatingParams& params, std::span<const double> logits,
                                 std::span<const double> correction_bias) {
  validate_gating_params(params);
  const auto t = static_cast<std::size_t>(params.num_tokens);
  const auto e = static_cast<std::size_t>(params.num_experts);
  const auto k = static_cast<std::size_t>(params.k);
  if (logits.size() != t * e) {
    throw InvalidArgument("logits has " + std::to_string(logits.size()) + " elements; num_tokens * num_experts is " +
                          std::to_string(t * e));
  }
  if (!correction_bias.empty() && (params.scoring != Scoring::deepseek_v3 || correction_bias.size() != e)) {
    throw InvalidArgument("correction_bias must be empty or hold num_experts values, and only for deepseek_v3");
  }
  GatingReference ref;
  ref.weights.resize(t * k);
  ref.ids.resize(t * k);
  ref.counts.assign(e, 0);
  for (std::size_t r = 0; r < t; ++r) {
    const double* row = logits.data() + r * e;
    if (params.scoring == Scoring::deepseek_v3) {
      route_deepseek_v3(params, row, correction_bias, ref.weights.data() + r * k, ref.ids.data() + r * k);
    } else {
      route_softmax(params, row, ref.weights.data() + r * k, ref.ids.data() + r * k);
    }
    for (std::size_t j = 0; j < k; ++j) ++ref.counts[static_cast<std::size_t>(ref.ids[r * k + j])];
  }
  return ref;
}

}  // namespace kc::ch04
