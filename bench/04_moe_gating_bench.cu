// Chapter 4 benchmark: MoE gating, logits [T, E] fp32 -> weights [T, k], ids [T, k], counts [E].
//
// Cases: T in {1, 16, 256, 4096, 65536} x (E, k) in {(8,2), (64,6), (128,8), (256,8), (384,8)},
// softmax -> top-k with renormalisation (label fp32_T{T}_E{E}_k{k}), and DeepSeek-V3 routing
// (E = 256, n_group 8, topk_group 4, k = 8, factor 2.5; label fp32_dsv3_T{T}).
// Variants: before (three kernels + workspace), after (one kernel; counts as CountMode::automatic
// picks, moe_gating.hpp),
// after_counts_fused and after_counts_separate (each way of counting at every size), after_no_counts (the
// same kernel, weights and ids only: the router's cost where the counts come from elsewhere), limit (a
// copy kernel moving logits + outputs bytes, copy_bytes). pytorch comes from tools/pytorch_baselines.py.
// Also the cost of the warp primitives the kernels are built from (warp_primitives.hpp): variants
// latency and throughput of cases primitive_shfl_xor, primitive_redux_max, primitive_vote_any and
// primitive_ffma, with counters cycles_per_op and warp_ops_per_sm_clock (no bytes).
//
// Bytes: every variant counts the case's fewest bytes: logits read once, weights + ids + counts
// written once (4 T E + 8 T k + 4 E for fp32); limit copies half that many bytes, so the bytes it
// moves (read + write) are the same number.
// Inputs rotate over enough sets to exceed twice the L2.
//
// Timing: a batch of launches captured once into a CUDA graph, the graph replayed between two
// events, the L2 emptied before each replay by reading a buffer twice its size (every launch of a
// replay reads inputs no launch has touched since). A read, not kc::bench::L2Flusher's memset: a
// memset leaves the L2 full of dirty lines, and their write-back to DRAM then lands inside the
// timed replay, slowing whatever is bound by DRAM. A
// router launch takes microseconds, less than the host needs to enqueue it (a launch through the
// runtime costs the CPU a few microseconds); timed as a stream of ordinary launches, a batch
// measures how fast the host enqueues, once the GPU has caught up with it. A graph is enqueued once, and it is how
// inference engines run the layer anyway.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kc/bench.hpp"
#include "kc/check.hpp"
#include "kc/device_buffer.hpp"
#include "kc/random.hpp"
#include "moe_gating.hpp"
#include "warp_primitives.hpp"

namespace {

constexpr std::size_t kMaxRotationBytes = std::size_t{4} << 30;

double min_bytes(const kc::ch04::GatingParams& p) {
  const double t = static_cast<double>(p.num_tokens);
  return 4.0 * t * p.num_experts + 8.0 * t * p.k + 4.0 * p.num_experts;
}

enum class Variant {
  before,
  after_automatic,
  after_fused,
  after_separate,
  after_no_counts,
  limit,  // copy_bytes: a copy kernel
};

// The limit's copy: n bytes from src to dst, 16 bytes a load, four loads in flight a thread before
// the first store. A kernel, not cudaMemcpyAsync: captured into a graph, a device-to-device
// cudaMemcpyAsync becomes a memcpy node, which measured slower than the same copy
// launched on a stream, while a kernel runs the same either way. Both pointers
// are 16-byte aligned (the caller's buffers are), the tail of n % 16 bytes is copied bytewise.
__global__ void copy_bytes(const unsigned char* __restrict__ src, unsigned char* __restrict__ dst, std::size_t n) {
  const auto* src_words = reinterpret_cast<const int4*>(src);
  auto* dst_words = reinterpret_cast<int4*>(dst);
  const std::size_t words = n / sizeof(int4);
  constexpr int kInFlight = 4;
  const std::size_t threads = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (kInFlight - 1) * threads < words; i += kInFlight * threads) {
    int4 w[kInFlight];
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) w[j] = __ldcs(src_words + i + j * threads);  // read once: streaming
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) __stcs(dst_words + i + j * threads, w[j]);
  }
  for (; i < words; i += threads) __stcs(dst_words + i, __ldcs(src_words + i));
  const std::size_t tail = words * sizeof(int4) + static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (tail < n) dst[tail] = src[tail];
}

