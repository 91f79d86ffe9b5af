#include "kc/random.hpp"

#include <cstdlib>
#include <random>
#include <string>

namespace kc {

std::uint64_t random_seed() {
  if (const char* env = std::getenv("KC_SEED"); env != nullptr && *env != '\0') {
    return std::stoull(env, nullptr, 0);
  }
  std::random_device device;
  return (static_cast<std::uint64_t>(device()) << 32) ^ device();
}

namespace {
template <typename T, typename Convert>
void fill(std::span<T> out, std::uint64_t seed, double lo, double hi, Convert convert) {
  const double width = hi - lo;
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = convert(lo + width * uniform01(seed, i));
}
}  // namespace

void fill_uniform(std::span<float> out, std::uint64_t seed, double lo, double hi) {
  fill(out, seed, lo, hi, [](double v) { return static_cast<float>(v); });
}

void fill_uniform(std::span<double> out, std::uint64_t seed, double lo, double hi) {
  fill(out, seed, lo, hi, [](double v) { return v; });
}

void fill_uniform(std::span<__nv_bfloat16> out, std::uint64_t seed, double lo, double hi) {
  fill(out, seed, lo, hi, [](double v) { return __float2bfloat16_rn(static_cast<float>(v)); });
}

}  // namespace kc
