// Chapter 9 benchmark: the grouped GEMM of an MoE layer's experts at decode sizes on Hopper,
// C = A · W[e]ᵀ per expert, bf16 in and out, fp32 accumulation, in Chapter 5's layout (A [M_total, K],
// W [E, N, K], offsets on the device), swapped (Cᵀ = W[e] · Aᵀ) against Chapter 8's unswapped kernel,
// cuBLAS and the copy rate.
//
// Cases (decode_benchmark_cases, decode_cases.hpp):
//   DeepSeek-V3 up (N 4096, K 7168), 32 experts of 1 to 256 rows: G32xM{1,2,4,8,16,32,64,128,256}
//   (the crossover between the two kernels).
//   DeepSeek-V3 decode batches: dsv3_decode_T{1,8,32,128}_E256_k8_N4096_K7168, T tokens routed top-8
//   over 256 experts by Chapter 4's DeepSeek-V3 routing reference (seeded logits, zero bias).
//   Mixtral up (N 28672, K 4096): G8xM{1,4,16,64}. Qwen3-30B-A3B gate and up (N 1536, K 2048):
//   G128xM{1,4,16}.
// Variants: before (Chapter 8's `after`, grouped_gemm_hopper), step1_swapped_operands and
// step2_deep_pipeline (DeepSeek-V3's cases), step3_token_tile (grouped_gemm_swap_ab), after (grouped_gemm_decode: the
// dispatch), vendor_cublas_grouped (cublasGemmGroupedBatchedEx over the non-empty experts), limit
// (the case's fewest bytes at the measured copy rate: device-to-device copies of S = min(fewest bytes
// / 2, 1 GiB) bytes back to back for at least 20 ms, after a batch of them untimed, taking t each; an
// iteration's time is fewest bytes / (2 S / t)). pytorch (torch._grouped_mm) and pytorch_bmm
// (torch.bmm where every group is equal) come from tools/pytorch_baselines.py.
//
// The fewest bytes are A, the weights of the non-empty experts and C, once each; at these sizes the
// weights are over 99 % of them, so decode is bound by streaming the active experts' weights.
// vendor_cublas_grouped needs the group sizes on the host: the benchmark copies the device offsets to
// the host once, outside the timed region. Each case's group sizes go into the JSON context as
// "group_sizes/<case>" (Chapter 8's encoding); the PyTorch baseline reads them from there.
//
// Counters: every variant, limit included, counts the same FLOPs (2 · rows · N · K) and the same
// fewest bytes, so "× limit" is the floor's time over the variant's; limit adds copy_floor_us. Every
// variant adds sm_clock_mhz (the median of NVML's SM clock sampled every 2 ms while it is timed,
// absent where NVML does not answer). Every case's active weights exceed 7 × the 60 MB L2 (470 MB to
// 1.9 GB), so one input set is enough; the launches take 0.1-0.5 ms: one launch per event pair.
//
// Hopper only: on another GPU, or in a build without sm_90a kernels, the program registers nothing and
// says why (as Chapter 7's).
//
// Run time at --benchmark_repetitions=5 (tools/gpu_suite.sh), estimated: 126 benchmarks × (5
// repetitions × ~0.3 s + ~4 set-ups × ~0.1 s (the DeepSeek-V3 routed cases fill 15 GB of weights))
// ≈ 240 s.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "05_grouped_gemm_inputs.hpp"
#include "decode_cases.hpp"
#include "grouped_gemm.hpp"
#include "hopper_gemm.hpp"
#include "hopper_grouped_gemm.hpp"
#include "kc/bench.hpp"
#include "kc/check.hpp"
#include "kc/device_buffer.hpp"
#include "kc/sm_clock.hpp"
#include "kc/timer.hpp"
#include "swap_ab.hpp"
#include "vendor_cublas.hpp"
#include "vendor_grouped.hpp"

