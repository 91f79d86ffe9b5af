// Chapter 3 benchmark: a linear layer's epilogue, fused into the GEMM or not.
//
// Cases (DESIGN.md naming): the memory-bound MoE shapes M = 16 and 128 with N = 4096, K = 7168 and
// the epilogue bias + GELU(tanh) + residual; the compute-bound 4096³ with bias + GELU(tanh); and
// SwiGLU at the same M and K with N = 2 × 4096 stacked gate/up rows → 4096 outputs.
// Variants: before (Chapter 2's GEMM, then the separate vectorized passes), after (the fused
// epilogue), step0_gemm_only (the same GEMM with no epilogue: what fusion should cost nothing over),
// vendor (cuBLASLt with its GELU_BIAS epilogue, plus our residual pass where there is a residual),
// vendor_plain (plain cuBLASLt, then the same passes as before). pytorch comes from
// tools/pytorch_baselines.py.
//
// Counters: bytes_per_second from the layer's fewest bytes (A, W, bias, residual read once, the
// output written once; layer_min_bytes), the same for every variant; flops = 2·M·N·K.
// Inputs rotate over enough independent sets to exceed twice the L2: the 58.7 MB weight of the
// M = 16 and 128 cases would otherwise sit in the 60 MB L2 and every launch after the first would
// read it from the cache.
#include <cuda_bf16.h>

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fused_epilogue.hpp"
#include "gemm_bf16.hpp"
#include "kc/bench.hpp"
#include "kc/check.hpp"
#include "kc/device_buffer.hpp"
#include "kc/random.hpp"
#include "vendor_cublaslt.hpp"

