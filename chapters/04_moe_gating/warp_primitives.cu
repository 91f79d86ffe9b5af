// What a cross-lane instruction costs (warp_primitives.hpp): one instruction repeated in chains, timed
// with the SM's cycle counter.
//
// Every instruction is its own `asm volatile` statement, so nvcc neither drops nor merges any, and
// each reads the register the previous one of its chain wrote, so in latency mode (one chain) the
// SASS is a strict dependency chain: the cycles per instruction are issue-to-result. In throughput
// mode each warp runs kThroughputChains chains that never meet, and every SM holds
// blocks_per_sm × warps_per_block warps, so there is always independent work to issue and the
// cycles are set by the unit that executes the primitive.
//
// The clock is read by each block's thread 0 after a block barrier, before and after the loop:
// clock64() counts SM cycles, so the numbers are cycles whatever the clock frequency was. Each SM
// has its own counter, so throughput is worked out SM by SM (primitive_ops_per_sm_clock): the block
// scheduler does not promise blocks_per_sm blocks on every SM, and dividing one block's work by one
// block's time where an SM ran more blocks than that overstates the rate (the first run of this
// benchmark reported 5.3 FFMA a clock, above the SM's 4).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kc/check.hpp"
#include "warp_primitives.hpp"

namespace kc::ch04 {

namespace {

// One instruction of the chain, on a 32-bit register value.
template <WarpPrimitive P>
__device__ __forceinline__ unsigned step(unsigned x) {
  unsigned y;
  if constexpr (P == WarpPrimitive::shfl_xor) {
    // The neighbour's value (lane ^ 1): an even number of them gives every lane its own value back.
    asm volatile("shfl.sync.bfly.b32 %0, %1, 1, 0x1f, 0xffffffff;" : "=r"(y) : "r"(x));
  } else if constexpr (P == WarpPrimitive::redux_max) {
    // The warp's largest value, to every lane (its uniform result moves back to a lane register).
    asm volatile("redux.sync.max.u32 %0, %1, 0xffffffff;" : "=r"(y) : "r"(x));
  } else if constexpr (P == WarpPrimitive::vote_any) {
    // Is x non-zero in any lane? Between two votes ptxas folds the select and the compare away (the
    // select's 1 or 0 compared with 0 is the predicate again), so the chain in the SASS is VOTE.ANY
    // from predicate to predicate.
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "setp.ne.u32 p, %1, 0;\n\t"
        "vote.sync.any.pred p, p, 0xffffffff;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(y)
        : "r"(x));
  } else {
    // x * 0.5 + 1 in fp32, on the value's bits: a plain FMA-pipe instruction for scale.
    float f = __uint_as_float(x);
    asm volatile("fma.rn.f32 %0, %0, 0f3F000000, 0f3F800000;" : "+f"(f));
    y = __float_as_uint(f);
  }
  return y;
}

// Where chain c of a lane starts. The shuffle and max chains start from distinct values per lane;
// the vote chain from "true in lane c only"; the FMA chain from a small float.
template <WarpPrimitive P>
__host__ __device__ unsigned chain_start(int lane, int c) {
  if constexpr (P == WarpPrimitive::vote_any) {
    return lane == c ? 1u : 0u;
  } else if constexpr (P == WarpPrimitive::ffma) {
    const float f = static_cast<float>(lane + 3 * c);
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    unsigned bits;
    std::memcpy(&bits, &f, sizeof(bits));
    return bits;
#endif
  } else {
    return static_cast<unsigned>(lane * 7 + c * 1000 + 1);
  }
}

template <WarpPrimitive P, int kChains>
__global__ void primitive_kernel(int iterations, PrimitiveSample* __restrict__ samples) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  unsigned x[kChains];
#pragma unroll
  for (int c = 0; c < kChains; ++c) x[c] = chain_start<P>(lane, c);

  __syncthreads();
  const long long start = clock64();
  for (int i = 0; i < iterations; ++i) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) {
#pragma unroll
      for (int s = 0; s < kOpsPerChainPerIteration; ++s) x[c] = step<P>(x[c]);
    }
  }
  __syncthreads();
  const long long stop = clock64();

  if (threadIdx.x == 0) {
    unsigned checksum = 0;
#pragma unroll
    for (int c = 0; c < kChains; ++c) checksum += x[c];
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    samples[blockIdx.x] = PrimitiveSample{start, stop, sm, checksum};
  }
}

