// Shared by Chapter 4's test files: the shapes, the inputs, the paths under test, the fp64 reference
// (computed once per case, in parallel over rows) and the check of one path against it.
//
// Tolerances. Ids must equal the reference exactly. Weights: 1e-5 relative Frobenius error. The
// kernels compute in fp32: one expf (a few ulp), a sum of at most 512 terms done as per-lane partial
// sums plus a 5-level butterfly (about 20 roundings deep, ~1e-6), one division: well inside 1e-5,
// while a wrong normalisation (a missing renormalisation, a dropped term) is off by far more.
// Counts are integers: exact.
//
// Input design. Every softmax path ranks the logits themselves, so any fp32 or bf16 logits give
// exact ids. DeepSeek-V3 ranks fp32 sigmoid + bias: there the fp64 reference and fp32 kernels agree exactly only when
// no two competing values are within fp32 rounding of each other, so those inputs are built with gaps (logits on a 1/64
// grid; DeepSeek selection scores from a Sidon set, so every group's top-2 sum differs too). Exact ties are made on
// purpose with duplicated values: equal inputs give equal fp32 values on every path, and the tie rule decides.
#pragma once

#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "fused_launch.cuh"
#include "kc/compare.hpp"
#include "kc/device_buffer.hpp"
#include "kc/random.hpp"
#include "kc/test_support.hpp"
#include "moe_gating.hpp"
#include "warp_primitives.hpp"

namespace kc::test::moe_gating {

using kc::ch04::CountMode;
using kc::ch04::GatingParams;
using kc::ch04::GatingReference;
using kc::ch04::Scoring;

inline GatingParams softmax_params(std::int64_t t, int e, int k, bool renormalize = false) {
  GatingParams p;
  p.num_tokens = t;
  p.num_experts = e;
  p.k = k;
  p.renormalize = renormalize;
  return p;
}

inline GatingParams dsv3_params(std::int64_t t, int e = 256, int k = 8, int n_group = 8, int topk_group = 4) {
  GatingParams p;
  p.num_tokens = t;
  p.num_experts = e;
  p.k = k;
  p.scoring = Scoring::deepseek_v3;
  p.n_group = n_group;
  p.topk_group = topk_group;
  p.routed_scaling_factor = 2.5f;
  return p;
}

// Logits for the softmax tests: a 1/64 grid in [-8, 8) (so probabilities of distinct logits are
// far apart in fp32, and duplicates, i.e. exact ties, are common), or raw uniform fp32 values.
inline std::vector<float> grid_logits(std::size_t count, std::uint64_t seed) {
  std::vector<float> x(count);
  kc::fill_uniform(std::span<float>(x), seed, -8.0, 8.0);
  for (float& v : x) v = std::floor(v * 64.0f) / 64.0f;
  return x;
}

// DeepSeek inputs with every decision at least ~1e-6 apart (see the file comment): logits on a
// permuted grid, bias = target - sigmoid(logit) where the targets come from the Sidon set
// {2pj + (j^2 mod p)} (all pairwise sums distinct), scaled into [0, 1].
inline void dsv3_inputs(std::int64_t t, int e, std::uint64_t seed, std::vector<float>& logits,
                        std::vector<float>& bias) {
  std::mt19937_64 rng(seed);
  const int prime = e <= 256 ? 257 : 521;
  std::vector<int> perm(static_cast<std::size_t>(e));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<double> target(static_cast<std::size_t>(e));
  for (int i = 0; i < e; ++i) {
    const long j = perm[i];
    target[i] = static_cast<double>(2 * prime * j + (j * j) % prime) / (2.0 * prime * prime);
  }
  logits.assign(static_cast<std::size_t>(t * e), 0.0f);
  bias.assign(static_cast<std::size_t>(e), 0.0f);
  std::vector<int> logit_rank(static_cast<std::size_t>(e));
  std::iota(logit_rank.begin(), logit_rank.end(), 0);
  std::shuffle(logit_rank.begin(), logit_rank.end(), rng);
  for (int i = 0; i < e; ++i) {
    const double x = (logit_rank[i] - e / 2) * (8.0 / e);
    bias[i] = static_cast<float>(target[i] - 1.0 / (1.0 + std::exp(-x)));
  }
  // Every row holds the same logits: the bias is per expert, and the gaps hold only for this pairing.
  for (std::int64_t r = 0; r < t; ++r) {
    for (int i = 0; i < e; ++i) logits[r * e + i] = static_cast<float>((logit_rank[i] - e / 2) * (8.0 / e));
  }
}

inline std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }
inline std::vector<double> widen(const std::vector<__nv_bfloat16>& v) {
  std::vector<double> d(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) d[i] = kc::to_double(v[i]);
  return d;
}