// Reads `count` 16-byte words and folds them into one value, stored only if it has a value the
// buffer's zeros never give: the loads cannot be dropped, and nothing is written.
__global__ void read_to_evict(const int4* __restrict__ words, std::size_t count, int* __restrict__ sink) {
  int folded = 0;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const int4 w = __ldcg(words + i);  // cached in L2 only: the point is to fill the L2
    folded |= w.x | w.y | w.z | w.w;
  }
  if (folded == 1) *sink = folded;
}

// Empties the L2 of the timed launches' data without leaving dirty lines: reads a zeroed buffer of
// twice the L2's size, so every line the L2 held is replaced by a clean one (a dirty line is
// written back during the read, outside the timed region).
class L2Evictor {
 public:
  explicit L2Evictor(const kc::DeviceInfo& device)
      : words_(2 * device.l2_bytes / sizeof(int4)), sink_(1), blocks_(4 * static_cast<unsigned>(device.sm_count)) {
    kc::check(cudaMemset(words_.data(), 0, words_.size() * sizeof(int4)));
    kc::check(cudaDeviceSynchronize());
  }
  void evict(cudaStream_t stream) {
    read_to_evict<<<blocks_, 256, 0, stream>>>(words_.data(), words_.size(), sink_.data());
    kc::check_launch();
  }

 private:
  kc::DeviceBuffer<int4> words_;
  kc::DeviceBuffer<int> sink_;
  unsigned blocks_;
};

// Times `batch` calls of launch(i) captured once into a CUDA graph: each pass empties the L2 (a read,
// L2Evictor), then replays the graph between two events (EventTimer::time_graph). Google Benchmark counts a pass as
// `batch` iterations, so it reports the time per launch.
template <typename LaunchFn>
void time_graph_batches(benchmark::State& state, const kc::DeviceInfo& device, cudaStream_t stream, int batch,
                        LaunchFn&& launch) {
  cudaGraph_t graph = nullptr;
  kc::check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < batch; ++i) launch(i);
  kc::check(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  kc::check(cudaGraphInstantiate(&exec, graph, 0));
  kc::check(cudaGraphLaunch(exec, stream));  // warm-up: uploads the graph
  kc::check(cudaStreamSynchronize(stream));
  L2Evictor evictor(device);
  kc::EventTimer timer;
  while (state.KeepRunningBatch(batch)) {
    evictor.evict(stream);
    state.SetIterationTime(timer.time_graph(exec, stream, 1) * 1e-3);
  }
  kc::check(cudaGraphExecDestroy(exec));
  kc::check(cudaGraphDestroy(graph));
}