template <WarpPrimitive P>
void launch(const WarpPrimitiveConfig& config, int sm_count, PrimitiveSample* samples, cudaStream_t stream) {
  if (config.mode == PrimitiveMode::latency) {
    primitive_kernel<P, 1><<<1, 32, 0, stream>>>(config.iterations, samples);
  } else {
    const auto blocks = static_cast<unsigned>(warp_primitive_blocks(config, sm_count));
    primitive_kernel<P, kThroughputChains>
        <<<blocks, 32 * config.warps_per_block, 0, stream>>>(config.iterations, samples);
  }
}

int chains_of(const WarpPrimitiveConfig& config) {
  return config.mode == PrimitiveMode::latency ? 1 : kThroughputChains;
}

// The host's copy of one chain: the value lane `lane` of chain c ends with after `ops` instructions.
// Shuffles with lane mask 1 swap pairs of lanes, so an even count is the identity; a max or a vote
// gives every lane the warp's result after the first instruction and keeps it; the FMA is computed
// step by step with the same rounding (std::fma on floats is fma.rn.f32).
unsigned chain_end(WarpPrimitive primitive, int lane, int c, std::int64_t ops) {
  switch (primitive) {
    case WarpPrimitive::shfl_xor:
      return ops % 2 == 0 ? chain_start<WarpPrimitive::shfl_xor>(lane, c)
                          : chain_start<WarpPrimitive::shfl_xor>(lane ^ 1, c);
    case WarpPrimitive::redux_max: {
      unsigned best = 0;
      for (int l = 0; l < 32; ++l) best = std::max(best, chain_start<WarpPrimitive::redux_max>(l, c));
      return best;
    }
    case WarpPrimitive::vote_any: return 1u;  // lane c starts true (c < 32)
    case WarpPrimitive::ffma: {
      float f = static_cast<float>(lane + 3 * c);
      for (std::int64_t i = 0; i < ops; ++i) f = std::fma(f, 0.5f, 1.0f);
      unsigned bits;
      std::memcpy(&bits, &f, sizeof(bits));
      return bits;
    }
  }
  return 0;
}

}  // namespace

const char* to_string(WarpPrimitive primitive) {
  switch (primitive) {
    case WarpPrimitive::shfl_xor: return "shfl_xor";
    case WarpPrimitive::redux_max: return "redux_max";
    case WarpPrimitive::vote_any: return "vote_any";
    case WarpPrimitive::ffma: return "ffma";
  }
  return "unknown";
}

void validate_warp_primitive(const WarpPrimitiveConfig& config, int sm_count, const PrimitiveSample* samples) {
  const auto primitive = static_cast<int>(config.primitive);
  if (primitive < 0 || primitive > static_cast<int>(WarpPrimitive::ffma)) {
    throw InvalidArgument("config.primitive (" + std::to_string(primitive) + ") must be a WarpPrimitive value");
  }
  if (config.mode != PrimitiveMode::latency && config.mode != PrimitiveMode::throughput) {
    throw InvalidArgument("config.mode (" + std::to_string(static_cast<int>(config.mode)) +
                          ") must be a PrimitiveMode value");
  }
  if (config.warps_per_block < 1 || config.warps_per_block > 32) {
    throw InvalidArgument("config.warps_per_block (" + std::to_string(config.warps_per_block) + ") must be in [1, 32]");
  }
  if (config.blocks_per_sm < 1 || config.blocks_per_sm > 8) {
    throw InvalidArgument("config.blocks_per_sm (" + std::to_string(config.blocks_per_sm) + ") must be in [1, 8]");
  }
  if (config.warps_per_block * config.blocks_per_sm > 64) {
    throw InvalidArgument("config.warps_per_block x config.blocks_per_sm (" + std::to_string(config.warps_per_block) +
                          " x " + std::to_string(config.blocks_per_sm) +
                          ") must be at most 64 warps an SM, so that every block is resident at once");
  }
  if (config.iterations < 1) {
    throw InvalidArgument("config.iterations (" + std::to_string(config.iterations) + ") must be >= 1");
  }
  if (sm_count < 1) throw InvalidArgument("sm_count (" + std::to_string(sm_count) + ") must be >= 1");
  if (samples == nullptr) throw InvalidArgument("samples must not be null");
}

