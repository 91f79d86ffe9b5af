// fp64 references of the chapter: the activations from <cmath>'s erf and tanh, and the layer built
// on kc::ref::matmul_nt. Straightforward on purpose: these are what the kernels are judged against.
#include "kc/reference.hpp"

#include <cmath>
#include <cstddef>
#include <string>

#include "fused_epilogue.hpp"
#include "kc/check.hpp"

namespace kc::ch03 {

double activate_reference(double x, Activation activation) {
  switch (activation) {
    case Activation::none: return x;
    case Activation::relu: return x < 0.0 ? 0.0 : x;
    case Activation::gelu_erf: return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case Activation::gelu_tanh: {
      const double pi = 3.14159265358979323846;
      return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / pi) * (x + 0.044715 * x * x * x)));
    }
    case Activation::silu: return x / (1.0 + std::exp(-x));
  }
  throw InvalidArgument("activation (" + std::to_string(static_cast<int>(activation)) + ") is not an Activation");
}

std::vector<double> linear_reference(std::span<const double> a, std::span<const double> w, std::span<const double> bias,
                                     std::span<const double> residual, Activation activation, std::int64_t m,
                                     std::int64_t n, std::int64_t k) {
  const auto um = static_cast<std::size_t>(m), un = static_cast<std::size_t>(n), uk = static_cast<std::size_t>(k);
  if (a.size() != um * uk || w.size() != un * uk) throw InvalidArgument("a and w must hold m*k and n*k elements");
  if (!bias.empty() && bias.size() != un) throw InvalidArgument("bias must be empty or hold n elements");
  if (!residual.empty() && residual.size() != um * un) throw InvalidArgument("residual must be empty or hold m*n");
  std::vector<double> out = ref::matmul_nt(a, w, um, un, uk);
  for (std::size_t i = 0; i < out.size(); ++i) {
    double v = out[i] + (bias.empty() ? 0.0 : bias[i % un]);
    v = activate_reference(v, activation);
    out[i] = v + (residual.empty() ? 0.0 : residual[i]);
  }
  return out;
}

std::vector<double> swiglu_reference(std::span<const double> a, std::span<const double> w_gate,
                                     std::span<const double> w_up, std::span<const double> b_gate,
                                     std::span<const double> b_up, std::int64_t m, std::int64_t i, std::int64_t k) {
  const std::vector<double> gate = linear_reference(a, w_gate, b_gate, {}, Activation::silu, m, i, k);
  const std::vector<double> up = linear_reference(a, w_up, b_up, {}, Activation::none, m, i, k);
  std::vector<double> out(gate.size());
  for (std::size_t e = 0; e < out.size(); ++e) out[e] = gate[e] * up[e];
  return out;
}

}  // namespace kc::ch03
