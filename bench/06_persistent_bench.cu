// Chapter 6 benchmark: Chapter 5's grouped GEMM on a persistent grid, and Stream-K for the tail.
//
// Cases (kc::ch06::benchmark_cases): Chapter 5's eight, plus two poor-last-wave shapes on 132
// slots, tail_G3xM384_N2048_K7168 (144 tiles: 1.09 waves, the last one 9 % full) and
// tail_G4xM384_N2048_K7168 (192 tiles: 1.45 waves, the last one 45 % full).
// Variants: before (Chapter 5's one launch, grouped order), step1_persistent_static,
// step2_persistent_dynamic, step3_split_k_tail (the last wave's tiles cut into equal K pieces,
// one per block), after (persistent + Stream-K), vendor_cublas_loop and
// vendor_cublas_grouped (Chapter 5's vendor functions). pytorch (torch._grouped_mm) comes from
// tools/pytorch_baselines.py.
//
// Counters: every variant counts the same FLOPs and fewest bytes as Chapter 5, plus the case's wave
// arithmetic on this GPU's slots (SMs × blocks per SM of the persistent kernel): tiles, slots, waves,
// last_wave_tiles, last_wave_utilisation, efficiency. The results table shows them beside the times.
//
// KC_TUNE=1 registers the contention probe instead (for docs/notes, not the results tables): one
// expert, N = 1536, K = 7168 (tail_G4's work per 128 × 128 tile), with 1408 rows (132 tiles: one
// full wave on 132 SMs) and with 640 rows (60 tiles: tail_G4's second wave alone), through
// Chapter 5's kernel. The full wave's time over the part wave's says how much slower a tile runs
// when every SM works than when 60 do (docs/notes/ch06.md, Session 9).
//
// Run time at --benchmark_repetitions=5 (tools/gpu_suite.sh), estimated for an H200: 60 benchmarks
// × 5 repetitions × ~0.3 s (MinTime 0.2 s of launches of 0.1-20 ms) ≈ 90 s, plus set-up (allocating
// and filling up to 15 GB per benchmark, ~0.1 s) ≈ 30 s: about 120 s in all.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

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
  split_k_tail_unclaimed,  // KC_TUNE: split-K with block b taking tail unit b (no claiming)
  split_k_tail_phases,     // KC_TUNE: split-K timed as usual, then one launch with phase stamps
  stream_k,
  stream_k_unclaimed,  // KC_TUNE: Stream-K with block b taking range b (no claiming)
  stream_k_phases,     // KC_TUNE: Stream-K timed as usual, then one launch with phase stamps
  cublas_loop,
  cublas_grouped
};

