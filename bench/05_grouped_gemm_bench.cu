// Chapter 5 benchmark: the grouped GEMM of an MoE layer's experts, C = A · W[e]ᵀ per expert, bf16
// in and out, fp32 accumulation, in the permuted layout (A [M_total, K], W [E, N, K], offsets on
// the device).
//
// Cases (a curated list that fits one GPU call; labels G{E}xM{rows per expert}_N_K for uniform
// groups, E{E}_M{total}_{distribution}_N_K for the skewed ones):
//   DeepSeek-V3 up (N = 4096, K = 7168): G8xM4096, G32xM256, G256xM128 uniform; 256 experts over
//   8192 rows Zipf-skewed, one hot expert (half the rows), 25 % empty experts.
//   DeepSeek-V3 down (N = 7168, K = 2048): G8xM4096.
//   Mixtral up (N = 28672, K = 4096, 235 MB of weights per expert): G8xM4096, the L2 lesson.
// Variants: before (a host loop of Chapter 2's GEMM, 128 × 128 tile, one launch per non-empty
// expert), step1_one_launch_rowmajor (one launch, 128 × 128 tile, row-major order),
// step2_one_launch_grouped (the same in the grouped order, group_m 8), after (grouped order on
// Chapter 2's 128 × 256 tile, where it fits), vendor_cublas_loop (cublasGemmEx per expert),
// vendor_cublas_grouped (cublasGemmGroupedBatchedEx).
// pytorch (torch._grouped_mm) comes from tools/pytorch_baselines.py.
//
// The loop and cuBLAS variants need the group sizes on the host: the benchmark copies the device
// offsets to the host once, outside the timed region (a framework pays that copy and a
// synchronisation on every layer; here it is free, which flatters the loops).
//
// Counters: every variant counts the same FLOPs (2 · rows · N · K) and the same fewest bytes (A,
// the weights of non-empty experts and C once each). Every case's weights alone exceed 2 × the
// 60 MB L2 (470 MB to 15 GB), so one input set is enough: nothing survives in L2 between launches.
// Launches take milliseconds: one launch per event pair.
//
// Run time at --benchmark_repetitions=5 (tools/gpu_suite.sh), estimated for an H200: 48 benchmarks
// × 5 repetitions × ~0.3 s (MinTime 0.2 s of launches of 1-20 ms) ≈ 60 s, plus set-up (allocating
// and filling up to 15 GB of weights per benchmark, ~0.1 s) ≈ 20 s: about 80 s in all.
#include <cuda_bf16.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "05_grouped_gemm_inputs.hpp"
#include "grouped_gemm.hpp"
#include "kc/bench.hpp"
#include "kc/check.hpp"
#include "kc/device_buffer.hpp"
#include "kc/random.hpp"
#include "vendor_grouped.hpp"

namespace {

using kc::ch05::GroupedGemmShape;

using Case = kc::ch05::GroupedCase;

enum class Variant { before, one_launch_row_major, one_launch_grouped, one_launch_wide, cublas_loop, cublas_grouped };

bool is_wide(Variant v) { return v == Variant::one_launch_wide; }

void bench_case(benchmark::State& state, const Case& cs, Variant variant) {
  const GroupedGemmShape& s = cs.shape;
  kc::bench::grouped::Inputs in(cs);
  auto &a = in.a, &w = in.w, &c = in.c;
  auto& offsets = in.offsets;
  const std::vector<std::int32_t>& host_offsets = in.host_offsets;
  kc::DeviceBuffer<unsigned char> workspace(kc::ch05::grouped_gemm_workspace_bytes(s));
  cudaStream_t stream;
  kc::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  kc::ch02::CublasHandle cublas;
  std::unique_ptr<kc::ch05::CublasGroupedGemm> grouped;
  if (variant == Variant::cublas_grouped) {
    grouped = std::make_unique<kc::ch05::CublasGroupedGemm>(s, a.data(), w.data(), c.data(), host_offsets);
  }
  auto launch = [&] {
    switch (variant) {
      case Variant::before: kc::ch05::grouped_gemm_loop(s, a.data(), w.data(), c.data(), host_offsets, stream); break;
      case Variant::one_launch_row_major:
      case Variant::one_launch_grouped:
      case Variant::one_launch_wide: {
        const kc::ch05::GroupedGemmOptions options{
            variant == Variant::one_launch_row_major ? kc::ch05::TileOrder::row_major : kc::ch05::TileOrder::grouped,
            kc::ch05::kDefaultGroupM,
            is_wide(variant) ? kc::ch05::GroupedTile::wide_128x256 : kc::ch05::GroupedTile::square_128x128};
        kc::ch05::grouped_gemm(s, a.data(), w.data(), c.data(), offsets.data(), workspace.data(), workspace.size(),
                               options, stream);
        break;
      }
      case Variant::cublas_loop:
        kc::ch05::cublas_grouped_loop(cublas, s, a.data(), w.data(), c.data(), host_offsets, stream);
        break;
      case Variant::cublas_grouped: grouped->run(cublas, stream); break;
    }
  };
  launch();  // warm-up: module loading, attributes, cuBLAS heuristics
  kc::check(cudaStreamSynchronize(stream));
  kc::bench::time_batches(state, stream, 1, [&](int) { launch(); });
  kc::check(cudaStreamDestroy(stream));
  kc::bench::set_counters(state, kc::ch05::grouped_gemm_min_bytes(s, host_offsets),
                          kc::ch05::grouped_gemm_flops(s, host_offsets));
  state.counters["experts"] = static_cast<double>(s.experts);
  state.counters["rows"] = static_cast<double>(host_offsets.back());
}

struct NamedVariant {
  const char* name;
  Variant v;
};

void register_variants(const kc::DeviceInfo& device, const std::vector<Case>& all,
                       std::initializer_list<NamedVariant> variants) {
  for (const Case& cs : all) {
    if (!kc::bench::grouped::fits_device(cs, device)) continue;
    for (const NamedVariant& v : variants) {
      if (is_wide(v.v) && !kc::ch05::grouped_tile_supported(kc::ch05::GroupedTile::wide_128x256)) {
        continue;  // the 128 x 256 tile does not fit this GPU's shared memory
      }
      const std::string name = "ch05/" + std::string(v.name) + "/" + cs.label;
      kc::bench::configure(benchmark::RegisterBenchmark(
          name.c_str(), [cs, variant = v.v](benchmark::State& st) { bench_case(st, cs, variant); }));
    }
  }
}

void register_benchmarks(const kc::DeviceInfo& device) {
  const std::vector<Case> all = kc::ch05::benchmark_cases();
  std::vector<std::string> labels;
  for (const Case& cs : all) labels.push_back(cs.label);
  kc::bench::check_case_labels(labels);
  register_variants(device, all,
                    {{"before", Variant::before},
                     {"step1_one_launch_rowmajor", Variant::one_launch_row_major},
                     {"step2_one_launch_grouped", Variant::one_launch_grouped},
                     {"after", Variant::one_launch_wide},
                     {"vendor_cublas_loop", Variant::cublas_loop},
                     {"vendor_cublas_grouped", Variant::cublas_grouped}});
}

}  // namespace

int main(int argc, char** argv) { return kc::bench::run(argc, argv, register_benchmarks); }
