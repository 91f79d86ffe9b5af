// Chapter 2 benchmark: C = A·B in fp32 (the CUDA-core ladder) and C = A·Wᵀ in bf16 (tensor cores).
//
// Cases: square 1024-8192 and the MoE-like 4096×4096×7168 and 128×4096×7168, in fp32 and bf16.
// Variants: fp32 — each ladder step (stepN_<name>), after (the best step), vendor (cuBLAS SGEMM,
// TF32 off); bf16 — after (the mma.sync kernel), vendor (cuBLAS GemmEx, fp32 accumulate), limit (the
// measured mma.sync peak of this GPU, from a microbenchmark that does nothing but back-to-back
// mma.sync). pytorch comes from tools/pytorch_baselines.py.
//
// Counters: bytes_per_second from the fewest bytes (A, B or W, C once each) and flops = 2·M·N·K.
// Inputs rotate over enough independent sets to exceed twice the L2, so the 58.7 MB weight of the
// 128×4096×7168 bf16 case cannot sit in the 60 MB L2 between launches.
#include <cuda_bf16.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "gemm_bf16.hpp"
#include "kc/bench.hpp"
#include "kc/check.hpp"
#include "kc/device_buffer.hpp"
#include "kc/random.hpp"
#include "sgemm.hpp"
#include "sgemm_steps.cuh"
#include "vendor_cublas.hpp"