// The fp64 reference of a case. Rows are independent, so it runs on row slices in parallel (one per
// hardware thread, at least 512 rows each) and joins them: the same result as one call.
inline GatingReference reference(const GatingParams& p, const std::vector<double>& logits,
                                 const std::vector<double>& bias) {
  const std::int64_t t = p.num_tokens;
  const std::int64_t e = p.num_experts;
  const std::int64_t slices =
      std::clamp<std::int64_t>(t / 512, 1, std::max<std::int64_t>(1, std::thread::hardware_concurrency()));
  if (slices == 1) return kc::ch04::gating_reference(p, logits, bias);
  std::vector<GatingReference> part(static_cast<std::size_t>(slices));
  std::vector<std::thread> workers;
  const auto first_row = [&](std::int64_t s) { return t * s / slices; };
  for (std::int64_t s = 0; s < slices; ++s) {
    workers.emplace_back([&, s] {
      GatingParams q = p;
      q.num_tokens = first_row(s + 1) - first_row(s);
      const std::span<const double> rows(logits.data() + first_row(s) * e, static_cast<std::size_t>(q.num_tokens * e));
      part[static_cast<std::size_t>(s)] = kc::ch04::gating_reference(q, rows, bias);
    });
  }
  for (std::thread& w : workers) w.join();
  GatingReference all;
  all.counts.assign(static_cast<std::size_t>(e), 0);
  for (const GatingReference& r : part) {
    all.weights.insert(all.weights.end(), r.weights.begin(), r.weights.end());
    all.ids.insert(all.ids.end(), r.ids.begin(), r.ids.end());
    for (std::size_t i = 0; i < all.counts.size(); ++i) all.counts[i] += r.counts[i];
  }
  return all;
}

// step1_packed_keys and step2_lean_rounds: one step's kernel alone, through the chapter's internal
// launch functions (fp32 logits, counts fused, launched the ordinary way). Step 1 is what `after`
// runs past 2^30 logits, too large to test through gating_after().
enum class Path {
  before,
  after_fused,
  after_separate,
  after_no_counts,
  after_automatic,
  step1_packed_keys,
  step2_lean_rounds
};
inline const char* path_name(Path p) {
  switch (p) {
    case Path::before: return "before";
    case Path::after_fused: return "after_counts_fused";
    case Path::after_separate: return "after_counts_separate";
    case Path::after_no_counts: return "after_no_counts";
    case Path::after_automatic: return "after_counts_automatic";
    case Path::step1_packed_keys: return "step1_packed_keys";
    case Path::step2_lean_rounds: return "step2_lean_rounds";
  }
  return "unknown";
}

template <typename T>
void launch(Path path, const GatingParams& p, const T* logits, const float* bias, const kc::ch04::GatingOutputs& out,
            kc::DeviceBuffer<unsigned char>& workspace, cudaStream_t stream) {
  if (path == Path::before) {
    kc::ch04::gating_before(p, logits, bias, out, workspace.data(), workspace.size(), stream);
  } else if (path == Path::step1_packed_keys || path == Path::step2_lean_rounds) {
    if constexpr (std::is_same_v<T, float>) {
      kc::ch04::validate_gating(p, logits, bias, out);
      if (out.counts != nullptr) {
        kc::check(
            cudaMemsetAsync(out.counts, 0, static_cast<std::size_t>(p.num_experts) * sizeof(std::int32_t), stream));
      }
      if (p.num_tokens == 0) return;
      namespace fused = kc::ch04::fused;
      const fused::SoftmaxArgs a{out.weights,
                                 out.ids,
                                 out.counts,
                                 p.num_tokens,
                                 p.num_experts,
                                 p.k,
                                 p.scoring == Scoring::softmax_then_topk && !p.renormalize};
      const fused::LaunchOn on{stream, false, false, fused::current_gpu()};
      const bool vector = p.num_experts % 4 == 0;
      if (path == Path::step1_packed_keys) {
        vector ? fused::launch_packed_keys<float, 4>(logits, a, on)
               : fused::launch_packed_keys<float, 1>(logits, a, on);
      } else {
        vector ? fused::launch_lean_rounds<float, 4>(logits, a, on)
               : fused::launch_lean_rounds<float, 1>(logits, a, on);
      }
      kc::check_launch();
    } else {
      FAIL() << "the step paths take fp32 logits only";
    }
  } else if (path == Path::after_automatic) {
    kc::ch04::gating_after(p, logits, bias, out, stream);  // CountMode::automatic, the default
  } else if (path == Path::after_no_counts) {
    kc::ch04::gating_after(p, logits, bias, kc::ch04::GatingOutputs{out.weights, out.ids, nullptr}, stream);
  } else {
    kc::ch04::gating_after(p, logits, bias, out, stream,
                           path == Path::after_fused ? CountMode::fused_atomics : CountMode::separate_kernel);
  }
}