void bench_case(benchmark::State& state, const kc::DeviceInfo& device, kc::ch04::GatingParams p, Variant v) {
  const auto t = static_cast<std::size_t>(p.num_tokens);
  const auto e = static_cast<std::size_t>(p.num_experts);
  const auto k = static_cast<std::size_t>(p.k);
  const double bytes = min_bytes(p);
  // A small case needs many sets to exceed 2 x L2 (T = 1, E = 8: 80 bytes, ~1.5 million sets), so
  // each kind of buffer is one slab that set s indexes into: four allocations, one fill.
  const std::size_t sets = kc::bench::rotation_sets(static_cast<std::size_t>(bytes), device, kMaxRotationBytes);
  kc::DeviceBuffer<float> logits(sets * t * e), weights(sets * t * k);
  kc::DeviceBuffer<std::int32_t> ids(sets * t * k), counts(sets * e);
  kc::fill_uniform_device(logits.data(), logits.size(), 1, -4.0, 4.0);
  std::vector<float> bias_host(e);
  kc::fill_uniform(std::span<float>(bias_host), 77, -0.1, 0.1);
  kc::DeviceBuffer<float> bias(bias_host);
  const float* bias_ptr = p.scoring == kc::ch04::Scoring::deepseek_v3 ? bias.data() : nullptr;
  kc::DeviceBuffer<unsigned char> workspace(kc::ch04::gating_before_workspace_bytes(p));
  // limit: one contiguous copy of the same number of bytes. A copy of n bytes reads n and writes n:
  // n = min_bytes / 2 moves exactly min_bytes. Each set starts 16-byte aligned (copy_bytes).
  const bool copies = v == Variant::limit;
  const auto copy_n = static_cast<std::size_t>(bytes / 2);
  const std::size_t copy_stride = (copy_n + sizeof(int4) - 1) / sizeof(int4) * sizeof(int4);
  kc::DeviceBuffer<unsigned char> copy_src(copies ? copy_stride * sets : 0);
  kc::DeviceBuffer<unsigned char> copy_dst(copies ? copy_stride * sets : 0);
  if (copies) kc::check(cudaMemset(copy_src.data(), 0x5a, copy_src.size()));
  // A thread a 16-byte word, up to 8 blocks of 256 an SM; beyond that the grid strides (a large
  // copy keeps four loads in flight a thread).
  const std::size_t copy_words = copy_n / sizeof(int4);
  const auto copy_blocks = static_cast<unsigned>(
      std::clamp<std::size_t>((copy_words + 255) / 256, 1, 8 * static_cast<std::size_t>(device.sm_count)));
  cudaStream_t stream;
  kc::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  kc::check(cudaDeviceSynchronize());
  std::size_t next = 0;
  const auto launch = [&](int) {
    const std::size_t s = next++ % sets;
    const float* set_logits = logits.data() + s * t * e;
    const kc::ch04::GatingOutputs out{weights.data() + s * t * k, ids.data() + s * t * k, counts.data() + s * e};
    switch (v) {
      case Variant::before:
        kc::ch04::gating_before(p, set_logits, bias_ptr, out, workspace.data(), workspace.size(), stream);
        break;
      case Variant::after_fused:
        kc::ch04::gating_after(p, set_logits, bias_ptr, out, stream, kc::ch04::CountMode::fused_atomics);
        break;
      case Variant::after_automatic: kc::ch04::gating_after(p, set_logits, bias_ptr, out, stream); break;
      case Variant::after_separate:
        kc::ch04::gating_after(p, set_logits, bias_ptr, out, stream, kc::ch04::CountMode::separate_kernel);
        break;
      case Variant::after_no_counts:
        kc::ch04::gating_after(p, set_logits, bias_ptr, kc::ch04::GatingOutputs{out.weights, out.ids, nullptr}, stream);
        break;
      case Variant::limit:
        copy_bytes<<<copy_blocks, 256, 0, stream>>>(copy_src.data() + s * copy_stride,
                                                    copy_dst.data() + s * copy_stride, copy_n);
        kc::check_launch();
        break;
    }
  };
  const int batch = kc::bench::batch_for_bytes(bytes);
  time_graph_batches(state, device, stream, batch, launch);
  kc::check(cudaStreamDestroy(stream));
  if (copies) {  // the copy of set 0 (the first launch captured) must have arrived, every byte
    std::vector<unsigned char> src_host(copy_n), dst_host(copy_n);
    kc::check(cudaMemcpy(src_host.data(), copy_src.data(), copy_n, cudaMemcpyDeviceToHost));
    kc::check(cudaMemcpy(dst_host.data(), copy_dst.data(), copy_n, cudaMemcpyDeviceToHost));
    if (src_host != dst_host) state.SkipWithError("the limit's copy did not copy set 0");
  }
  kc::bench::set_counters(state, bytes);
  state.counters["rotating_sets"] = static_cast<double>(sets);
}

std::vector<std::string> labels;  // every case label, checked for prefixes in register_benchmarks

void register_case(const kc::DeviceInfo& device, const std::string& label, const kc::ch04::GatingParams& p) {
  labels.push_back(label);
  const struct {
    const char* name;
    Variant v;
  } variants[] = {{"before", Variant::before},
                  {"after", Variant::after_automatic},  // counts as CountMode::automatic picks
                  {"after_counts_fused", Variant::after_fused},
                  {"after_counts_separate", Variant::after_separate},
                  {"after_no_counts", Variant::after_no_counts},
                  {"limit", Variant::limit}};
  for (const auto& v : variants) {
    const std::string name = "ch04/" + std::string(v.name) + "/" + label;
    // Graph replays repeat to within a fraction of a percent (cv 0.0-0.5 %), so 0.1 s a
    // repetition is enough, and the chapter's 180 rows fit one device call with the tests.
    kc::bench::configure(benchmark::RegisterBenchmark(name.c_str(), [&device, p, variant = v.v](benchmark::State& s) {
      bench_case(s, device, p, variant);
    }))->MinTime(0.1);
  }
}

