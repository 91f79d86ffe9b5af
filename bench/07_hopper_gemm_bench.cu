// Chapter 7 benchmark: the Hopper GEMM ladder against Chapter 2's mma.sync kernel and cuBLAS.
//
// Cases: square 2048, 4096, 6144, 8192 and the MoE-like 4096×4096×7168 and 8192×7168×2048 (M×N×K),
// bf16 in and out, fp32 accumulation. Goal cases: bf16_M4096_N4096_K4096 and bf16_M8192_N8192_K8192.
// Variants: before (Chapter 2's gemm_bf16, mma.sync), step1_tma_wgmma, step2_pipeline,
// step3_warp_specialized, step4_persistent, step5_cluster_multicast, step6_tma_store, after (the
// chapter's final kernel: step 6's kernel as a programmatic dependent launch, so that each
// launch's start-up overlaps the previous launch's last tiles), vendor (cuBLAS GemmEx, fp32
// accumulate) and vendor_cublaslt (cuBLASLt's matmul with its heuristic's first algorithm,
// Chapter 3's plan). pytorch (torch.nn.functional.linear) comes from tools/pytorch_baselines.py.
//
// Counters: bytes_per_second from the fewest bytes (A, W, C once each) and flops = 2·M·N·K, the same
// for every variant of a case. Inputs rotate over enough independent sets to exceed twice the L2.
// Compare variants with --benchmark_enable_random_interleaving and several repetitions (gpu_suite.sh
// does): the goal is a ratio of medians.
//
// Run time at --benchmark_repetitions=5, estimated for an H200: 60 benchmarks × 5 repetitions × ~0.6 s
// (MinTime 0.2 s of launches of 0.02-2 ms, plus filling up to ~1 GB of rotating inputs) ≈ 180 s.
#include <cuda_bf16.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "gemm_bf16.hpp"
#include "hopper_gemm.hpp"
#include "kc/bench.hpp"
#include "kc/check.hpp"
#include "kc/device_buffer.hpp"
#include "kc/random.hpp"
#include "vendor_cublas.hpp"
#include "vendor_cublaslt.hpp"