std::int64_t warp_primitive_blocks(const WarpPrimitiveConfig& config, int sm_count) {
  const PrimitiveSample placeholder;
  validate_warp_primitive(config, sm_count, &placeholder);
  return config.mode == PrimitiveMode::latency ? 1 : static_cast<std::int64_t>(sm_count) * config.blocks_per_sm;
}

std::int64_t warp_primitive_ops_per_warp(const WarpPrimitiveConfig& config) {
  const PrimitiveSample placeholder;
  validate_warp_primitive(config, 1, &placeholder);
  return static_cast<std::int64_t>(config.iterations) * kOpsPerChainPerIteration * chains_of(config);
}

unsigned expected_primitive_checksum(const WarpPrimitiveConfig& config) {
  const std::int64_t ops = warp_primitive_ops_per_warp(config) / chains_of(config);  // per chain
  unsigned checksum = 0;
  for (int c = 0; c < chains_of(config); ++c) checksum += chain_end(config.primitive, 0, c, ops);
  return checksum;
}

void warp_primitive(const WarpPrimitiveConfig& config, int sm_count, PrimitiveSample* samples, cudaStream_t stream) {
  validate_warp_primitive(config, sm_count, samples);
  switch (config.primitive) {
    case WarpPrimitive::shfl_xor: launch<WarpPrimitive::shfl_xor>(config, sm_count, samples, stream); break;
    case WarpPrimitive::redux_max: launch<WarpPrimitive::redux_max>(config, sm_count, samples, stream); break;
    case WarpPrimitive::vote_any: launch<WarpPrimitive::vote_any>(config, sm_count, samples, stream); break;
    case WarpPrimitive::ffma: launch<WarpPrimitive::ffma>(config, sm_count, samples, stream); break;
  }
  check_launch();
}

double primitive_cycles_per_op(const WarpPrimitiveConfig& config, std::span<const PrimitiveSample> samples) {
  if (config.mode != PrimitiveMode::latency) {
    throw InvalidArgument("config.mode must be PrimitiveMode::latency for cycles per instruction");
  }
  if (samples.size() != 1 || samples[0].stop <= samples[0].start) {
    throw InvalidArgument("samples must hold exactly the one sample of a latency launch, with stop > start");
  }
  return static_cast<double>(samples[0].stop - samples[0].start) /
         static_cast<double>(warp_primitive_ops_per_warp(config));
}

double primitive_ops_per_sm_clock(const WarpPrimitiveConfig& config, int sm_count,
                                  std::span<const PrimitiveSample> samples) {
  if (config.mode != PrimitiveMode::throughput) {
    throw InvalidArgument("config.mode must be PrimitiveMode::throughput for instructions per SM per clock");
  }
  const std::int64_t blocks = warp_primitive_blocks(config, sm_count);
  if (static_cast<std::int64_t>(samples.size()) != blocks) {
    throw InvalidArgument("samples (" + std::to_string(samples.size()) + ") must hold one sample per block (" +
                          std::to_string(blocks) + ")");
  }
  // Per SM: the blocks it ran, and the span from its first start to its last stop.
  struct SmSpan {
    int blocks = 0;
    long long first_start = 0, last_stop = 0;
  };
  std::vector<SmSpan> spans(static_cast<std::size_t>(sm_count));
  for (const PrimitiveSample& s : samples) {
    if (s.stop <= s.start) throw InvalidArgument("every sample must have stop > start");
    if (s.sm >= static_cast<unsigned>(sm_count)) {
      throw InvalidArgument("every sample's sm (" + std::to_string(s.sm) + ") must be below sm_count (" +
                            std::to_string(sm_count) + ")");
    }
    SmSpan& span = spans[s.sm];
    span.first_start = span.blocks == 0 ? s.start : std::min(span.first_start, s.start);
    span.last_stop = span.blocks == 0 ? s.stop : std::max(span.last_stop, s.stop);
    ++span.blocks;
  }
  const double ops_per_block =
      static_cast<double>(config.warps_per_block) * static_cast<double>(warp_primitive_ops_per_warp(config));
  std::vector<double> rates;
  for (const SmSpan& span : spans) {
    if (span.blocks > 0)
      rates.push_back(span.blocks * ops_per_block / static_cast<double>(span.last_stop - span.first_start));
  }
  std::nth_element(rates.begin(), rates.begin() + static_cast<std::ptrdiff_t>(rates.size() / 2), rates.end());
  return rates[rates.size() / 2];
}

}  // namespace kc::ch04
