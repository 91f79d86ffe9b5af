// Chapter 8 benchmark: the grouped GEMM of an MoE layer's experts on Hopper, C = A · W[e]ᵀ per expert,
// bf16 in and out, fp32 accumulation, in Chapter 5's layout (A [M_total, K], W [E, N, K], offsets on the
// device), against Chapter 5's one launch, cuBLAS and the case's roofline.
//
// Cases (labels as Chapter 5's: G{E}xM{rows per expert}_N_K uniform, E{E}_M{total}_{distribution}_N_K
// skewed, the same group sizes as Chapter 5's):
//   DeepSeek-V3 up (N = 4096, K = 7168): G8xM4096, G32xM256, G256xM128 uniform; 256 experts over 8192
//   rows Zipf-skewed, one hot expert (half the rows), 25 % empty experts; 256 experts over 32768 rows
//   spread 128 ± 11 as prefill's routing spreads them (ragged: half the experts take a second m-tile).
//   DeepSeek-V3 down (N = 7168, K = 2048): G8xM4096 and G256xM128.
//   Mixtral up (N = 28672, K = 4096): G8xM4096.
//   Qwen3-30B-A3B gate and up (N = 1536 = 2 × 768, K = 2048), small experts: G128xM256.
// Variants: before (Chapter 7's GEMM launched once per non-empty expert, grouped_gemm_hopper_loop),
// step0_ch05_one_launch (Chapter 5's `after`: one launch, grouped order, 128 × 256 mma.sync tile),
// step1_masked_store, step2_device_tensor_maps, step3_ragged_tensor_map, step4_a_evict_last,
// step5_block_per_tile (grouped_gemm_hopper_step), after (grouped_gemm_hopper: step 4 or 5, as after_step picks),
// order_row_major (the G8xM4096 cases only: `after` with each expert's tiles walked row by row instead of in bands
// of 16 m-tiles, to measure what the grouped order saves; the chapter's profile compares the two orders' DRAM
// bytes), vendor_cublas_loop (cublasGemmEx per expert), vendor_cublas_grouped (cublasGemmGroupedBatchedEx), limit
// (the case's roofline, measured in the same run: device-to-device copies of S = min(fewest bytes / 2, 1 GiB) bytes
// back to back for at least 20 ms, taking t_copy each, then cuBLAS's GemmEx on one dense matrix of all the experts'
// rows, rows × N × K, back to back in batches of at least 20 ms, taking t_gemm each, each kind after a batch of it
// untimed; an iteration's time is the longer of fewest bytes / (2 S / t_copy) and t_gemm). pytorch
// (torch._grouped_mm) comes from tools/pytorch_baselines.py.
//
// The loop and cuBLAS variants need the group sizes on the host: the benchmark copies the device
// offsets to the host once, outside the timed region (a framework pays that copy and a synchronisation
// on every layer; here it is free, which flatters the loops). Each case's group sizes go into the JSON
// context as "group_sizes/<case>": comma-separated sizes, "size*count" for a run of equal ones; the
// PyTorch baseline reads them from there.
//
// Counters: every variant, limit included, counts the same FLOPs (2 · rows · N · K) and the same fewest
// bytes (A, the weights of non-empty experts and C once each), so "× limit" is the roofline's time over
// the variant's. limit adds copy_floor_us and gemm_floor_us (its two times; the longer one is the
// limit). Every variant adds sm_clock_mhz: the median of NVML's SM clock sampled every 2 ms while its
// launches are timed (limit: every 0.25 ms while cuBLAS's dense GEMMs run, the copy left out); absent
// where NVML does not answer. Every case's weights alone exceed 2 × the 60 MB L2 (805 MB to 15 GB), so
// one input set is enough. The variants' launches take milliseconds: one launch per event pair.
//
// Hopper only: on another GPU, or in a build without sm_90a kernels, the program registers nothing and
// says why (as Chapter 7's).
//
// Run time at --benchmark_repetitions=5 (tools/gpu_suite.sh), estimated for an H200: 124 benchmarks
// × (5 repetitions × ~0.3 s (MinTime 0.2 s of launches of 0.3-25 ms) + ~7 set-ups × ~0.07 s (Google
// Benchmark sizes the first repetition in 2-3 runs; each run allocates and fills up to 16 GB)) ≈ 250 s.
#include <cuda_bf16.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "05_grouped_gemm_inputs.hpp"
#include "grouped_gemm.hpp"
#include "grouped_launch.hpp"  // the order probe, grouped_gemm_hopper_ordered
#include "hopper_gemm.hpp"
#include "hopper_grouped_gemm.hpp"
#include "kc/bench.hpp"
#include "kc/check.hpp"
#include "kc/device_buffer.hpp"
#include "kc/random.hpp"
#include "kc/sm_clock.hpp"
#include "kc/timer.hpp"
#include "vendor_cublas.hpp"
#include "vendor_grouped.hpp"