// Counters (µs) from one stamped launch: the start of the earliest block is 0. Per phase, the median,
// the smallest and the largest over the blocks that passed it: when the whole tiles were done (their
// spread), the wait for a claim, a partner's piece from its claim to its stored and counted partial
// (prologue, main loop, store), an owner's wait for its partners and its fix-up (adding their
// partials, storing C), and when the blocks ended. A block that claims several units keeps the
// stamps of the last; a phase whose two stamps come from different units is left out.
// With KC_PHASES_CSV set, every block's stamps are also appended to that file, one row per block
// (µs from t0, empty where a point was not passed), for questions the aggregates cannot answer
// (which blocks end last, and what they ran).
void record_phases(benchmark::State& state, const std::vector<std::uint64_t>& stamps, int grid,
                   const std::string& run) {
  const auto at = [&](int b, int point) {
    return stamps[static_cast<std::size_t>(b) * kc::ch06::kPhaseStamps + point];
  };
  std::uint64_t t0 = ~0ull;
  for (int b = 0; b < grid; ++b) {
    if (at(b, kc::ch06::kStampStart) != 0 && at(b, kc::ch06::kStampStart) < t0) t0 = at(b, kc::ch06::kStampStart);
  }
  const auto summarise = [&](const std::string& name, int from, int to, bool from_start) {
    std::vector<double> values;
    for (int b = 0; b < grid; ++b) {
      if (at(b, to) == 0 || (!from_start && (at(b, from) == 0 || at(b, from) > at(b, to)))) continue;
      const std::uint64_t begin = from_start ? t0 : at(b, from);
      values.push_back(static_cast<double>(at(b, to) - begin) / 1000.0);
    }
    if (values.empty()) return;
    std::sort(values.begin(), values.end());
    state.counters[name + "_med_us"] = values[values.size() / 2];
    state.counters[name + "_min_us"] = values.front();
    state.counters[name + "_max_us"] = values.back();
    state.counters[name + "_blocks"] = static_cast<double>(values.size());
  };
  summarise("whole_done", kc::ch06::kStampStart, kc::ch06::kStampWholeDone, true);
  summarise("claim_wait", kc::ch06::kStampWholeDone, kc::ch06::kStampClaimed, false);
  summarise("piece", kc::ch06::kStampClaimed, kc::ch06::kStampArrived, false);
  summarise("piece_prologue", kc::ch06::kStampClaimed, kc::ch06::kStampFirstSlice, false);
  summarise("piece_loop", kc::ch06::kStampFirstSlice, kc::ch06::kStampLoopDone, false);
  summarise("piece_store", kc::ch06::kStampLoopDone, kc::ch06::kStampArrived, false);
  summarise("owner_piece", kc::ch06::kStampClaimed, kc::ch06::kStampFixUpDone, false);
  summarise("owner_wait", kc::ch06::kStampLoopDone, kc::ch06::kStampPartnersIn, false);
  summarise("fix_up", kc::ch06::kStampPartnersIn, kc::ch06::kStampFixUpDone, false);
  summarise("end", kc::ch06::kStampStart, kc::ch06::kStampEnd, true);
  if (const char* path = std::getenv("KC_PHASES_CSV"); path != nullptr && *path != '\0') {
    std::ofstream csv(path, std::ios::app);
    if (csv.tellp() == 0) {
      csv << "run,block,ticket,start,whole_done,claimed,arrived,fix_up_done,end,first_slice,loop_done,"
             "partners_in\n";
    }
    const int times[] = {kc::ch06::kStampStart,      kc::ch06::kStampWholeDone, kc::ch06::kStampClaimed,
                         kc::ch06::kStampArrived,    kc::ch06::kStampFixUpDone, kc::ch06::kStampEnd,
                         kc::ch06::kStampFirstSlice, kc::ch06::kStampLoopDone,  kc::ch06::kStampPartnersIn};
    for (int b = 0; b < grid; ++b) {
      csv << run << ',' << b << ',';
      if (at(b, kc::ch06::kStampClaimed) != 0) csv << at(b, kc::ch06::kStampTicket);
      for (int point : times) {
        csv << ',';
        if (at(b, point) != 0) csv << static_cast<double>(at(b, point) - t0) / 1000.0;
      }
      csv << '\n';
    }
  }
}

void bench_case(benchmark::State& state, const BenchCase& cs, Variant variant) {
  const GroupedGemmShape& s = cs.shape;
  const std::vector<std::int32_t> offsets_init = kc::ch05::offsets_of_sizes(cs.sizes);
  const auto m = static_cast<std::size_t>(s.m_total), n = static_cast<std::size_t>(s.n);
  const auto k = static_cast<std::size_t>(s.k), e = static_cast<std::size_t>(s.experts);
  kc::DeviceBuffer<__nv_bfloat16> a(m * k), w(e * n * k), c(m * n);
  kc::DeviceBuffer<std::int32_t> offsets(offsets_init);
  kc::DeviceBuffer<unsigned char> workspace(
      std::max(kc::ch05::grouped_gemm_workspace_bytes(s), kc::ch06::grouped_gemm_persistent_workspace_bytes(s)));
  // Zeroed once, when new (Chapter 6's counters; every launch leaves them at zero again).
  kc::ch06::grouped_gemm_persistent_workspace_init(workspace.data(), workspace.size());
  kc::fill_uniform_device(a.data(), a.size(), 1, -1.0, 1.0);
  kc::fill_uniform_device(w.data(), w.size(), 2, -1.0, 1.0);
  cudaStream_t stream;
  kc::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  kc::check(cudaDeviceSynchronize());
  // The loops need the group sizes on the host: copied once, outside the timed region.
  const std::vector<std::int32_t> host_offsets = offsets.to_host();
  kc::ch02::CublasHandle cublas;
  std::unique_ptr<kc::ch05::CublasGroupedGemm> grouped;
  if (variant == Variant::cublas_grouped) {
    grouped = std::make_unique<kc::ch05::CublasGroupedGemm>(s, a.data(), w.data(), c.data(), host_offsets);
  }
  auto persistent = [&](Scheduler scheduler, bool claim_tail = true) {
    kc::ch06::PersistentOptions options;
    options.scheduler = scheduler;
    options.claim_tail = claim_tail;
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
      case Variant::split_k_tail_unclaimed: persistent(Scheduler::split_k_tail, false); break;
      case Variant::split_k_tail_phases: persistent(Scheduler::split_k_tail); break;
      case Variant::stream_k:
      case Variant::stream_k_phases: persistent(Scheduler::stream_k); break;
      case Variant::stream_k_unclaimed: persistent(Scheduler::stream_k, false); break;
      case Variant::cublas_loop:
        kc::ch05::cublas_grouped_loop(cublas, s, a.data(), w.data(), c.data(), host_offsets, stream);
        break;
      case Variant::cublas_grouped: grouped->run(cublas, stream); break;
    }
  };
  launch();  // warm-up: module loading, attributes, occupancy, cuBLAS heuristics
  kc::check(cudaStreamSynchronize(stream));
  kc::bench::time_batches(state, stream, 1, [&](int) { launch(); });
  if (variant == Variant::split_k_tail_phases || variant == Variant::stream_k_phases) {
    // One more launch, untimed, with every block's phase stamps: where the tail's time goes.
    const Scheduler scheduler = variant == Variant::stream_k_phases ? Scheduler::stream_k : Scheduler::split_k_tail;
    const int grid = kc::ch06::persistent_grid(s, scheduler);
    kc::DeviceBuffer<std::uint64_t> stamps(static_cast<std::size_t>(grid) * kc::ch06::kPhaseStamps);
    stamps.fill_bytes(0);
    kc::ch06::PersistentOptions options;
    options.scheduler = scheduler;
    options.phase_stamps = stamps.data();
    kc::ch06::grouped_gemm_persistent(s, a.data(), w.data(), c.data(), offsets.data(), workspace.data(),
                                      workspace.size(), options, stream);
    kc::check(cudaStreamSynchronize(stream));
    record_phases(state, stamps.to_host(), grid,
                  std::string(scheduler == Scheduler::stream_k ? "stream_k/" : "split_k/") + cs.label);
  }
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

