#include "kc/compare.hpp"

#include <cmath>
#include <cstring>
#include <sstream>

namespace kc {

namespace {
template <typename T>
bool all_bytes_equal(const T& value, unsigned char byte) {
  unsigned char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  for (unsigned char b : bytes) {
    if (b != byte) return false;
  }
  return true;
}

// Same class of non-finite value: NaN matches NaN, +Inf matches +Inf, -Inf matches -Inf.
bool same_nonfinite(double got, double ref) {
  if (std::isnan(ref)) return std::isnan(got);
  return got == ref;
}
}  // namespace

bool Comparison::passes(double rel_tol) const {
  // Written as "not (x <= tol)" so a NaN error also fails.
  return unwritten == 0 && nonfinite_mismatches == 0 && rel_frobenius <= rel_tol;
}

std::string Comparison::summary() const {
  std::ostringstream s;
  s << "count=" << count << ", rel_frobenius=" << rel_frobenius << ", max_abs=" << max_abs_error << " at "
    << max_abs_index << ", nan/inf mismatches=" << nonfinite_mismatches << ", unwritten=" << unwritten;
  if (nonfinite_mismatches + unwritten > 0) s << " (first at " << first_bad_index << ")";
  return s.str();
}

template <typename T>
Comparison compare(std::span<const T> got, std::span<const double> ref, std::optional<unsigned char> poison_byte) {
  Comparison c;
  c.count = got.size();
  if (got.size() != ref.size()) {
    // A length mismatch is a bug in the caller; report it as every element bad.
    c.nonfinite_mismatches = got.size() > ref.size() ? got.size() : ref.size();
    c.rel_frobenius = INFINITY;
    return c;
  }
  double diff_sq = 0.0, ref_sq = 0.0;
  bool seen_bad = false;
  auto mark_bad = [&](std::size_t i) {
    if (!seen_bad) c.first_bad_index = i;
    seen_bad = true;
  };
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (poison_byte && all_bytes_equal(got[i], *poison_byte)) {
      ++c.unwritten;
      mark_bad(i);
      continue;
    }
    const double g = to_double(got[i]);
    const double r = ref[i];
    if (!std::isfinite(r) || !std::isfinite(g)) {
      if (!same_nonfinite(g, r)) {
        ++c.nonfinite_mismatches;
        mark_bad(i);
      }
      continue;
    }
    const double d = g - r;
    diff_sq += d * d;
    ref_sq += r * r;
    if (std::fabs(d) > c.max_abs_error) {
      c.max_abs_error = std::fabs(d);
      c.max_abs_index = i;
    }
  }
  // An all-zero reference has no scale: fall back to the absolute norm of the difference.
  c.rel_frobenius = ref_sq > 0.0 ? std::sqrt(diff_sq / ref_sq) : std::sqrt(diff_sq);
  return c;
}

template <typename T>
std::size_t count_poisoned(std::span<const T> data, unsigned char poison_byte) {
  std::size_t n = 0;
  for (const T& v : data) n += all_bytes_equal(v, poison_byte) ? 1 : 0;
  return n;
}

template Comparison compare<float>(std::span<const float>, std::span<const double>, std::optional<unsigned char>);
template Comparison compare<double>(std::span<const double>, std::span<const double>, std::optional<unsigned char>);
template Comparison compare<int>(std::span<const int>, std::span<const double>, std::optional<unsigned char>);
template Comparison compare<__nv_bfloat16>(std::span<const __nv_bfloat16>, std::span<const double>,
                                           std::optional<unsigned char>);
template std::size_t count_poisoned<float>(std::span<const float>, unsigned char);
template std::size_t count_poisoned<int>(std::span<const int>, unsigned char);
template std::size_t count_poisoned<__nv_bfloat16>(std::span<const __nv_bfloat16>, unsigned char);

}  // namespace kc