namespace {

using bf16 = __nv_bfloat16;
using kc::ch07::GemmShape;
using kc::ch07::HopperStep;

constexpr std::size_t kMaxRotationBytes = std::size_t{8} << 30;

const GemmShape kShapes[] = {{2048, 2048, 2048}, {4096, 4096, 4096}, {6144, 6144, 6144},
                             {8192, 8192, 8192}, {4096, 4096, 7168}, {8192, 7168, 2048}};

std::string case_label(const GemmShape& s) {
  return "bf16_M" + std::to_string(s.m) + "_N" + std::to_string(s.n) + "_K" + std::to_string(s.k);
}

using GemmFn = std::function<void(const bf16*, const bf16*, bf16*, GemmShape, cudaStream_t)>;

// One variant on one shape: rotating (A, W, C) sets filled with uniform random values on the device.
void bench_gemm(benchmark::State& state, const kc::DeviceInfo& device, const GemmShape& shape, const GemmFn& gemm) {
  const auto mk = static_cast<std::size_t>(shape.m * shape.k);
  const auto nk = static_cast<std::size_t>(shape.n * shape.k);
  const auto mn = static_cast<std::size_t>(shape.m * shape.n);
  const double min_bytes = static_cast<double>(sizeof(bf16) * (mk + nk + mn));
  const std::size_t sets = kc::bench::rotation_sets(sizeof(bf16) * (mk + nk + mn), device, kMaxRotationBytes);
  std::vector<kc::DeviceBuffer<bf16>> a, w, c;
  for (std::size_t s = 0; s < sets; ++s) {
    a.emplace_back(mk);
    w.emplace_back(nk);
    c.emplace_back(mn);
    kc::fill_uniform_device(a.back().data(), mk, 2 * s + 1, -1.0, 1.0);
    kc::fill_uniform_device(w.back().data(), nk, 2 * s + 2, -1.0, 1.0);
  }
  cudaStream_t stream;
  kc::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // The fills ran on the legacy default stream, which a non-blocking stream does not wait for.
  kc::check(cudaStreamSynchronize(nullptr));
  // Warm-up outside the timed region: module loading, kernel attributes, cuBLAS's heuristics.
  gemm(a[0].data(), w[0].data(), c[0].data(), shape, stream);
  kc::check(cudaStreamSynchronize(stream));
  std::size_t next = 0;
  kc::bench::time_batches(state, stream, kc::bench::batch_for_bytes(min_bytes), [&](int) {
    const std::size_t s = next++ % sets;
    gemm(a[s].data(), w[s].data(), c[s].data(), shape, stream);
  });
  kc::check(cudaStreamDestroy(stream));
  kc::bench::set_counters(state, min_bytes, 2.0 * static_cast<double>(shape.m) * shape.n * shape.k);
  state.counters["rotating_sets"] = static_cast<double>(sets);
}

void register_benchmarks(const kc::DeviceInfo& device) {
  // kc::bench::run let through any GPU of sm_90 or newer; the kernels are sm_90a code.
  if (auto reason = kc::ch07::hopper_unavailable_reason(device.cc_major, device.cc_minor)) {
    std::printf("Skipping Chapter 7's benchmarks: %s\n", reason->c_str());
    return;
  }
  std::vector<std::string> labels;
  for (const GemmShape& shape : kShapes) labels.push_back(case_label(shape));
  kc::bench::check_case_labels(labels);

  auto add = [&device](const std::string& name, const GemmShape& shape, GemmFn gemm) {
    kc::bench::configure(benchmark::RegisterBenchmark(
        name.c_str(), [&device, shape, gemm](benchmark::State& st) { bench_gemm(st, device, shape, gemm); }));
  };
  auto step = [](HopperStep s) {
    return [s](const bf16* a, const bf16* w, bf16* c, GemmShape shape, cudaStream_t q) {
      kc::ch07::gemm_bf16_hopper_step(s, a, w, c, shape, q);
    };
  };
  // cuBLAS GemmEx, its handle created outside the timed region.
  auto add_cublas = [&device](const std::string& name, const GemmShape& shape) {
    kc::bench::configure(benchmark::RegisterBenchmark(name.c_str(), [&device, shape](benchmark::State& st) {
      const kc::ch02::CublasHandle cublas;
      bench_gemm(st, device, shape, [&cublas](const bf16* a, const bf16* w, bf16* c, GemmShape s, cudaStream_t q) {
        kc::ch02::cublas_gemm_bf16(cublas, a, w, c, s, q);
      });
    }));
  };
  // `after`: gemm_bf16_hopper with its Stream-K workspace, allocated and zero-filled outside the timed
  // region (the launches leave its flags zero); the plan's split tiles shown as a counter (0: the
  // whole-tile kernel ran).
  auto add_after = [&device](const std::string& name, const GemmShape& shape) {
    kc::bench::configure(benchmark::RegisterBenchmark(name.c_str(), [&device, shape](benchmark::State& st) {
      kc::DeviceBuffer<unsigned char> workspace(kc::ch07::gemm_bf16_hopper_workspace_bytes());
      workspace.fill_bytes(0);
      bench_gemm(st, device, shape, [&workspace](const bf16* a, const bf16* w, bf16* c, GemmShape s, cudaStream_t q) {
        kc::ch07::gemm_bf16_hopper(a, w, c, s, workspace.data(), workspace.size(), q);
      });
      st.counters["split_tiles"] = kc::ch07::gemm_bf16_hopper_stream_k_plan(shape).sk_tiles;
    }));
  };
  for (const GemmShape& shape : kShapes) {
    const std::string label = case_label(shape);
    add("ch07/before/" + label, shape,
        [](const bf16* a, const bf16* w, bf16* c, GemmShape s, cudaStream_t q) { kc::ch02::gemm_bf16(a, w, c, s, q); });
    add("ch07/step1_tma_wgmma/" + label, shape, step(HopperStep::tma_wgmma));
    add("ch07/step2_pipeline/" + label, shape, step(HopperStep::pipeline));
    add("ch07/step3_warp_specialized/" + label, shape, step(HopperStep::warp_specialized));
    add("ch07/step4_persistent/" + label, shape, step(HopperStep::persistent));
    add("ch07/step5_cluster_multicast/" + label, shape, step(HopperStep::cluster_multicast));
    add("ch07/step6_tma_store/" + label, shape, step(HopperStep::tma_store));
    add_after("ch07/after/" + label, shape);
    add_cublas("ch07/vendor/" + label, shape);
    kc::bench::configure(
        benchmark::RegisterBenchmark(("ch07/vendor_cublaslt/" + label).c_str(), [&device, shape](benchmark::State& st) {
          const kc::ch03::CublasLtLinear lt(shape, false);  // planned outside the timed region
          bench_gemm(st, device, shape, [&lt](const bf16* a, const bf16* w, bf16* c, GemmShape, cudaStream_t q) {
            lt.run(a, w, nullptr, c, q);
          });
        }));
  }
}

}  // namespace

// Below sm_90 kc::bench::run says there is no suitable GPU and exits 0; above it, register_benchmarks
// says why it registers nothing.
int main(int argc, char** argv) { return kc::bench::run(argc, argv, register_benchmarks, 9, 0); }
