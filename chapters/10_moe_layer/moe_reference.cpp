// Chapter 10's fp64 references: the router logits and one expert's output for one token, in double
// from the bf16 inputs. A token's layer output is then the routing's weighted sum of its experts'
// outputs (the tests compose it with Chapter 4's routing reference), plus the shared expert's.
#include <cmath>
#include <string>

#include "kc/check.hpp"
#include "kc/compare.hpp"
#include "moe_layer.hpp"

namespace kc::ch10 {

namespace {

double dot(const __nv_bfloat16* a, const __nv_bfloat16* b, std::int64_t n) {
  double sum = 0.0;
  for (std::int64_t i = 0; i < n; ++i) sum += kc::to_double(a[i]) * kc::to_double(b[i]);
  return sum;
}

}  // namespace

std::vector<double> logits_reference(std::span<const __nv_bfloat16> x, std::span<const __nv_bfloat16> router,
                                     std::int64_t hidden) {
  if (hidden < 1 || x.size() % static_cast<std::size_t>(hidden) != 0 ||
      router.size() % static_cast<std::size_t>(hidden) != 0) {
    throw InvalidArgument("x and router must hold whole rows of hidden (" + std::to_string(hidden) + ") elements");
  }
  const std::size_t tokens = x.size() / static_cast<std::size_t>(hidden);
  const std::size_t experts = router.size() / static_cast<std::size_t>(hidden);
  std::vector<double> logits(tokens * experts);
  for (std::size_t t = 0; t < tokens; ++t) {
    for (std::size_t e = 0; e < experts; ++e) {
      logits[t * experts + e] = dot(x.data() + t * hidden, router.data() + e * hidden, hidden);
    }
  }
  return logits;
}

std::vector<double> expert_reference(std::span<const __nv_bfloat16> x_row, std::span<const __nv_bfloat16> up,
                                     std::span<const __nv_bfloat16> down, std::int64_t intermediate) {
  const auto hidden = static_cast<std::int64_t>(x_row.size());
  if (hidden < 1 || intermediate < 1 || static_cast<std::int64_t>(up.size()) != 2 * intermediate * hidden ||
      static_cast<std::int64_t>(down.size()) != hidden * intermediate) {
    throw InvalidArgument("up must be [2 · intermediate, H] and down [H, intermediate] for x_row of H elements");
  }
  std::vector<double> h(static_cast<std::size_t>(intermediate));
  for (std::int64_t j = 0; j < intermediate; ++j) {
    const double gate = dot(x_row.data(), up.data() + j * hidden, hidden);
    const double lin = dot(x_row.data(), up.data() + (intermediate + j) * hidden, hidden);
    h[static_cast<std::size_t>(j)] = gate / (1.0 + std::exp(-gate)) * lin;
  }
  std::vector<double> out(static_cast<std::size_t>(hidden));
  for (std::int64_t c = 0; c < hidden; ++c) {
    double sum = 0.0;
    for (std::int64_t j = 0; j < intermediate; ++j) {
      sum += kc::to_double(down[static_cast<std::size_t>(c * intermediate + j)]) * h[static_cast<std::size_t>(j)];
    }
    out[static_cast<std::size_t>(c)] = sum;
  }
  return out;
}

}  // namespace kc::ch10