namespace {

using bf16 = __nv_bfloat16;
using kc::ch05::GroupedCase;
using kc::ch05::GroupedGemmShape;
using kc::ch08::GroupedStep;

// limit's copy: S bytes read and S written, S at most this.
constexpr std::size_t kMaxCopyBytes = std::size_t{1} << 30;
// limit's copies and dense GEMMs are timed in batches of at least this long (see bench_limit).
constexpr double kSteadyBatchSeconds = 0.02;

std::vector<GroupedCase> benchmark_cases() {
  using kc::ch05::GroupSizes;
  using kc::ch05::skewed_case;
  using kc::ch05::uniform_case;
  return {uniform_case(8, 4096, 4096, 7168),
          uniform_case(32, 256, 4096, 7168),
          uniform_case(256, 128, 4096, 7168),
          uniform_case(8, 4096, 7168, 2048),
          uniform_case(256, 128, 7168, 2048),
          uniform_case(8, 4096, 28672, 4096),
          uniform_case(128, 256, 1536, 2048),
          skewed_case(GroupSizes::zipf, 256, 8192, 4096, 7168),
          skewed_case(GroupSizes::one_hot, 256, 8192, 4096, 7168),
          skewed_case(GroupSizes::quarter_empty, 256, 8192, 4096, 7168),
          skewed_case(GroupSizes::ragged, 256, 32768, 4096, 7168)};
}

enum class Variant { before, ch05_one_launch, hopper_step, after, row_major_order, cublas_loop, cublas_grouped };

// Runs @p timed (a variant's timed launches) with the SM clock sampled meanwhile: counter sm_clock_mhz,
// where NVML answers.
template <class Timed>
void time_with_clock(benchmark::State& state, Timed&& timed) {
  int device = 0;
  kc::check(cudaGetDevice(&device));
  kc::bench::SmClockSampler clock(device);
  timed();
  const double mhz = clock.stop();
  if (mhz > 0.0) state.counters["sm_clock_mhz"] = mhz;
}

// One variant on one case. @p step is the Hopper step for Variant::hopper_step (ignored otherwise).
void bench_case(benchmark::State& state, const GroupedCase& cs, Variant variant, GroupedStep step) {
  const GroupedGemmShape& s = cs.shape;
  kc::bench::grouped::Inputs in(cs);
  const bf16* a = in.a.data();
  const bf16* w = in.w.data();
  bf16* c = in.c.data();
  const std::int32_t* offsets = in.offsets.data();
  const std::vector<std::int32_t>& host_offsets = in.host_offsets;
  // One buffer serves either chapter's workspace (Chapter 8's is 128-byte aligned: cudaMalloc gives 256).
  kc::DeviceBuffer<unsigned char> workspace(
      std::max(kc::ch05::grouped_gemm_workspace_bytes(s), kc::ch08::grouped_gemm_hopper_workspace_bytes(s)));
  cudaStream_t stream;
  kc::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  kc::ch02::CublasHandle cublas;
  std::unique_ptr<kc::ch05::CublasGroupedGemm> grouped;
  if (variant == Variant::cublas_grouped) {
    grouped = std::make_unique<kc::ch05::CublasGroupedGemm>(s, a, w, c, host_offsets);
  }
  const kc::ch05::GroupedGemmOptions ch05_after{kc::ch05::TileOrder::grouped, kc::ch05::kDefaultGroupM,
                                                kc::ch05::GroupedTile::wide_128x256};
  const kc::ch08::GroupedEpilogue plain{kc::ch08::EpilogueKind::plain};
  auto launch = [&] {
    switch (variant) {
      case Variant::before: kc::ch08::grouped_gemm_hopper_loop(s, a, w, c, host_offsets, stream); break;
      case Variant::ch05_one_launch:
        kc::ch05::grouped_gemm(s, a, w, c, offsets, workspace.data(), workspace.size(), ch05_after, stream);
        break;
      case Variant::hopper_step:
        kc::ch08::grouped_gemm_hopper_step(step, s, a, w, c, offsets, plain, workspace.data(), workspace.size(),
                                           stream);
        break;
      case Variant::after:
        kc::ch08::grouped_gemm_hopper(s, a, w, c, offsets, plain, workspace.data(), workspace.size(), stream);
        break;
      case Variant::row_major_order:
        kc::ch08::detail::grouped_gemm_hopper_ordered(kc::ch08::after_step(s), 1, s, a, w, c, offsets, plain,
                                                      workspace.data(), workspace.size(), stream);
        break;
      case Variant::cublas_loop: kc::ch05::cublas_grouped_loop(cublas, s, a, w, c, host_offsets, stream); break;
      case Variant::cublas_grouped: grouped->run(cublas, stream); break;
    }
  };
  try {
    launch();  // warm-up: module loading, kernel attributes, cuBLAS heuristics
  } catch (const kc::ch07::UnsupportedGpu& e) {
    kc::check(cudaStreamDestroy(stream));
    state.SkipWithError(e.what());
    return;
  }
  kc::check(cudaStreamSynchronize(stream));
  time_with_clock(state, [&] { kc::bench::time_batches(state, stream, 1, [&](int) { launch(); }); });
  kc::check(cudaStreamDestroy(stream));
  kc::bench::grouped::set_case_counters(state, cs, host_offsets);
}

// limit: the longer of the case's fewest bytes at the measured copy rate and cuBLAS's dense GEMM of
// all its rows (see the top of the file), both timed in every iteration.
void bench_limit(benchmark::State& state, const GroupedCase& cs) {
  const std::vector<std::int32_t> host_offsets = kc::ch05::offsets_of_sizes(cs.sizes);
  const double min_bytes = kc::ch05::grouped_gemm_min_bytes(cs.shape, host_offsets);
  const kc::ch02::GemmShape dense{host_offsets.back(), cs.shape.n, cs.shape.k};
  const auto mk = static_cast<std::size_t>(dense.m * dense.k);
  const auto nk = static_cast<std::size_t>(dense.n * dense.k);
  const auto mn = static_cast<std::size_t>(dense.m * dense.n);
  kc::DeviceBuffer<bf16> a(mk), w(nk), c(mn);
  kc::fill_uniform_device(a.data(), mk, 1, -1.0, 1.0);
  kc::fill_uniform_device(w.data(), nk, 2, -1.0, 1.0);
  const std::size_t copy_bytes = std::min(static_cast<std::size_t>(min_bytes / 2), kMaxCopyBytes);
  kc::DeviceBuffer<unsigned char> src(copy_bytes), dst(copy_bytes);
  src.fill_bytes(1);  // synchronises the device: the fills above are done
  cudaStream_t stream;
  kc::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const kc::ch02::CublasHandle cublas;
  auto copy = [&](int) {
    kc::check(cudaMemcpyAsync(dst.data(), src.data(), copy_bytes, cudaMemcpyDeviceToDevice, stream));
  };
  auto gemm = [&](int) { kc::ch02::cublas_gemm_bf16(cublas, a.data(), w.data(), c.data(), dense, stream); };
  copy(0);  // warm-up: cuBLAS's workspace and heuristics
  gemm(0);
  kc::check(cudaStreamSynchronize(stream));
  kc::EventTimer timer;
  // Each floor is timed in its own steady state, as every variant runs back to back: the copies in a
  // batch after a batch of them untimed, then the GEMMs in batches after one untimed. Timed right after
  // the other kind of work, either runs at the SM clock that work left behind (a 0.7 ms GEMM after a
  // copy ran wholly at the top clock, before the power limit pulls it down), not the one it settles
  // at. Batches last at least kSteadyBatchSeconds, sized from rates above any Hopper GPU's (5 TB/s
  // copies, 1 PFLOP/s bf16), so they are the same in every repetition (Google Benchmark needs that).
  const double copy_seconds_bound = 2.0 * static_cast<double>(copy_bytes) / 5e12;
  const double gemm_seconds_bound = 2.0 * static_cast<double>(dense.m) * static_cast<double>(dense.n) * dense.k / 1e15;
  const int copies = std::max(1, static_cast<int>(std::ceil(kSteadyBatchSeconds / copy_seconds_bound)));
  const int batch = std::max(1, static_cast<int>(std::ceil(kSteadyBatchSeconds / gemm_seconds_bound)));
  timer.time_launches(stream, copies, copy);                               // settle
  const double copy_s = timer.time_launches(stream, copies, copy) * 1e-3;  // per copy
  const double bytes_s = min_bytes / (2.0 * static_cast<double>(copy_bytes) / copy_s);
  timer.time_launches(stream, batch, gemm);  // settle
  double gemm_floor_s = 0.0;
  int device = 0;
  kc::check(cudaGetDevice(&device));
  std::vector<unsigned> gemm_clock;  // the SM clock while cuBLAS's dense GEMMs run
  while (state.KeepRunningBatch(batch)) {
    kc::bench::SmClockSampler clock(device, std::chrono::microseconds(250));
    const double gemm_s = timer.time_launches(stream, batch, gemm) * 1e-3;  // per GEMM
    clock.stop();
    gemm_clock.insert(gemm_clock.end(), clock.samples().begin(), clock.samples().end());
    gemm_floor_s += gemm_s * batch;
    state.SetIterationTime(std::max(bytes_s, gemm_s) * batch);
  }
  kc::check(cudaStreamDestroy(stream));
  kc::bench::grouped::set_case_counters(state, cs, host_offsets);
  const double iterations = static_cast<double>(std::max<benchmark::IterationCount>(state.iterations(), 1));
  state.counters["copy_floor_us"] = bytes_s * 1e6;
  state.counters["gemm_floor_us"] = gemm_floor_s / iterations * 1e6;
  const double gemm_mhz = kc::bench::median_mhz(std::move(gemm_clock));
  if (gemm_mhz > 0.0) state.counters["sm_clock_mhz"] = gemm_mhz;
}

void register_benchmarks(const kc::DeviceInfo& device) {
  // kc::bench::run let through any GPU of sm_90 or newer; the kernels are sm_90a code.
  if (auto reason = kc::ch07::hopper_unavailable_reason(device.cc_major, device.cc_minor)) {
    std::printf("Skipping Chapter 8's benchmarks: %s\n", reason->c_str());
    return;
  }
  const std::vector<GroupedCase> all = benchmark_cases();
  std::vector<std::string> labels;
  for (const GroupedCase& cs : all) labels.push_back(cs.label);
  kc::bench::check_case_labels(labels);
  const bool wide_tile = kc::ch05::grouped_tile_supported(kc::ch05::GroupedTile::wide_128x256);

  auto add = [](const std::string& variant, const GroupedCase& cs, Variant v,
                GroupedStep step = GroupedStep::a_evict_last) {
    const std::string name = "ch08/" + variant + "/" + cs.label;
    kc::bench::configure(benchmark::RegisterBenchmark(
        name.c_str(), [cs, v, step](benchmark::State& st) { bench_case(st, cs, v, step); }));
  };
  for (const GroupedCase& cs : all) {
    if (!kc::bench::grouped::fits_device(cs, device)) {
      std::printf("Skipping %s: its inputs do not fit this GPU's memory\n", cs.label.c_str());
      continue;
    }
    benchmark::AddCustomContext("group_sizes/" + cs.label, kc::bench::grouped::encode_group_sizes(cs.sizes));
    add("before", cs, Variant::before);
    if (wide_tile) add("step0_ch05_one_launch", cs, Variant::ch05_one_launch);
    for (GroupedStep step : kc::ch08::kGroupedSteps) {
      add(kc::ch08::to_string(step), cs, Variant::hopper_step, step);
    }
    add("after", cs, Variant::after);
    if (cs.label.starts_with("G8xM4096_")) add("order_row_major", cs, Variant::row_major_order);
    add("vendor_cublas_loop", cs, Variant::cublas_loop);
    add("vendor_cublas_grouped", cs, Variant::cublas_grouped);
    kc::bench::configure(benchmark::RegisterBenchmark(("ch08/limit/" + cs.label).c_str(),
                                                      [cs](benchmark::State& st) { bench_limit(st, cs); }));
  }
}

}  // namespace

// Below sm_90 kc::bench::run says there is no suitable GPU and exits 0; above it, register_benchmarks
// says why it registers nothing.
int main(int argc, char** argv) { return kc::bench::run(argc, argv, register_benchmarks, 9, 0); }
