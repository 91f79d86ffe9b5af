// Chapter 4 tests: the tests that rely on launch timing or time the GPU, in their own suite
// (MoeGatingTiming) so that they can run alone: the early launch waits for the kernel before it,
// DeepSeek-V3's bias read before that wait, and the warp primitives' cycle counts.
// The shared inputs, paths and checks, with the tolerances and why, are in moe_gating_checks.hpp.
// GPU tests skip with a reason where there is no GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "moe_gating_checks.hpp"

namespace {

using namespace kc::test::moe_gating;

using kc::ch04::PrimitiveMode;
using kc::ch04::PrimitiveSample;
using kc::ch04::WarpPrimitive;
using kc::ch04::WarpPrimitiveConfig;

class MoeGatingTiming : public kc::test::GpuTest {};

// The kernel a gating launch follows, made to race it: it lets the next kernel launch at once
// (griddepcontrol.launch_dependents), then spins for `nanoseconds`, and only then writes the logits
// (copied from `source`) and stale values into the counts. A gating launch that started reading
// logits or zeroing counts before this kernel finished would see NaN logits or keep stale counts.
__global__ void late_producer(const float* source, float* logits, std::size_t count, std::int32_t* counts,
                              int num_experts, unsigned long long nanoseconds) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
  unsigned long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < nanoseconds);
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    logits[i] = source[i];
  }
  if (blockIdx.x == 0) {
    for (int e = static_cast<int>(threadIdx.x); e < num_experts; e += blockDim.x) counts[e] = 1000000 + e;
  }
}

// after launches its kernels early, each as its predecessor's programmatic dependent (sm_90): each
// must still wait for the kernel before it before reading the logits or zeroing the counts. The
// kernel before it here writes both 50 µs after it let them launch.
TEST_F(MoeGatingTiming, EarlyLaunchWaitsForTheKernelBefore) {
  const std::uint64_t seed = kc::test::test_seed();
  for (Path path : {Path::after_fused, Path::after_separate, Path::after_automatic}) {
    for (const GatingParams& p : {softmax_params(4099, 256, 8, true), softmax_params(333, 8, 2, false),
                                  softmax_params(1000, 60, 6, true), dsv3_params(515)}) {
      SCOPED_TRACE(std::string(path_name(path)) + " E=" + std::to_string(p.num_experts) +
                   (p.scoring == Scoring::deepseek_v3 ? " deepseek_v3" : ""));
      const std::size_t n = static_cast<std::size_t>(p.num_tokens) * static_cast<std::size_t>(p.num_experts);
      const std::size_t tk = static_cast<std::size_t>(p.num_tokens) * static_cast<std::size_t>(p.k);
      std::vector<float> host, bias;
      if (p.scoring == Scoring::deepseek_v3) {
        dsv3_inputs(p.num_tokens, p.num_experts, seed, host, bias);
      } else {
        host = grid_logits(n, seed + static_cast<std::uint64_t>(p.num_experts));
      }
      kc::DeviceBuffer<float> source(host), d_bias(bias), logits(n);
      logits.fill_bytes(kc::test::kPoisonByte);  // NaN until late_producer writes
      kc::test::GuardedOutput<float> weights(tk);
      kc::test::GuardedOutput<std::int32_t> ids(tk), counts(static_cast<std::size_t>(p.num_experts));
      // Loaded and run once first: a first launch's module loading outlasts late_producer's 50 us,
      // and the gating kernels would then start after it whatever they do.
      const CountMode mode = path == Path::after_fused      ? CountMode::fused_atomics
                             : path == Path::after_separate ? CountMode::separate_kernel
                                                            : CountMode::automatic;
      const kc::ch04::GatingOutputs out{weights.data(), ids.data(), counts.data()};
      kc::ch04::gating_after(p, logits.data(), bias.empty() ? nullptr : d_bias.data(), out, nullptr, mode);
      kc::check(cudaDeviceSynchronize());
      weights.poison();
      ids.poison();
      late_producer<<<132, 256>>>(source.data(), logits.data(), n, counts.data(), p.num_experts, 50000);
      kc::check(cudaGetLastError());
      kc::ch04::gating_after(p, logits.data(), bias.empty() ? nullptr : d_bias.data(), out, nullptr, mode);
      kc::check(cudaDeviceSynchronize());
      const std::vector<double> bias64(bias.begin(), bias.end());
      const GatingReference ref = reference(p, widen(host), bias64);
      EXPECT_EQ(ids.to_host(), ref.ids);
      kc::test::expect_close(kc::compare<float>(weights.to_host(), ref.weights, kc::test::kPoisonByte), 1e-5,
                             "weights");
      EXPECT_EQ(counts.to_host(), ref.counts);
    }
  }
}

