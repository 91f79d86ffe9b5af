// Chapter 6 benchmark: Chapter 5's grouped GEMM on a persistent grid, and Stream-K for the tail.
//
// Cases (kc::ch06::benchmark_cases): Chapter 5's eight, plus two poor-last-wave shapes on 132
// slots, tail_G3xM384_N2048_K7168 (144 tiles: 1.09 waves, the last one 9 % full) and
// tail_G4xM384_N2048_K7168 (192 tiles: 1.45 waves, the last one 45 % full).
// Variants: before (Chapter 5's one launch, grouped order, 128 × 128 tile), step1_persistent_static,
// step2_persistent_dynamic, step3_split_k_tail (the last wave's tiles cut into equal K pieces,
// one per block), after (persistent + Stream-K), vendor_cublas_loop and
// vendor_cublas_grouped (Chapter 5's vendor functions). pytorch (torch._grouped_mm) comes from
// tools/pytorch_baselines.py.
//
// Counters: every variant counts the same FLOPs and fewest bytes as Chapter 5, plus the case's wave
// arithmetic on this GPU's slots (SMs × blocks per SM of the persistent kernel): tiles, slots, waves,
// last_wave_tiles, last_wave_utilisation, efficiency. The results table shows them beside the times.
//
// Run time at --benchmark_repetitions=5 (tools/gpu_suite.sh), estimated for an H200: 60 benchmarks
// × 5 repetitions × ~0.3 s (MinTime 0.2 s of launches of 0.1-20 ms) ≈ 90 s, plus set-up (allocating
// and filling up to 15 GB per benchmark, ~0.1 s) ≈ 30 s: about 120 s in all.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "05_grouped_gemm_inputs.hpp"
#include "grouped_gemm.hpp"
#include "kc/bench.hpp"
#include "kc/check.hpp"
#include "kc/device_buffer.hpp"
#include "kc/random.hpp"
#include "persistent_gemm.hpp"
#include "vendor_grouped.hpp"

namespace {

using kc::ch06::BenchCase;
using kc::ch06::GroupedGemmShape;
using kc::ch06::Scheduler;

enum class Variant {
  before,
  persistent_static,
  persistent_dynamic,
  split_k_tail,
  stream_k,
  cublas_loop,
  cublas_grouped
};

void bench_case(benchmark::State& state, const BenchCase& cs, Variant variant) {
  const GroupedGemmShape& s = cs.shape;
  kc::bench::grouped::Inputs in(cs);
  auto &a = in.a, &w = in.w, &c = in.c;
  auto& offsets = in.offsets;
  const std::vector<std::int32_t>& host_offsets = in.host_offsets;
  kc::DeviceBuffer<unsigned char> workspace(
      std::max(kc::ch05::grouped_gemm_workspace_bytes(s), kc::ch06::grouped_gemm_persistent_workspace_bytes(s)));
  // Zeroed once, when new (Chapter 6's counters; every launch leaves them at zero again).
  kc::ch06::grouped_gemm_persistent_workspace_init(workspace.data(), workspace.size());
  cudaStream_t stream;
  kc::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  kc::check(cudaDeviceSynchronize());
  kc::ch02::CublasHandle cublas;
  std::unique_ptr<kc::ch05::CublasGroupedGemm> grouped;
  if (variant == Variant::cublas_grouped) {
    grouped = std::make_unique<kc::ch05::CublasGroupedGemm>(s, a.data(), w.data(), c.data(), host_offsets);
  }
  auto persistent = [&](Scheduler scheduler) {
    kc::ch06::PersistentOptions options;
    options.scheduler = scheduler;
    kc::ch06::grouped_gemm_persistent(s, a.data(), w.data(), c.data(), offsets.data(), workspace.data(),
                                      workspace.size(), options, stream);
  };
  auto launch = [&] {
    switch (variant) {
      case Variant::before:
        kc::ch05::grouped_gemm(s, a.data(), w.data(), c.data(), offsets.data(), workspace.data(), workspace.size(),
                               {kc::ch05::TileOrder::grouped, kc::ch05::kDefaultGroupM}, stream);
        break;
      case Variant::persistent_static: persistent(Scheduler::static_round_robin); break;
      case Variant::persistent_dynamic: persistent(Scheduler::dynamic_atomic); break;
      case Variant::split_k_tail: persistent(Scheduler::split_k_tail); break;
      case Variant::stream_k: persistent(Scheduler::stream_k); break;
      case Variant::cublas_loop:
        kc::ch05::cublas_grouped_loop(cublas, s, a.data(), w.data(), c.data(), host_offsets, stream);
        break;
      case Variant::cublas_grouped: grouped->run(cublas, stream); break;
    }
  };
  launch();  // warm-up: module loading, attributes, occupancy, cuBLAS heuristics
  kc::check(cudaStreamSynchronize(stream));
  kc::bench::time_batches(state, stream, 1, [&](int) { launch(); });
  kc::check(cudaStreamDestroy(stream));
  kc::bench::set_counters(state, kc::ch05::grouped_gemm_min_bytes(s, host_offsets),
                          kc::ch05::grouped_gemm_flops(s, host_offsets));
  // The wave arithmetic of the case on this GPU, the same for every variant of the case.
  const int slots = kc::ch06::persistent_slots(Scheduler::stream_k);
  const kc::ch06::Waves waves = kc::ch06::waves_of(kc::ch06::grouped_tiles(s, host_offsets), slots);
  state.counters["experts"] = static_cast<double>(s.experts);
  state.counters["rows"] = static_cast<double>(host_offsets.back());
  state.counters["tiles"] = static_cast<double>(waves.tiles);
  state.counters["slots"] = static_cast<double>(waves.slots);
  state.counters["waves"] = static_cast<double>(waves.waves);
  state.counters["last_wave_tiles"] = static_cast<double>(waves.last_wave_tiles);
  state.counters["last_wave_utilisation"] = waves.last_wave_utilisation;
  state.counters["efficiency"] = waves.efficiency;
}

void register_benchmarks(const kc::DeviceInfo& device) {
  const std::vector<BenchCase> all = kc::ch06::benchmark_cases();
  std::vector<std::string> labels;
  for (const BenchCase& cs : all) labels.push_back(cs.label);
  kc::bench::check_case_labels(labels);
  const struct {
    const char* name;
    Variant v;
  } variants[] = {{"before", Variant::before},
                  {"step1_persistent_static", Variant::persistent_static},
                  {"step2_persistent_dynamic", Variant::persistent_dynamic},
                  {"step3_split_k_tail", Variant::split_k_tail},
                  {"after", Variant::stream_k},
                  {"vendor_cublas_loop", Variant::cublas_loop},
                  {"vendor_cublas_grouped", Variant::cublas_grouped}};
  for (const BenchCase& cs : all) {
    if (!kc::bench::grouped::fits_device(cs, device)) continue;
    for (const auto& v : variants) {
      const std::string name = "ch06/" + std::string(v.name) + "/" + cs.label;
      kc::bench::configure(benchmark::RegisterBenchmark(
          name.c_str(), [cs, variant = v.v](benchmark::State& st) { bench_case(st, cs, variant); }));
    }
  }
}

}  // namespace

int main(int argc, char** argv) { return kc::bench::run(argc, argv, register_benchmarks); }