// Runs one path on device logits and checks ids (exact), weights (1e-5), counts (exact), poison, guards
// against the case's reference.
template <typename T>
void check_against(Path path, const GatingParams& p, const kc::DeviceBuffer<T>& d_logits, const float* d_bias,
                   const GatingReference& ref) {
  SCOPED_TRACE(std::string(path_name(path)) + " T=" + std::to_string(p.num_tokens) +
               " E=" + std::to_string(p.num_experts) + " k=" + std::to_string(p.k));
  const std::size_t tk = static_cast<std::size_t>(p.num_tokens) * static_cast<std::size_t>(p.k);
  kc::test::GuardedOutput<float> weights(tk);
  kc::test::GuardedOutput<std::int32_t> ids(tk);
  kc::test::GuardedOutput<std::int32_t> counts(static_cast<std::size_t>(p.num_experts));
  kc::DeviceBuffer<unsigned char> workspace(kc::ch04::gating_before_workspace_bytes(p));
  launch(path, p, d_logits.data(), d_bias, {weights.data(), ids.data(), counts.data()}, workspace, nullptr);
  kc::check(cudaDeviceSynchronize());

  const std::vector<std::int32_t> got_ids = ids.to_host();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < tk; ++i) wrong += got_ids[i] != ref.ids[i] ? 1 : 0;
  EXPECT_EQ(wrong, 0u) << "ids must equal the reference exactly";
  kc::test::expect_close(kc::compare<float>(weights.to_host(), ref.weights, kc::test::kPoisonByte), 1e-5, "weights");
  if (path == Path::after_no_counts) {
    EXPECT_EQ(kc::count_poisoned(std::span<const std::int32_t>(counts.to_host()), kc::test::kPoisonByte),
              static_cast<std::size_t>(p.num_experts))
        << "no counts asked for: nothing written there";
  } else if (p.num_tokens > 0) {
    EXPECT_EQ(counts.to_host(), ref.counts);
  } else {
    EXPECT_EQ(counts.to_host(), std::vector<std::int32_t>(static_cast<std::size_t>(p.num_experts), 0))
        << "T = 0 launches no kernel but still writes the counts (zeros)";
  }
  EXPECT_EQ(weights.guard_damage() + ids.guard_damage() + counts.guard_damage(), 0u) << "wrote past the end";
}

// Checks every path in @p paths on one case; the reference is computed once for all of them.
template <typename T>
void check_paths(std::initializer_list<Path> paths, const GatingParams& p, const std::vector<T>& logits,
                 const std::vector<float>& bias = {}) {
  const kc::DeviceBuffer<T> d_logits(logits);
  const kc::DeviceBuffer<float> d_bias(bias);
  const GatingReference ref = reference(p, widen(logits), std::vector<double>(bias.begin(), bias.end()));
  for (Path path : paths) check_against(path, p, d_logits, bias.empty() ? nullptr : d_bias.data(), ref);
}

template <typename T>
void check_case(Path path, const GatingParams& p, const std::vector<T>& logits, const std::vector<float>& bias = {}) {
  check_paths({path}, p, logits, bias);
}

class MoeGatingGpu : public kc::test::GpuTest {};

// The warp primitives whose cost the benchmark measures, and a configuration of one of them.
inline constexpr kc::ch04::WarpPrimitive kPrimitives[] = {
    kc::ch04::WarpPrimitive::shfl_xor, kc::ch04::WarpPrimitive::redux_max, kc::ch04::WarpPrimitive::vote_any,
    kc::ch04::WarpPrimitive::ffma};

inline kc::ch04::WarpPrimitiveConfig primitive_config(kc::ch04::WarpPrimitive primitive, kc::ch04::PrimitiveMode mode,
                                                      int iterations = 8) {
  kc::ch04::WarpPrimitiveConfig c;
  c.primitive = primitive;
  c.mode = mode;
  c.iterations = iterations;
  return c;
}

}  // namespace kc::test::moe_gating
