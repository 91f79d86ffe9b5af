// The inputs of one grouped-GEMM benchmark case on the device, which Chapters 5 and 6 benchmark
// alike: A and W filled with uniform values in [-1, 1], C, the device offsets, and their host copy
// (what a framework's loop copies back before it can launch anything; here once, outside the timed
// region).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
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

}  // namespace kc::bench::grouped