// What a cross-lane instruction costs (warp_primitives.hpp): each primitive's latency (one warp, one
// dependent chain: counter cycles_per_op) and throughput (every SM full, independent chains:
// counter warp_ops_per_sm_clock), both in SM cycles from the kernel's own clock. The time column is
// the microbenchmark's own run time and has no bytes.
void bench_primitive(benchmark::State& state, const kc::DeviceInfo& device,
                     const kc::ch04::WarpPrimitiveConfig& config) {
  const auto blocks = static_cast<std::size_t>(kc::ch04::warp_primitive_blocks(config, device.sm_count));
  kc::DeviceBuffer<kc::ch04::PrimitiveSample> samples(blocks);
  cudaStream_t stream;
  kc::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  kc::ch04::warp_primitive(config, device.sm_count, samples.data(), stream);  // warm-up
  kc::check(cudaStreamSynchronize(stream));
  kc::bench::time_batches(state, stream, 1,
                          [&](int) { kc::ch04::warp_primitive(config, device.sm_count, samples.data(), stream); });
  kc::check(cudaStreamSynchronize(stream));
  // The counters come from the last timed launch's samples (read after the timing).
  const std::vector<kc::ch04::PrimitiveSample> host = samples.to_host();
  const unsigned expected = kc::ch04::expected_primitive_checksum(config);
  for (const kc::ch04::PrimitiveSample& s : host) {
    if (s.checksum != expected) {
      state.SkipWithError("a block's checksum differs from the host's: the chains did not compute what they should");
      break;
    }
  }
  if (config.mode == kc::ch04::PrimitiveMode::latency) {
    state.counters["cycles_per_op"] = kc::ch04::primitive_cycles_per_op(config, host);
  } else {
    state.counters["warp_ops_per_sm_clock"] = kc::ch04::primitive_ops_per_sm_clock(config, device.sm_count, host);
  }
  kc::check(cudaStreamDestroy(stream));
}

void register_primitives(const kc::DeviceInfo& device) {
  using kc::ch04::WarpPrimitive;
  for (WarpPrimitive primitive :
       {WarpPrimitive::shfl_xor, WarpPrimitive::redux_max, WarpPrimitive::vote_any, WarpPrimitive::ffma}) {
    const std::string label = std::string("primitive_") + kc::ch04::to_string(primitive);
    labels.push_back(label);
    for (kc::ch04::PrimitiveMode mode : {kc::ch04::PrimitiveMode::latency, kc::ch04::PrimitiveMode::throughput}) {
      kc::ch04::WarpPrimitiveConfig config;
      config.primitive = primitive;
      config.mode = mode;
      const std::string name =
          std::string("ch04/") + (mode == kc::ch04::PrimitiveMode::latency ? "latency" : "throughput") + "/" + label;
      kc::bench::configure(benchmark::RegisterBenchmark(
          name.c_str(), [&device, config](benchmark::State& s) { bench_primitive(s, device, config); }));
    }
  }
}

void register_benchmarks(const kc::DeviceInfo& device) {
  const std::int64_t tokens[] = {1, 16, 256, 4096, 65536};
  const int shapes[][2] = {{8, 2}, {64, 6}, {128, 8}, {256, 8}, {384, 8}};
  for (std::int64_t t : tokens) {
    for (const auto& shape : shapes) {
      kc::ch04::GatingParams p;
      p.num_tokens = t;
      p.num_experts = shape[0];
      p.k = shape[1];
      p.renormalize = true;
      // "_k8" ends the label, so fp32_T1_E8_k2 is never a prefix of fp32_T16_E8_k2 ("T1_" vs "T16").
      register_case(
          device, "fp32_T" + std::to_string(t) + "_E" + std::to_string(shape[0]) + "_k" + std::to_string(shape[1]), p);
    }
    kc::ch04::GatingParams d;
    d.num_tokens = t;
    d.num_experts = 256;
    d.k = 8;
    d.scoring = kc::ch04::Scoring::deepseek_v3;
    d.n_group = 8;
    d.topk_group = 4;
    d.routed_scaling_factor = 2.5f;
    // "fp32_dsv3_T1" would be a prefix of "fp32_dsv3_T16": T = 1 is written T01 (it still sorts as 1).
    register_case(device, std::string("fp32_dsv3_T") + (t == 1 ? "01" : std::to_string(t)), d);
  }
  register_primitives(device);
  kc::bench::check_case_labels(labels);  // DESIGN.md: no label is a prefix of another
}

}  // namespace

int main(int argc, char** argv) { return kc::bench::run(argc, argv, register_benchmarks); }