void register_contention_probe() {
  for (const std::int32_t rows : {1408, 640}) {
    BenchCase cs;
    cs.label = "G1xM" + std::to_string(rows) + "_N1536_K7168";
    cs.shape = {rows, 1536, 7168, 1};
    cs.sizes = {rows};
    for (const auto& [name, variant] :
         {std::pair{"before", Variant::before}, std::pair{"split_k", Variant::split_k_tail}}) {
      const std::string label = "ch06/tune_wave_" + std::string(name) + "/" + cs.label;
      kc::bench::configure(benchmark::RegisterBenchmark(
          label.c_str(), [cs, variant = variant](benchmark::State& st) { bench_case(st, cs, variant); }));
    }
  }
}

void register_benchmarks(const kc::DeviceInfo& device) {
  if (const char* tune = std::getenv("KC_TUNE"); tune != nullptr && *tune == '1') {
    register_contention_probe();
    // The tail cases: split-K and Stream-K with the tail claimed by the blocks done first, against
    // block b taking tail range b, and Chapter 5's kernel.
    for (const BenchCase& cs : kc::ch06::benchmark_cases()) {
      if (cs.label.rfind("tail_", 0) != 0) continue;
      for (const auto& [name, variant] :
           {std::pair{"before", Variant::before}, std::pair{"split_k", Variant::split_k_tail},
            std::pair{"split_k_unclaimed", Variant::split_k_tail_unclaimed}, std::pair{"stream_k", Variant::stream_k},
            std::pair{"stream_k_unclaimed", Variant::stream_k_unclaimed},
            std::pair{"split_k_phases", Variant::split_k_tail_phases},
            std::pair{"stream_k_phases", Variant::stream_k_phases}}) {
        const std::string label = "ch06/tune_tail_" + std::string(name) + "/" + cs.label;
        kc::bench::configure(benchmark::RegisterBenchmark(
            label.c_str(), [cs, variant = variant](benchmark::State& st) { bench_case(st, cs, variant); }));
      }
    }
    return;
  }
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
    // Weights, A, C and the workspace must fit with room to spare: skip on smaller GPUs.
    const double bytes = 2.0 * (static_cast<double>(cs.shape.experts) * cs.shape.n * cs.shape.k +
                                static_cast<double>(cs.shape.m_total) * (cs.shape.k + cs.shape.n));
    if (bytes > 0.8 * static_cast<double>(device.global_mem_bytes)) continue;
    for (const auto& v : variants) {
      const std::string name = "ch06/" + std::string(v.name) + "/" + cs.label;
      kc::bench::configure(benchmark::RegisterBenchmark(
          name.c_str(), [cs, variant = v.v](benchmark::State& st) { bench_case(st, cs, variant); }));
    }
  }
}

}  // namespace

int main(int argc, char** argv) { return kc::bench::run(argc, argv, register_benchmarks); }
