// Chapter 10 benchmark: the forward pass of an MoE block (moe_layer.hpp), bf16, on Hopper.
//
// Cases `<model>_T<T>_bf16`: DeepSeek-V3 (dsv3: H 7168, I 2048, 256 experts, top-8 grouped routing,
// one shared expert), Mixtral 8×7B (mixtral: H 4096, I 14336, 8 experts, top-2) and Qwen3-30B-A3B
// (qwen3_30b_a3b: H 2048, I 768, 128 experts, top-8), T ∈ {1, 8, 64, 512, 4096}. x is uniform in
// [-1, 1]; the weights are uniform and scaled by 1 / sqrt(fan-in), as a trained layer's are, so the
// routing spreads the tokens as a real router does (DeepSeek-V3's correction bias uniform in ±0.1).
// Variants: before (moe_layer_before: the earlier chapters' kernels one stage after another), the
// fusion steps (step3 only where the model has a shared expert), after (moe_layer_after), limit
// (the longer of the fewest bytes at the copy rate and the sum of cuBLAS's dense GEMMs of the
// layer's projections: the router [T, E, H], up [T · k, 2I, H], down [T · k, H, I], and the shared
// expert's two, each timed back to back for at least 20 ms after an untimed batch). PyTorch's module
// comes from tools/pytorch_baselines.py.
//
// before and after also carry their stage breakdown (time_stages): stage_<name>_us per stage.
//
// Counters: every variant counts the same fewest bytes (x and y once, the router, the shared expert
// and every routed expert with at least one token, from the routing this benchmark's own layer
// computes, copied back once outside the timing) and FLOPs (moe_flops); limit adds copy_floor_us and
// gemm_floor_us. Every launch runs after an L2 flush (outside the timing): Qwen3's active experts at
// T = 1 are 75 MB, about the L2's size.
//
// Hopper only: on another GPU, or in a build without sm_90a kernels, the program registers nothing and
// says why.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hopper_gemm.hpp"
#include "kc/bench.hpp"
#include "kc/check.hpp"
#include "kc/device_buffer.hpp"
#include "kc/random.hpp"
#include "kc/timer.hpp"
#include "moe_layer.hpp"
#include "moe_stages.hpp"  // the stage breakdown: one stage alone
#include "moe_workspace.hpp"
#include "vendor_cublas.hpp"

namespace {

using bf16 = __nv_bfloat16;
using kc::ch10::MoeConfig;
using kc::ch10::MoeStep;

// limit's floors are timed in batches of at least this long.
constexpr double kSteadyBatchSeconds = 0.02;

// The layer's weights and input on the device, filled as the top of the file says (the routed
// experts, then the shared ones, in up and down).
struct DeviceLayer {
  kc::DeviceBuffer<bf16> x, router, up, down;
  kc::DeviceBuffer<float> bias;

  DeviceLayer(const MoeConfig& c, std::int64_t tokens)
      : x(static_cast<std::size_t>(tokens * c.hidden)),
        router(static_cast<std::size_t>(c.experts * c.hidden)),
        up(static_cast<std::size_t>((c.experts + c.shared_experts) * 2 * c.intermediate * c.hidden)),
        down(static_cast<std::size_t>((c.experts + c.shared_experts) * c.hidden * c.intermediate)),
        bias(static_cast<std::size_t>(c.experts)) {
    const double h = static_cast<double>(c.hidden);
    kc::fill_uniform_device(x.data(), x.size(), 1, -1.0, 1.0);
    kc::fill_uniform_device(router.data(), router.size(), 2, -2.0 / std::sqrt(h), 2.0 / std::sqrt(h));
    kc::fill_uniform_device(up.data(), up.size(), 3, -1.0 / std::sqrt(h), 1.0 / std::sqrt(h));
    const double di = 1.0 / std::sqrt(static_cast<double>(c.intermediate));
    kc::fill_uniform_device(down.data(), down.size(), 4, -di, di);
    kc::fill_uniform_device(bias.data(), bias.size(), 7, -0.1, 0.1);
    kc::check(cudaDeviceSynchronize());
  }