namespace {

using bf16 = __nv_bfloat16;
using kc::ch03::Activation;
using kc::ch03::Epilogue;
using kc::ch03::GemmShape;

constexpr std::size_t kMaxRotationBytes = std::size_t{8} << 30;

struct Case {
  GemmShape shape;
  bool residual;  // bias + gelu_tanh (+ residual), or SwiGLU when swiglu
  bool swiglu;
};

std::string case_label(const Case& c) {
  const GemmShape& s = c.shape;
  const std::string base = "bf16_M" + std::to_string(s.m) + "_N" + std::to_string(s.n) + "_K" + std::to_string(s.k);
  if (c.swiglu) return base + "_swiglu";
  return base + (c.residual ? "_bias_gelu_res" : "_bias_gelu");
}

// One rotating set of device buffers: inputs filled on the device, outputs and scratch untouched.
struct Set {
  kc::DeviceBuffer<bf16> a, w, bias, residual, c, scratch;
  bool swiglu = false;
  Epilogue epilogue() {
    if (swiglu) return {nullptr, Activation::silu, nullptr, true};
    return {bias.data(), Activation::gelu_tanh, residual.size() > 0 ? residual.data() : nullptr, false};
  }
};

enum class Variant { before, after, step0_gemm_only, vendor, vendor_plain };

const char* variant_name(Variant v) {
  switch (v) {
    case Variant::before: return "before";
    case Variant::after: return "after";
    case Variant::step0_gemm_only: return "step0_gemm_only";
    case Variant::vendor: return "vendor";
    case Variant::vendor_plain: return "vendor_plain";
  }
  return "unknown";
}

void bench_case(benchmark::State& state, const kc::DeviceInfo& device, const Case& cs, Variant variant) {
  const GemmShape s = cs.shape;
  const auto mk = static_cast<std::size_t>(s.m * s.k), nk = static_cast<std::size_t>(s.n * s.k);
  const auto mn = static_cast<std::size_t>(s.m * s.n);
  const std::size_t out = cs.swiglu ? mn / 2 : mn;
  const std::size_t set_bytes = sizeof(bf16) * (mk + nk + s.n + (cs.residual ? out : 0) + out + (cs.swiglu ? mn : 0));
  const std::size_t sets = kc::bench::rotation_sets(set_bytes, device, kMaxRotationBytes);
  std::vector<Set> rot;
  for (std::size_t i = 0; i < sets; ++i) {
    Set& set = rot.emplace_back(Set{kc::DeviceBuffer<bf16>(mk), kc::DeviceBuffer<bf16>(nk),
                                    kc::DeviceBuffer<bf16>(cs.swiglu ? 0 : static_cast<std::size_t>(s.n)),
                                    kc::DeviceBuffer<bf16>(cs.residual ? out : 0), kc::DeviceBuffer<bf16>(out),
                                    kc::DeviceBuffer<bf16>(cs.swiglu ? mn : 0), cs.swiglu});
    kc::fill_uniform_device(set.a.data(), mk, 4 * i + 1, -1.0, 1.0);
    kc::fill_uniform_device(set.w.data(), nk, 4 * i + 2, -0.05, 0.05);
    if (set.bias.size() > 0) kc::fill_uniform_device(set.bias.data(), set.bias.size(), 4 * i + 3, -1.0, 1.0);
    if (set.residual.size() > 0) kc::fill_uniform_device(set.residual.data(), out, 4 * i + 4, -1.0, 1.0);
  }
  const double min_bytes = kc::ch03::layer_min_bytes(s, rot[0].epilogue());
  // cuBLASLt plans (handle, workspace, heuristic) are made here, outside the timed region.
  std::unique_ptr<kc::ch03::CublasLtLinear> lt;
  if (variant == Variant::vendor || variant == Variant::vendor_plain) {
    if (cs.swiglu) {
      state.SkipWithError("cuBLASLt has no SwiGLU epilogue");
      return;
    }
    try {
      lt = std::make_unique<kc::ch03::CublasLtLinear>(s, variant == Variant::vendor);
    } catch (const std::exception& e) {  // e.g. no algorithm for this shape and epilogue
      state.SkipWithError(e.what());
      return;
    }
  }
  auto launch = [&](Set& set, cudaStream_t stream) {
    const Epilogue e = set.epilogue();
    switch (variant) {
      case Variant::before:
        kc::ch03::linear_unfused(set.a.data(), set.w.data(), set.c.data(), s, e, set.scratch.data(), stream);
        break;
      case Variant::after: kc::ch03::linear_fused(set.a.data(), set.w.data(), set.c.data(), s, e, stream); break;
      case Variant::step0_gemm_only:
        // SwiGLU's plain GEMM writes all N columns: into scratch, as the unfused path does.
        kc::ch02::gemm_bf16(set.a.data(), set.w.data(), cs.swiglu ? set.scratch.data() : set.c.data(), s, stream);
        break;
      case Variant::vendor:
        lt->run(set.a.data(), set.w.data(), set.bias.data(), set.c.data(), stream);
        if (e.residual != nullptr) kc::ch03::add_residual(set.c.data(), e.residual, s.m, s.n, stream);
        break;
      case Variant::vendor_plain:
        lt->run(set.a.data(), set.w.data(), nullptr, set.c.data(), stream);
        kc::ch03::bias_activation(set.c.data(), e.bias, s.m, s.n, e.activation, stream);
        if (e.residual != nullptr) kc::ch03::add_residual(set.c.data(), e.residual, s.m, s.n, stream);
        break;
    }
  };
  cudaStream_t stream;
  kc::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // The fills ran on the legacy default stream, which a non-blocking stream does not wait for.
  kc::check(cudaStreamSynchronize(nullptr));
  launch(rot[0], stream);  // warm-up: module loading, cuBLASLt's first call
  kc::check(cudaStreamSynchronize(stream));
  std::size_t next = 0;
  kc::bench::time_batches(state, stream, kc::bench::batch_for_bytes(min_bytes),
                          [&](int) { launch(rot[next++ % sets], stream); });
  kc::check(cudaStreamDestroy(stream));
  kc::bench::set_counters(state, min_bytes, 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * s.k);
  state.counters["rotating_sets"] = static_cast<double>(sets);
}

void register_benchmarks(const kc::DeviceInfo& device) {
  const Case cases[] = {
      {{16, 4096, 7168}, true, false}, {{128, 4096, 7168}, true, false}, {{4096, 4096, 4096}, false, false},
      {{16, 8192, 7168}, false, true}, {{128, 8192, 7168}, false, true}, {{4096, 8192, 4096}, false, true},
  };
  for (const Case& cs : cases) {
    for (Variant v :
         {Variant::before, Variant::after, Variant::step0_gemm_only, Variant::vendor, Variant::vendor_plain}) {
      if (cs.swiglu && (v == Variant::vendor || v == Variant::vendor_plain)) continue;  // no cuBLASLt SwiGLU
      const std::string name = std::string("ch03/") + variant_name(v) + "/" + case_label(cs);
      kc::bench::configure(benchmark::RegisterBenchmark(
          name.c_str(), [&device, cs, v](benchmark::State& st) { bench_case(st, device, cs, v); }));
    }
  }
}

}  // namespace

int main(int argc, char** argv) { return kc::bench::run(argc, argv, register_benchmarks); }
