// Chapter 1 benchmark: c = a + b for n = 2^16 ... 2^28 floats.
//
// Variants: before (one thread per element), after (float4 grid-stride), uncoalesced (chunk per
// thread), limit (cudaMemcpyAsync device-to-device of n floats: the copy bandwidth this GPU
// reaches, measured in the same run). pytorch (torch.add) is added by tools/pytorch_baselines.py.
//
// Bytes: every variant counts the fewest bytes c = a + b must move, 12 n (read a, read b, write c);
// limit counts the 8 n bytes its copy moves. So bytes_per_second compares directly with the limit.
// Inputs rotate over enough independent (a, b, c) sets to exceed twice the L2, so every launch reads
// device memory; small n are timed as batches of launches between one pair of events.
#include <cstdint>
#include <string>
#include <vector>

#include "kc/bench.hpp"
#include "kc/check.hpp"
#include "kc/device_buffer.hpp"
#include "kc/random.hpp"
#include "vector_add.hpp"

namespace {

constexpr std::size_t kMaxRotationBytes = std::size_t{8} << 30;

// Rotating input/output sets for one case, filled with random values on the device.
struct Sets {
  std::vector<kc::DeviceBuffer<float>> a, b, c;
  Sets(std::size_t n, std::size_t count) {
    for (std::size_t s = 0; s < count; ++s) {
      a.emplace_back(n);
      b.emplace_back(n);
      c.emplace_back(n);
      kc::fill_uniform_device(a.back().data(), n, 2 * s + 1, -1.0, 1.0);
      kc::fill_uniform_device(b.back().data(), n, 2 * s + 2, -1.0, 1.0);
    }
    kc::check(cudaDeviceSynchronize());
  }
};

using AddFn = void (*)(const float*, const float*, float*, std::int64_t, cudaStream_t);

void add_after(const float* a, const float* b, float* c, std::int64_t n, cudaStream_t s) {
  kc::ch01::vector_add_after(a, b, c, n, s);
}

void bench_add(benchmark::State& state, const kc::DeviceInfo& device, AddFn add, std::int64_t n) {
  const auto count = static_cast<std::size_t>(n);
  const double min_bytes = 12.0 * static_cast<double>(n);
  const std::size_t sets = kc::bench::rotation_sets(3 * count * sizeof(float), device, kMaxRotationBytes);
  Sets data(count, sets);
  cudaStream_t stream;
  kc::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::size_t next = 0;
  kc::bench::time_batches(state, stream, kc::bench::batch_for_bytes(min_bytes), [&](int) {
    const std::size_t s = next++ % sets;
    add(data.a[s].data(), data.b[s].data(), data.c[s].data(), n, stream);
  });
  kc::check(cudaStreamDestroy(stream));
  kc::bench::set_counters(state, min_bytes);
  state.counters["rotating_sets"] = static_cast<double>(sets);
}

void bench_copy_limit(benchmark::State& state, const kc::DeviceInfo& device, std::int64_t n) {
  const auto count = static_cast<std::size_t>(n);
  const double copy_bytes = 8.0 * static_cast<double>(n);  // n floats read + n floats written
  const std::size_t sets = kc::bench::rotation_sets(2 * count * sizeof(float), device, kMaxRotationBytes);
  std::vector<kc::DeviceBuffer<float>> src, dst;
  for (std::size_t s = 0; s < sets; ++s) {
    src.emplace_back(count);
    dst.emplace_back(count);
    kc::fill_uniform_device(src.back().data(), count, s + 1, -1.0, 1.0);
  }
  cudaStream_t stream;
  kc::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  kc::check(cudaStreamSynchronize(nullptr));
  std::size_t next = 0;
  kc::bench::time_batches(state, stream, kc::bench::batch_for_bytes(copy_bytes), [&](int) {
    const std::size_t s = next++ % sets;
    kc::check(cudaMemcpyAsync(dst[s].data(), src[s].data(), count * sizeof(float), cudaMemcpyDeviceToDevice, stream));
  });
  kc::check(cudaStreamDestroy(stream));
  kc::bench::set_counters(state, copy_bytes);
  state.counters["rotating_sets"] = static_cast<double>(sets);
}

void register_benchmarks(const kc::DeviceInfo& device) {
  for (int log2n = 16; log2n <= 28; log2n += 2) {
    const std::int64_t n = std::int64_t{1} << log2n;
    const std::string label = "fp32_N" + std::to_string(n);
    const struct {
      const char* variant;
      AddFn fn;
    } variants[] = {{"before", kc::ch01::vector_add_before},
                    {"after", add_after},
                    {"uncoalesced", kc::ch01::vector_add_uncoalesced}};
    for (const auto& v : variants) {
      kc::bench::configure(
          benchmark::RegisterBenchmark(("ch01/" + std::string(v.variant) + "/" + label).c_str(),
                                       [&device, fn = v.fn, n](benchmark::State& s) { bench_add(s, device, fn, n); }));
    }
    kc::bench::configure(benchmark::RegisterBenchmark(
        ("ch01/limit/" + label).c_str(), [&device, n](benchmark::State& s) { bench_copy_limit(s, device, n); }));
  }
}

}  // namespace

int main(int argc, char** argv) { return kc::bench::run(argc, argv, register_benchmarks); }