// DeepSeek-V3's kernel reads the correction bias before its wait (gating_after's contract): the bias
// may be written by a kernel as long as an operation that is not a kernel (here a memset) stands
// between that kernel and the call. late_producer writes the bias 50 us after letting the next
// kernel launch, and poisons it until then; the gating launch must still see the written bias.
// The kernels are loaded and run once first: a first launch's module loading takes longer than the
// 50 us, and the test would pass whatever the order. The race is real: on sm_90 a variant without
// the memset (and without counts) failed.
TEST_F(MoeGatingTiming, DeepSeekBiasWrittenBeforeANonKernelOperationIsSeen) {
  const std::uint64_t seed = kc::test::test_seed();
  cudaStream_t stream = nullptr;  // its own stream: the test's launches only
  kc::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (const GatingParams& p : {dsv3_params(515), dsv3_params(4096)}) {
    if (p.num_tokens == 4096 && kc::test::small_tests_only()) continue;
    SCOPED_TRACE("T=" + std::to_string(p.num_tokens));
    const std::size_t tk = static_cast<std::size_t>(p.num_tokens) * static_cast<std::size_t>(p.k);
    std::vector<float> logits, bias;
    dsv3_inputs(p.num_tokens, p.num_experts, seed, logits, bias);
    kc::DeviceBuffer<float> d_logits(logits), source(bias), d_bias(bias.size());
    kc::DeviceBuffer<std::int32_t> scratch(static_cast<std::size_t>(p.num_experts));
    kc::test::GuardedOutput<float> weights(tk);
    kc::test::GuardedOutput<std::int32_t> ids(tk), counts(static_cast<std::size_t>(p.num_experts));
    const kc::ch04::GatingOutputs out{weights.data(), ids.data(), counts.data()};
    kc::ch04::gating_after(p, d_logits.data(), source.data(), out, stream);  // load and run once
    late_producer<<<1, 256, 0, stream>>>(source.data(), d_logits.data(), 0, scratch.data(), p.num_experts, 1);
    kc::check(cudaStreamSynchronize(stream));
    weights.poison();
    ids.poison();
    counts.poison();
    d_bias.fill_bytes(kc::test::kPoisonByte);
    kc::check(cudaDeviceSynchronize());
    late_producer<<<1, 256, 0, stream>>>(source.data(), d_bias.data(), bias.size(), scratch.data(), p.num_experts,
                                         50000);
    kc::check(cudaGetLastError());
    kc::check(cudaMemsetAsync(scratch.data(), 0, sizeof(std::int32_t), stream));  // not a kernel
    kc::ch04::gating_after(p, d_logits.data(), d_bias.data(), out, stream);
    kc::check(cudaStreamSynchronize(stream));
    const GatingReference ref = reference(p, widen(logits), widen(bias));
    EXPECT_EQ(ids.to_host(), ref.ids);
    kc::test::expect_close(kc::compare<float>(weights.to_host(), ref.weights, kc::test::kPoisonByte), 1e-5, "weights");
    EXPECT_EQ(counts.to_host(), ref.counts);
  }
  kc::check(cudaStreamDestroy(stream));
}

// Every primitive in both modes on the GPU: each block reports the checksum the host worked out (the
// instructions ran and computed what they should), a positive cycle count and a real SM; the metrics
// follow, and no rate exceeds what an SM can issue (four schedulers, one warp instruction a clock each).
TEST_F(MoeGatingTiming, WarpPrimitivesComputeWhatTheHostExpects) {
  for (WarpPrimitive primitive : kPrimitives) {
    for (PrimitiveMode mode : {PrimitiveMode::latency, PrimitiveMode::throughput}) {
      SCOPED_TRACE(std::string(kc::ch04::to_string(primitive)) +
                   (mode == PrimitiveMode::latency ? " latency" : " throughput"));
      const WarpPrimitiveConfig c = primitive_config(primitive, mode, 3);
      const int sms = device().sm_count;
      kc::test::GuardedOutput<PrimitiveSample> samples(
          static_cast<std::size_t>(kc::ch04::warp_primitive_blocks(c, sms)));
      kc::ch04::warp_primitive(c, sms, samples.data());
      kc::check(cudaDeviceSynchronize());
      const std::vector<PrimitiveSample> host = samples.to_host();
      const unsigned expected = kc::ch04::expected_primitive_checksum(c);
      for (std::size_t b = 0; b < host.size(); ++b) {
        ASSERT_EQ(host[b].checksum, expected) << "block " << b;
        ASSERT_GT(host[b].stop, host[b].start) << "block " << b;
        ASSERT_LT(host[b].sm, static_cast<unsigned>(sms)) << "block " << b;
      }
      if (mode == PrimitiveMode::latency) {
        EXPECT_GE(kc::ch04::primitive_cycles_per_op(c, host), 1.0);
      } else {
        const double rate = kc::ch04::primitive_ops_per_sm_clock(c, sms, host);
        EXPECT_GT(rate, 0.0);
        EXPECT_LE(rate, 4.0);
      }
    }
  }
}

}  // namespace