  kc::ch10::MoeWeights weights(const MoeConfig& c) const {
    kc::ch10::MoeWeights w;
    w.router = router.data();
    w.up = up.data();
    w.down = down.data();
    if (c.scoring == kc::ch04::Scoring::deepseek_v3) w.correction_bias = bias.data();
    return w;
  }
};

// One case's layer, kept while the case's variants run one after another (DeepSeek-V3's is 22.6 GB):
// a case asks for it, the last one built is handed back when it matches, rebuilt otherwise.
const DeviceLayer& layer_for(const MoeConfig& c, std::int64_t tokens) {
  static std::unique_ptr<DeviceLayer> layer;
  static std::string key;
  const std::string want = c.name + "/" + std::to_string(tokens);
  if (key != want) {
    layer.reset();  // free the last one first: two DeepSeek-V3 layers need not fit
    layer = std::make_unique<DeviceLayer>(c, tokens);
    key = want;
  }
  return *layer;
}

struct Case {
  MoeConfig config;
  std::int64_t tokens;
  std::string label;
};

std::vector<Case> benchmark_cases() {
  std::vector<Case> cases;
  for (const MoeConfig& c : {kc::ch10::deepseek_v3(), kc::ch10::mixtral_8x7b(), kc::ch10::qwen3_30b_a3b()}) {
    for (std::int64_t t : {1, 8, 64, 512, 4096}) cases.push_back({c, t, c.name + "_T" + std::to_string(t) + "_bf16"});
  }
  return cases;
}

// The routing's expert counts of this layer (one untimed launch), for the fewest bytes.
std::vector<std::int32_t> routed_counts(const Case& cs, const DeviceLayer& layer, void* workspace,
                                        std::size_t workspace_bytes, bf16* y, cudaStream_t stream) {
  kc::ch10::moe_layer_before(cs.config, cs.tokens, layer.x.data(), layer.weights(cs.config), y, workspace,
                             workspace_bytes, stream);
  std::vector<std::int32_t> counts(static_cast<std::size_t>(cs.config.experts));
  const kc::ch10::MoeRoutingView view = kc::ch10::moe_routing_in(cs.config, cs.tokens, workspace);
  kc::check(cudaMemcpyAsync(counts.data(), view.counts, counts.size() * 4, cudaMemcpyDeviceToHost, stream));
  kc::check(cudaStreamSynchronize(stream));
  return counts;
}

void set_case_counters(benchmark::State& state, const Case& cs, const std::vector<std::int32_t>& counts) {
  kc::bench::set_counters(state, kc::ch10::moe_min_bytes(cs.config, cs.tokens, counts),
                          kc::ch10::moe_flops(cs.config, cs.tokens));
}

// A launch of one variant of the layer (before, a step, after).
using LayerLaunch = std::function<void(const MoeConfig&, std::int64_t, const bf16*, const kc::ch10::MoeWeights&, bf16*,
                                       void*, std::size_t, cudaStream_t)>;

// The stages one variant enqueues: before's, or after's.
enum class Breakdown { none, before, after };

// The stage breakdown of before or after: each stage alone (the whole layer has just run, so every
// stage's inputs are in the workspace), after an L2 flush, the median of kStageRuns launches, as the
// counter stage_<name>_us. Stages the variant does not run are left out.
constexpr int kStageRuns = 7;

void time_stages(benchmark::State& state, const Case& cs, Breakdown breakdown, const DeviceLayer& layer, bf16* y,
                 void* workspace, kc::bench::L2Flusher& flusher, cudaStream_t stream) {
  namespace detail = kc::ch10::detail;
  const MoeConfig& c = cs.config;
  const detail::MoeWorkspace at(c, cs.tokens, workspace);
  const kc::ch10::MoeWeights weights = layer.weights(c);
  kc::EventTimer timer;
  for (std::string_view name : detail::kStages) {
    if (breakdown == Breakdown::after && (name == "swiglu" || name == "shared")) continue;  // fused away
    if (name == "shared" && c.shared_experts == 0) continue;
    std::vector<double> ms;
    for (int run = 0; run < kStageRuns; ++run) {
      flusher.flush(stream);
      ms.push_back(timer.time_launches(stream, 1, [&](int) {
        if (breakdown == Breakdown::before) {
          detail::enqueue_before(c, cs.tokens, layer.x.data(), weights, y, at, stream, name);
        } else {
          detail::enqueue_fused(detail::after_fusions(), c, cs.tokens, layer.x.data(), weights, y, at, stream, name);
        }
      }));
    }
    std::nth_element(ms.begin(), ms.begin() + kStageRuns / 2, ms.end());
    state.counters["stage_" + std::string(name) + "_us"] = ms[kStageRuns / 2] * 1e3;
  }
}

void bench_layer(benchmark::State& state, const Case& cs, const LayerLaunch& launch, Breakdown breakdown,
                 const kc::DeviceInfo& device) {
  const DeviceLayer& layer = layer_for(cs.config, cs.tokens);
  kc::DeviceBuffer<unsigned char> workspace(kc::ch10::moe_workspace_bytes(cs.config, cs.tokens));
  kc::DeviceBuffer<bf16> y(static_cast<std::size_t>(cs.tokens * cs.config.hidden));
  cudaStream_t stream;
  kc::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<std::int32_t> counts;
  try {
    counts = routed_counts(cs, layer, workspace.data(), workspace.size(), y.data(), stream);  // and the warm-up
  } catch (const kc::ch07::UnsupportedGpu& e) {
    kc::check(cudaStreamDestroy(stream));
    state.SkipWithError(e.what());
    return;
  }
  kc::bench::L2Flusher flusher(device);
  const kc::ch10::MoeWeights weights = layer.weights(cs.config);
  launch(cs.config, cs.tokens, layer.x.data(), weights, y.data(), workspace.data(), workspace.size(), stream);
  kc::check(cudaStreamSynchronize(stream));  // the variant's own warm-up (its kernels' attributes)
  kc::bench::time_batches(
      state, stream, 1,
      [&](int) {
        launch(cs.config, cs.tokens, layer.x.data(), weights, y.data(), workspace.data(), workspace.size(), stream);
      },
      [&] { flusher.flush(stream); });
  if (breakdown != Breakdown::none) {
    time_stages(state, cs, breakdown, layer, y.data(), workspace.data(), flusher, stream);
  }
  kc::check(cudaStreamDestroy(stream));
  set_case_counters(state, cs, counts);
}

// limit: see the top of the file.
void bench_limit(benchmark::State& state, const Case& cs) {
  const MoeConfig& c = cs.config;
  const DeviceLayer& layer = layer_for(c, cs.tokens);
  kc::DeviceBuffer<unsigned char> workspace(kc::ch10::moe_workspace_bytes(c, cs.tokens));
  kc::DeviceBuffer<bf16> y(static_cast<std::size_t>(cs.tokens * c.hidden));
  cudaStream_t stream;
  kc::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<std::int32_t> counts;
  try {
    counts = routed_counts(cs, layer, workspace.data(), workspace.size(), y.data(), stream);
  } catch (const kc::ch07::UnsupportedGpu& e) {
    kc::check(cudaStreamDestroy(stream));
    state.SkipWithError(e.what());
    return;
  }
  const double min_bytes = kc::ch10::moe_min_bytes(c, cs.tokens, counts);
  // The dense GEMMs: each projection over all its rows, operands from the layer's own buffers (the
  // routed ones read expert 0's weights: the same shape and bytes as any expert's).
  const std::int64_t pairs = cs.tokens * c.k, h = c.hidden, i = c.intermediate;
  const std::int64_t widest = std::max({pairs * 2 * i, pairs * h, cs.tokens * 2 * i, cs.tokens * h});
  kc::DeviceBuffer<bf16> a(static_cast<std::size_t>(pairs * std::max(h, 2 * i))), out(static_cast<std::size_t>(widest));
  kc::fill_uniform_device(a.data(), a.size(), 8, -1.0, 1.0);
  struct Gemm {
    const bf16* w;
    kc::ch02::GemmShape shape;
  };
  std::vector<Gemm> gemms{{layer.router.data(), {cs.tokens, c.experts, h}},
                          {layer.up.data(), {pairs, 2 * i, h}},
                          {layer.down.data(), {pairs, h, i}}};
  for (int s = 0; s < c.shared_experts; ++s) {
    gemms.push_back({layer.up.data() + (c.experts + s) * 2 * i * h, {cs.tokens, 2 * i, h}});
    gemms.push_back({layer.down.data() + (c.experts + s) * h * i, {cs.tokens, h, i}});
  }
  const kc::ch02::CublasHandle cublas;
  auto all_gemms = [&](int) {
    for (const Gemm& g : gemms) kc::ch02::cublas_gemm_bf16(cublas, a.data(), g.w, out.data(), g.shape, stream);
  };
  const std::size_t copy_bytes = std::min(static_cast<std::size_t>(min_bytes / 2), std::size_t{1} << 30);
  kc::DeviceBuffer<unsigned char> src(copy_bytes), dst(copy_bytes);
  src.fill_bytes(1);
  auto copy = [&](int) {
    kc::check(cudaMemcpyAsync(dst.data(), src.data(), copy_bytes, cudaMemcpyDeviceToDevice, stream));
  };
  all_gemms(0);  // warm-up: cuBLAS's heuristics
  kc::check(cudaStreamSynchronize(stream));
  // Batches sized from rates above any Hopper GPU's (5 TB/s, 1 PFLOP/s), the same in every repetition.
  double gemm_flops = 0.0;
  for (const Gemm& g : gemms) gemm_flops += 2.0 * g.shape.m * g.shape.n * g.shape.k;
  const int copies = std::max(1, static_cast<int>(std::ceil(kSteadyBatchSeconds / (2.0 * copy_bytes / 5e12))));
  const int batch = std::max(1, static_cast<int>(std::ceil(kSteadyBatchSeconds / (gemm_flops / 1e15))));
  kc::EventTimer timer;
  timer.time_launches(stream, copies, copy);  // settle
  const double copy_s = timer.time_launches(stream, copies, copy) * 1e-3;
  const double bytes_s = min_bytes / (2.0 * static_cast<double>(copy_bytes) / copy_s);
  timer.time_launches(stream, batch, all_gemms);  // settle
  double gemm_total = 0.0;
  while (state.KeepRunningBatch(batch)) {
    const double gemm_s = timer.time_launches(stream, batch, all_gemms) * 1e-3;  // per layer's GEMMs
    gemm_total += gemm_s * batch;
    state.SetIterationTime(std::max(bytes_s, gemm_s) * batch);
  }
  kc::check(cudaStreamDestroy(stream));
  set_case_counters(state, cs, counts);
  const double iterations = static_cast<double>(std::max<benchmark::IterationCount>(state.iterations(), 1));
  state.counters["copy_floor_us"] = bytes_s * 1e6;
  state.counters["gemm_floor_us"] = gemm_total / iterations * 1e6;
}

void register_benchmarks(const kc::DeviceInfo& device) {
  // kc::bench::run let through any GPU of sm_90 or newer; the kernels are sm_90a code.
  if (auto reason = kc::ch07::hopper_unavailable_reason(device.cc_major, device.cc_minor)) {
    std::printf("Skipping Chapter 10's benchmarks: %s\n", reason->c_str());
    return;
  }
  const std::vector<Case> all = benchmark_cases();
  std::vector<std::string> labels;
  for (const Case& cs : all) labels.push_back(cs.label);
  kc::bench::check_case_labels(labels);
  for (const Case& cs : all) {
    std::vector<std::pair<std::string, LayerLaunch>> layers{{"before", kc::ch10::moe_layer_before}};
    for (MoeStep step : kc::ch10::kMoeSteps) {
      // Step 4 changes nothing for a model without shared experts.
      if (step == MoeStep::shared_as_expert && cs.config.shared_experts == 0) continue;
      layers.emplace_back(
          kc::ch10::to_string(step),
          [step](const MoeConfig& c, std::int64_t t, const bf16* x, const kc::ch10::MoeWeights& w, bf16* y, void* ws,
                 std::size_t n, cudaStream_t s) { kc::ch10::moe_layer_step(step, c, t, x, w, y, ws, n, s); });
    }
    layers.emplace_back("after", kc::ch10::moe_layer_after);
    for (const auto& [variant, launch] : layers) {
      const Breakdown breakdown = variant == "before"  ? Breakdown::before
                                  : variant == "after" ? Breakdown::after
                                                       : Breakdown::none;
      kc::bench::configure(benchmark::RegisterBenchmark(
          ("ch10/" + variant + "/" + cs.label).c_str(),
          [cs, launch, breakdown, device](benchmark::State& st) { bench_layer(st, cs, launch, breakdown, device); }));
    }
    kc::bench::configure(benchmark::RegisterBenchmark(("ch10/limit/" + cs.label).c_str(),
                                                      [cs](benchmark::State& st) { bench_limit(st, cs); }));
  }
}

}  // namespace

int main(int argc, char** argv) { return kc::bench::run(argc, argv, register_benchmarks, 9, 0); }
