// The inputs of one grouped-GEMM benchmark case on the device, which the grouped chapters benchmark
// alike: A and W filled with uniform values in [-1, 1], C, the device offsets, and their host copy
// (what a framework's loop copies back before it can launch anything; here once, outside the timed
// region); the counters every variant of a case shares; the group sizes as the JSON context carries
// them.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "grouped_gemm.hpp"
#include "kc/bench.hpp"
#include "kc/check.hpp"
#include "kc/device_buffer.hpp"
#include "kc/random.hpp"

namespace kc::bench::grouped {

struct Inputs {
  kc::DeviceBuffer<__nv_bfloat16> a, w, c;
  kc::DeviceBuffer<std::int32_t> offsets;
  std::vector<std::int32_t> host_offsets;

  explicit Inputs(const kc::ch05::GroupedCase& cs)
      : a(static_cast<std::size_t>(cs.shape.m_total * cs.shape.k)),
        w(static_cast<std::size_t>(cs.shape.experts * cs.shape.n * cs.shape.k)),
        c(static_cast<std::size_t>(cs.shape.m_total * cs.shape.n)),
        offsets(kc::ch05::offsets_of_sizes(cs.sizes)) {
    kc::fill_uniform_device(a.data(), a.size(), 1, -1.0, 1.0);
    kc::fill_uniform_device(w.data(), w.size(), 2, -1.0, 1.0);
    kc::check(cudaDeviceSynchronize());
    host_offsets = offsets.to_host();
  }
};

// Weights, A and C of the case must fit with room to spare (the Mixtral and 256-expert cases need
// 4-16 GB): smaller GPUs skip the case rather than fail.
inline bool fits_device(const kc::ch05::GroupedCase& cs, const kc::DeviceInfo& device) {
  const double bytes = 2.0 * (static_cast<double>(cs.shape.experts) * cs.shape.n * cs.shape.k +
                              static_cast<double>(cs.shape.m_total) * (cs.shape.k + cs.shape.n));
  return bytes <= 0.8 * static_cast<double>(device.global_mem_bytes);
}

// The counters every variant of a case shares: the fewest bytes and the FLOPs (Chapter 5's), the
// experts and the rows.
inline void set_case_counters(benchmark::State& state, const kc::ch05::GroupedCase& cs,
                              const std::vector<std::int32_t>& host_offsets) {
  kc::bench::set_counters(state, kc::ch05::grouped_gemm_min_bytes(cs.shape, host_offsets),
                          kc::ch05::grouped_gemm_flops(cs.shape, host_offsets));
  state.counters["experts"] = static_cast<double>(cs.shape.experts);
  state.counters["rows"] = static_cast<double>(host_offsets.back());
}

// The group sizes as the JSON context carries them ("group_sizes/<case>"): "128*256" for 256 experts
// of 128 rows, "1338,669,446,...,5*12" for a Zipf tail (tools/pytorch_baselines.py,
// decode_group_sizes, reads them).
inline std::string encode_group_sizes(const std::vector<std::int32_t>& sizes) {
  std::string text;
  for (std::size_t i = 0; i < sizes.size();) {
    std::size_t end = i;
    while (end < sizes.size() && sizes[end] == sizes[i]) ++end;
    if (!text.empty()) text += ',';
    text += std::to_string(sizes[i]);
    if (end - i > 1) text += '*' + std::to_string(end - i);
    i = end;
  }
  return text;
}

}  // namespace kc::bench::grouped
