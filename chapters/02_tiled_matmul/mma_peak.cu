// The limit for the tensor-core GEMM: how many mma.sync m16n8k16 bf16 per second the GPU can retire
// when nothing else gets in the way (no memory traffic, no ldmatrix, no barriers).
//
// Each warp keeps its operands in registers and issues kAccumulators mma.sync per iteration, each into
// its own accumulator tile. One mma must finish before the next one into the SAME accumulator can
// start (tens of cycles), so a single accumulator measures latency, not throughput; with 8 independent
// accumulators per warp and 32 warps per SM (8 warps × 4 blocks, the default) every tensor core has
// plenty of independent work queued. The exercises vary both and watch the rate saturate.
//
// The compiler must neither drop nor merge the work: the mma are `asm volatile` (never removed or
// combined), each accumulator starts from a different value (no two chains are the same computation),
// and every thread stores the sum of its accumulators at the end (the results are used). That store
// is the only memory traffic. In the SASS the loop body is kAccumulators HMMA.16816.F32.BF16, each
// reading and writing its own accumulator registers, so consecutive HMMA never depend on each other.
#include <cstring>
#include <string>

#include "gemm_bf16.hpp"
#include "kc/check.hpp"
#include "mma_sm80.cuh"

namespace kc::ch02 {

namespace {

constexpr double kFlopsPerMma = 2.0 * 16 * 8 * 16;  // 2048 multiply-adds

// Two bf16 as the one 32-bit register mma.sync takes them in.
__device__ __forceinline__ std::uint32_t as_register(__nv_bfloat162 pair) {
  std::uint32_t bits;
  std::memcpy(&bits, &pair, sizeof(bits));
  return bits;
}

template <int kAccumulators>
__global__ void mma_peak_kernel(int iterations, float* __restrict__ sink) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  // Operands that depend on the lane, so nothing can be folded at compile time, and small (at most
  // 2^-7 each) so that even 2^31 iterations of 16 products per element stay far from overflow.
  const __nv_bfloat162 x = __floats2bfloat162_rn((1 + lane % 4) * 0x1p-9f, (1 + lane / 8) * 0x1p-9f);
  const __nv_bfloat162 y = __floats2bfloat162_rn((4 - lane % 4) * 0x1p-9f, (1 + lane % 3) * 0x1p-9f);
  const std::uint32_t a[4] = {as_register(x), as_register(y), as_register(y), as_register(x)};
  const std::uint32_t b[2] = {as_register(y), as_register(x)};

  float acc[kAccumulators][4];
#pragma unroll
  for (int j = 0; j < kAccumulators; ++j) {
    acc[j][0] = static_cast<float>(j);  // different starting points: no two chains can be merged
    acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  }

  for (int i = 0; i < iterations; ++i) {
#pragma unroll
    for (int j = 0; j < kAccumulators; ++j) sm80::mma_bf16_16816(acc[j], a, b);
  }

  float checksum = 0.0f;
#pragma unroll
  for (int j = 0; j < kAccumulators; ++j) checksum += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
  sink[static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x] = checksum;
}

template <int kAccumulators>
void launch(const MmaPeakConfig& config, int sm_count, float* sink, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>(sm_count) * static_cast<unsigned>(config.blocks_per_sm);
  mma_peak_kernel<kAccumulators><<<blocks, 32 * config.warps_per_block, 0, stream>>>(config.iterations, sink);
}

// The rules on the configuration alone (sink not involved).
void validate_config(const MmaPeakConfig& config, int sm_count) {
  if (config.warps_per_block < 1 || config.warps_per_block > 32) {
    throw InvalidArgument("config.warps_per_block (" + std::to_string(config.warps_per_block) + ") must be in [1, 32]");
  }
  if (config.blocks_per_sm < 1) {
    throw InvalidArgument("config.blocks_per_sm (" + std::to_string(config.blocks_per_sm) + ") must be >= 1");
  }
  const int acc = config.accumulators_per_warp;
  if (acc != 1 && acc != 2 && acc != 4 && acc != 8 && acc != 16) {
    throw InvalidArgument("config.accumulators_per_warp (" + std::to_string(acc) + ") must be 1, 2, 4, 8 or 16");
  }
  if (config.iterations < 1) {
    throw InvalidArgument("config.iterations (" + std::to_string(config.iterations) + ") must be >= 1");
  }
  if (sm_count < 1) throw InvalidArgument("sm_count (" + std::to_string(sm_count) + ") must be >= 1");
  if (static_cast<std::int64_t>(sm_count) * config.blocks_per_sm > 0x7FFFFFFF) {
    throw InvalidArgument("sm_count x config.blocks_per_sm (" + std::to_string(sm_count) + " x " +
                          std::to_string(config.blocks_per_sm) + ") must be <= 2^31 - 1 blocks");
  }
}

}  // namespace

void validate_mma_peak(const MmaPeakConfig& config, int sm_count, const float* sink) {
  validate_config(config, sm_count);
  if (sink == nullptr) throw InvalidArgument("sink must not be null");
}

std::int64_t mma_peak_sink_elements(const MmaPeakConfig& config, int sm_count) {
  validate_config(config, sm_count);
  return static_cast<std::int64_t>(sm_count) * config.blocks_per_sm * config.warps_per_block * 32;
}

double mma_peak_flops(const MmaPeakConfig& config, int sm_count) {
  validate_config(config, sm_count);
  const double warps = static_cast<double>(sm_count) * config.blocks_per_sm * config.warps_per_block;
  return warps * config.accumulators_per_warp * config.iterations * kFlopsPerMma;
}

void mma_peak(const MmaPeakConfig& config, int sm_count, float* sink, cudaStream_t stream) {
  validate_mma_peak(config, sm_count, sink);
  switch (config.accumulators_per_warp) {
    case 1: launch<1>(config, sm_count, sink, stream); break;
    case 2: launch<2>(config, sm_count, sink, stream); break;
    case 4: launch<4>(config, sm_count, sink, stream); break;
    case 8: launch<8>(config, sm_count, sink, stream); break;
    default: launch<16>(config, sm_count, sink, stream); break;
  }
  check_launch();
}

}  // namespace kc::ch02