namespace {

using bf16 = __nv_bfloat16;
using kc::ch05::GroupedCase;
using kc::ch05::GroupedGemmShape;
using kc::ch09::SwapStep;

// limit's copy: S bytes read and S written, S at most this.
constexpr std::size_t kMaxCopyBytes = std::size_t{1} << 30;
// limit's copies are timed in batches of at least this long.
constexpr double kSteadyBatchSeconds = 0.02;

enum class Variant { before, swap_step, after, cublas_grouped };

// One variant on one case. @p step is the swapped step for Variant::swap_step (ignored otherwise).
void bench_case(benchmark::State& state, const GroupedCase& cs, Variant variant, SwapStep step) {
  const GroupedGemmShape& s = cs.shape;
  kc::bench::grouped::Inputs in(cs);
  const bf16* a = in.a.data();
  const bf16* w = in.w.data();
  bf16* c = in.c.data();
  const std::int32_t* offsets = in.offsets.data();
  kc::DeviceBuffer<unsigned char> workspace(kc::ch08::grouped_gemm_hopper_workspace_bytes(s));
  cudaStream_t stream;
  kc::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::unique_ptr<kc::ch02::CublasHandle> cublas;  // cuBLAS's variant only: its set-up takes a while
  std::unique_ptr<kc::ch05::CublasGroupedGemm> grouped;
  if (variant == Variant::cublas_grouped) {
    cublas = std::make_unique<kc::ch02::CublasHandle>();
    grouped = std::make_unique<kc::ch05::CublasGroupedGemm>(s, a, w, c, in.host_offsets);
  }
  const kc::ch08::GroupedEpilogue plain{kc::ch08::EpilogueKind::plain};
  auto launch = [&] {
    switch (variant) {
      case Variant::before:
        kc::ch08::grouped_gemm_hopper(s, a, w, c, offsets, plain, workspace.data(), workspace.size(), stream);
        break;
      case Variant::swap_step: kc::ch09::grouped_gemm_swap_ab(step, s, a, w, c, offsets, plain, stream); break;
      case Variant::after:
        kc::ch09::grouped_gemm_decode(s, a, w, c, offsets, plain, workspace.data(), workspace.size(), stream);
        break;
      case Variant::cublas_grouped: grouped->run(*cublas, stream); break;
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
  int device = 0;
  kc::check(cudaGetDevice(&device));
  kc::bench::SmClockSampler clock(device);
  kc::bench::time_batches(state, stream, 1, [&](int) { launch(); });
  const double mhz = clock.stop();
  if (mhz > 0.0) state.counters["sm_clock_mhz"] = mhz;
  kc::check(cudaStreamDestroy(stream));
  kc::bench::grouped::set_case_counters(state, cs, in.host_offsets);
}

// limit: the case's fewest bytes at the copy rate, measured in every iteration (see the top).
void bench_limit(benchmark::State& state, const GroupedCase& cs) {
  const std::vector<std::int32_t> host_offsets = kc::ch05::offsets_of_sizes(cs.sizes);
  const double min_bytes = kc::ch05::grouped_gemm_min_bytes(cs.shape, host_offsets);
  const std::size_t copy_bytes = std::min(static_cast<std::size_t>(min_bytes / 2), kMaxCopyBytes);
  kc::DeviceBuffer<unsigned char> src(copy_bytes), dst(copy_bytes);
  src.fill_bytes(1);
  cudaStream_t stream;
  kc::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto copy = [&](int) {
    kc::check(cudaMemcpyAsync(dst.data(), src.data(), copy_bytes, cudaMemcpyDeviceToDevice, stream));
  };
  // Batches of at least kSteadyBatchSeconds, sized from a rate above any Hopper GPU's (5 TB/s), so
  // they are the same in every repetition (Google Benchmark needs that).
  const double copy_seconds_bound = 2.0 * static_cast<double>(copy_bytes) / 5e12;
  const int copies = std::max(1, static_cast<int>(std::ceil(kSteadyBatchSeconds / copy_seconds_bound)));
  kc::EventTimer timer;
  timer.time_launches(stream, copies, copy);  // settle
  int device = 0;
  kc::check(cudaGetDevice(&device));
  kc::bench::SmClockSampler clock(device);
  // A batch of copies counts as that many iterations of the floor, so Google Benchmark sizes the run
  // by the copies' real time.
  double floor_s_total = 0.0;
  while (state.KeepRunningBatch(copies)) {
    const double copy_s = timer.time_launches(stream, copies, copy) * 1e-3;  // per copy
    const double floor_s = min_bytes / (2.0 * static_cast<double>(copy_bytes) / copy_s);
    floor_s_total += floor_s * copies;
    state.SetIterationTime(floor_s * copies);
  }
  const double mhz = clock.stop();
  kc::check(cudaStreamDestroy(stream));
  kc::bench::grouped::set_case_counters(state, cs, host_offsets);
  const double iterations = static_cast<double>(std::max<benchmark::IterationCount>(state.iterations(), 1));
  state.counters["copy_floor_us"] = floor_s_total / iterations * 1e6;
  if (mhz > 0.0) state.counters["sm_clock_mhz"] = mhz;
}

void register_benchmarks(const kc::DeviceInfo& device) {
  // kc::bench::run let through any GPU of sm_90 or newer; the kernels are sm_90a code.
  if (auto reason = kc::ch07::hopper_unavailable_reason(device.cc_major, device.cc_minor)) {
    std::printf("Skipping Chapter 9's benchmarks: %s\n", reason->c_str());
    return;
  }
  const std::vector<GroupedCase> all = kc::ch09::decode_benchmark_cases();
  std::vector<std::string> labels;
  for (const GroupedCase& cs : all) labels.push_back(cs.label);
  kc::bench::check_case_labels(labels);

  auto add = [](const std::string& variant, const GroupedCase& cs, Variant v, SwapStep step = SwapStep::token_tile) {
    const std::string name = "ch09/" + variant + "/" + cs.label;
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
    // Steps 1 and 2 on DeepSeek-V3's cases (N 4096, K 7168), where the lesson compares the steps.
    const bool deepseek = cs.shape.n == 4096 && cs.shape.k == 7168;
    for (SwapStep step : {SwapStep::swapped_operands, SwapStep::deep_pipeline, SwapStep::token_tile}) {
      if (deepseek || step == SwapStep::token_tile) add(kc::ch09::to_string(step), cs, Variant::swap_step, step);
    }
    add("after", cs, Variant::after);
    add("vendor_cublas_grouped", cs, Variant::cublas_grouped);
    kc::bench::configure(benchmark::RegisterBenchmark(("ch09/limit/" + cs.label).c_str(),
                                                      [cs](benchmark::State& st) { bench_limit(st, cs); }));
  }
}

}  // namespace

// Below sm_90 kc::bench::run says there is no suitable GPU and exits 0; above it, register_benchmarks
// says why it registers nothing.
int main(int argc, char** argv) { return kc::bench::run(argc, argv, register_benchmarks, 9, 0); }
