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
#include <sstream>
#include <string>
#include <vector>

#include "grouped_gemm.hpp"
#include "kc/bench.hpp"
#include "kc/check.hpp"
#include "kc/device_buffer.hpp"
#include "kc/random.hpp"
#include "vendor_grouped.hpp"

namespace {

using kc::ch05::GroupedGemmShape;
using kc::ch05::GroupSizes;

struct Case {
  std::string label;
  GroupedGemmShape shape;
  std::vector<std::int32_t> sizes;
};

enum class Variant { before, one_launch_row_major, one_launch_grouped, one_launch_wide, cublas_loop, cublas_grouped };

bool is_wide(Variant v) { return v == Variant::one_launch_wide; }

void bench_case(benchmark::State& state, const Case& cs, Variant variant) {
  const GroupedGemmShape& s = cs.shape;
  const std::vector<std::int32_t> offsets_init = kc::ch05::offsets_of_sizes(cs.sizes);
  const auto m = static_cast<std::size_t>(s.m_total), n = static_cast<std::size_t>(s.n);
  const auto k = static_cast<std::size_t>(s.k), e = static_cast<std::size_t>(s.experts);
  kc::DeviceBuffer<__nv_bfloat16> a(m * k), w(e * n * k), c(m * n);
  kc::DeviceBuffer<std::int32_t> offsets(offsets_init);
  kc::DeviceBuffer<unsigned char> workspace(kc::ch05::grouped_gemm_workspace_bytes(s));
  kc::fill_uniform_device(a.data(), a.size(), 1, -1.0, 1.0);
  kc::fill_uniform_device(w.data(), w.size(), 2, -1.0, 1.0);
  cudaStream_t stream;
  kc::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  kc::check(cudaDeviceSynchronize());
  // What a framework's loop does before it can launch anything: the group sizes to the host.
  const std::vector<std::int32_t> host_offsets = offsets.to_host();
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

Case uniform_case(int experts, std::int32_t rows_per_expert, std::int64_t n, std::int64_t k) {
  Case cs;
  std::ostringstream label;  // not a chain of string +: GCC 12's -Wrestrict misfires on those here
  label << "G" << experts << "xM" << rows_per_expert << "_N" << n << "_K" << k;
  cs.label = label.str();
  cs.sizes = kc::ch05::group_sizes(GroupSizes::uniform, experts, experts * rows_per_expert);
  cs.shape = {static_cast<std::int64_t>(experts) * rows_per_expert, n, k, experts};
  return cs;
}

Case skewed_case(const char* name, GroupSizes kind, int experts, std::int32_t rows, std::int64_t n, std::int64_t k) {
  Case cs;
  std::ostringstream label;
  label << "E" << experts << "_M" << rows << "_" << name << "_N" << n << "_K" << k;
  cs.label = label.str();
  cs.sizes = kc::ch05::group_sizes(kind, experts, rows);
  cs.shape = {rows, n, k, experts};
  return cs;
}

std::vector<Case> cases() {
  return {uniform_case(8, 4096, 4096, 7168),
          uniform_case(32, 256, 4096, 7168),
          uniform_case(256, 128, 4096, 7168),
          skewed_case("zipf", GroupSizes::zipf, 256, 8192, 4096, 7168),
          skewed_case("hot", GroupSizes::one_hot, 256, 8192, 4096, 7168),
          skewed_case("empty25", GroupSizes::quarter_empty, 256, 8192, 4096, 7168),
          uniform_case(8, 4096, 7168, 2048),
          uniform_case(8, 4096, 28672, 4096)};
}

// Weights, A and C of the case must fit with room to spare (the Mixtral and 256-expert cases need
// 4-16 GB): skip on smaller GPUs rather than fail.
bool fits_device(const Case& cs, const kc::DeviceInfo& device) {
  const double bytes = 2.0 * (static_cast<double>(cs.shape.experts) * cs.shape.n * cs.shape.k +
                              static_cast<double>(cs.shape.m_total) * (cs.shape.k + cs.shape.n));
  return bytes <= 0.8 * static_cast<double>(device.global_mem_bytes);
}

struct NamedVariant {
  const char* name;
  Variant v;
};

void register_variants(const kc::DeviceInfo& device, const std::vector<Case>& all,
                       std::initializer_list<NamedVariant> variants) {
  for (const Case& cs : all) {
    if (!fits_device(cs, device)) continue;
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
  const std::vector<Case> all = cases();
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
