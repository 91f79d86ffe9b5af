#include "kc/reference.hpp"

namespace kc::ref {

std::vector<double> round_to_float(std::span<const double> values) {
  std::vector<double> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = static_cast<double>(static_cast<float>(values[i]));
  return out;
}

double matmul_nt_element(std::span<const double> a, std::span<const double> w, std::size_t k, std::size_t row,
                         std::size_t col) {
  double sum = 0.0;
  const double* a_row = a.data() + row * k;
  const double* w_row = w.data() + col * k;
  for (std::size_t p = 0; p < k; ++p) sum += a_row[p] * w_row[p];
  return sum;
}

std::vector<double> matmul_nt(std::span<const double> a, std::span<const double> w, std::size_t m, std::size_t n,
                              std::size_t k) {
  std::vector<double> c(m * n);
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t j = 0; j < n; ++j) c[i * n + j] = matmul_nt_element(a, w, k, i, j);
  }
  return c;
}

std::vector<double> matmul_nn(std::span<const double> a, std::span<const double> b, std::size_t m, std::size_t n,
                              std::size_t k) {
  // i-p-j loop order: the inner loop walks rows of B and C contiguously.
  std::vector<double> c(m * n, 0.0);
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t p = 0; p < k; ++p) {
      const double a_ip = a[i * k + p];
      for (std::size_t j = 0; j < n; ++j) c[i * n + j] += a_ip * b[p * n + j];
    }
  }
  return c;
}

}  // namespace kc::ref