namespace {

using kc::ch02::GemmShape;

constexpr std::size_t kMaxRotationBytes = std::size_t{8} << 30;

const GemmShape kShapes[] = {{1024, 1024, 1024}, {2048, 2048, 2048}, {4096, 4096, 4096},
                             {8192, 8192, 8192}, {4096, 4096, 7168}, {128, 4096, 7168}};

std::string case_label(const char* dtype, const GemmShape& s) {
  return std::string(dtype) + "_M" + std::to_string(s.m) + "_N" + std::to_string(s.n) + "_K" + std::to_string(s.k);
}

template <typename T>
using GemmFn = std::function<void(const T*, const T*, T*, GemmShape, cudaStream_t)>;

// One GEMM variant: rotating (A, B-or-W, C) sets filled with uniform random values on the device.
template <typename T>
void bench_gemm(benchmark::State& state, const kc::DeviceInfo& device, const GemmShape& shape, const GemmFn<T>& gemm) {
  const auto mk = static_cast<std::size_t>(shape.m * shape.k);
  const auto kn = static_cast<std::size_t>(shape.k * shape.n);
  const auto mn = static_cast<std::size_t>(shape.m * shape.n);
  const double min_bytes = static_cast<double>(sizeof(T) * (mk + kn + mn));
  const std::size_t sets = kc::bench::rotation_sets(sizeof(T) * (mk + kn + mn), device, kMaxRotationBytes);
  std::vector<kc::DeviceBuffer<T>> a, b, c;
  for (std::size_t s = 0; s < sets; ++s) {
    a.emplace_back(mk);
    b.emplace_back(kn);
    c.emplace_back(mn);
    kc::fill_uniform_device(a.back().data(), mk, 2 * s + 1, -1.0, 1.0);
    kc::fill_uniform_device(b.back().data(), kn, 2 * s + 2, -1.0, 1.0);
  }
  cudaStream_t stream;
  kc::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // The fills ran on the legacy default stream, which a non-blocking stream does not wait for.
  kc::check(cudaStreamSynchronize(nullptr));
  // Warm-up outside the timed region: module loading, cuBLAS's workspace and heuristics.
  gemm(a[0].data(), b[0].data(), c[0].data(), shape, stream);
  kc::check(cudaStreamSynchronize(stream));
  std::size_t next = 0;
  kc::bench::time_batches(state, stream, kc::bench::batch_for_bytes(min_bytes), [&](int) {
    const std::size_t s = next++ % sets;
    gemm(a[s].data(), b[s].data(), c[s].data(), shape, stream);
  });
  kc::check(cudaStreamDestroy(stream));
  kc::bench::set_counters(state, min_bytes, 2.0 * static_cast<double>(shape.m) * shape.n * shape.k);
  state.counters["rotating_sets"] = static_cast<double>(sets);
}

// cuBLAS SGEMM (TF32 off) on the same inputs: the fp32 `vendor` rows and the tuning sweep's.
void bench_cublas_sgemm(benchmark::State& state, const kc::DeviceInfo& device, const GemmShape& shape) {
  kc::ch02::CublasHandle cublas;
  bench_gemm<float>(state, device, shape,
                    [&cublas](const float* a, const float* b, float* c, GemmShape s, cudaStream_t q) {
                      kc::ch02::cublas_sgemm(cublas, a, b, c, s, q);
                    });
}

// The limit: the mma.sync peak, reported for every bf16 case so each row has its fraction.
void bench_mma_peak(benchmark::State& state, const kc::DeviceInfo& device, const kc::ch02::MmaPeakConfig& config = {}) {
  kc::DeviceBuffer<float> sink(static_cast<std::size_t>(kc::ch02::mma_peak_sink_elements(config, device.sm_count)));
  cudaStream_t stream;
  kc::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  kc::ch02::mma_peak(config, device.sm_count, sink.data(), stream);
  kc::check(cudaStreamSynchronize(stream));
  kc::bench::time_batches(state, stream, 1,
                          [&](int) { kc::ch02::mma_peak(config, device.sm_count, sink.data(), stream); });
  kc::check(cudaStreamDestroy(stream));
  kc::bench::set_counters(state, 0.0, kc::ch02::mma_peak_flops(config, device.sm_count));
  state.counters["warps_per_sm"] = static_cast<double>(config.warps_per_block * config.blocks_per_sm);
  state.counters["accumulators_per_warp"] = static_cast<double>(config.accumulators_per_warp);
}

void register_benchmarks(const kc::DeviceInfo& device) {
  using kc::ch02::SgemmStep;
  const SgemmStep steps[] = {SgemmStep::kNaive,       SgemmStep::kCoalesced,   SgemmStep::kSharedTiled,
                             SgemmStep::kBlocktile1d, SgemmStep::kBlocktile2d, SgemmStep::kVectorized,
                             SgemmStep::kWarptiled};
  auto add = [](const std::string& name, std::function<void(benchmark::State&)> body) {
    kc::bench::configure(benchmark::RegisterBenchmark(name.c_str(), std::move(body)));
  };
  for (const GemmShape& shape : kShapes) {
    const std::string fp32 = case_label("fp32", shape);
    for (SgemmStep step : steps) {
      const GemmFn<float> fn = [step](const float* a, const float* b, float* c, GemmShape s, cudaStream_t st) {
        kc::ch02::sgemm(step, a, b, c, s, st);
      };
      add("ch02/" + std::string(kc::ch02::sgemm_step_name(step)) + "/" + fp32,
          [&device, shape, fn](benchmark::State& st) { bench_gemm<float>(st, device, shape, fn); });
    }
    add("ch02/after/" + fp32, [&device, shape](benchmark::State& st) {
      bench_gemm<float>(st, device, shape, [](const float* a, const float* b, float* c, GemmShape s, cudaStream_t q) {
        kc::ch02::sgemm(kc::ch02::kBestSgemmStep, a, b, c, s, q);
      });
    });
    add("ch02/vendor/" + fp32, [&device, shape](benchmark::State& st) { bench_cublas_sgemm(st, device, shape); });

    const std::string bf16 = case_label("bf16", shape);
    using Bf16 = __nv_bfloat16;
    add("ch02/after/" + bf16, [&device, shape](benchmark::State& st) {
      bench_gemm<Bf16>(st, device, shape, [](const Bf16* a, const Bf16* w, Bf16* c, GemmShape s, cudaStream_t q) {
        kc::ch02::gemm_bf16(a, w, c, s, q);
      });
    });
    add("ch02/vendor/" + bf16, [&device, shape](benchmark::State& st) {
      kc::ch02::CublasHandle cublas;
      bench_gemm<Bf16>(st, device, shape,
                       [&cublas](const Bf16* a, const Bf16* w, Bf16* c, GemmShape s, cudaStream_t q) {
                         kc::ch02::cublas_gemm_bf16(cublas, a, w, c, s, q);
                       });
    });
    add("ch02/limit/" + bf16, [&device](benchmark::State& st) { bench_mma_peak(st, device); });
  }
}

}  // namespace

int main(int argc, char** argv) { return kc::bench::run(argc, argv, register_benchmarks); }
