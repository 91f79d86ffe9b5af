// The router at decode sizes (moe_stages.hpp, router_logits_decode): logits[t, e] = x[t] · router[e]
// for T <= kRouterDecodeTokens. Chapter 7's GEMM covers [T, E] = [1, 256] with one 128 × 256 tile, so
// one SM walks all of K and reads the whole router (DeepSeek-V3: 3.7 MB) alone, one K slice after the
// other. The router at T = 1 is a weight stream, as decode's experts are: here a block per router
// row reads its row in 16-byte pieces, up to eight per thread in flight at once, each thread keeps
// one fp32 sum per token, and E blocks read the router at once.
#include "kc/check.hpp"
#include "moe_stages.hpp"

namespace kc::ch10::detail {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kInFlight = 8;  // 16-byte router pieces a thread has in flight at once

// The two bf16 of a 32-bit word as floats: a bf16 is the top half of a float's bits.
__device__ __forceinline__ float low_bf16(unsigned word) { return __uint_as_float(word << 16); }
__device__ __forceinline__ float high_bf16(unsigned word) { return __uint_as_float(word & 0xFFFF0000u); }

// The eight products of a 16-byte piece of a router row and the same piece of a token row, added to
// @p sum in order.
__device__ __forceinline__ float add_dot8(float sum, uint4 w, uint4 x) {
  const unsigned ws[4] = {w.x, w.y, w.z, w.w}, xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    sum = fmaf(low_bf16(ws[i]), low_bf16(xs[i]), sum);
    sum = fmaf(high_bf16(ws[i]), high_bf16(xs[i]), sum);
  }
  return sum;
}

__global__ void __launch_bounds__(kThreads)
    router_decode_kernel(const uint4* __restrict__ x, const uint4* __restrict__ router, int tokens, int experts,
                         int row_vectors, __nv_bfloat16* __restrict__ logits) {
  const int e = static_cast<int>(blockIdx.x);
  const uint4* w = router + static_cast<std::int64_t>(e) * row_vectors;
  // Token t's sum in sum[t]: a NaN in one token's row stays in that token's logits.
  float sum[kRouterDecodeTokens] = {};
  // The thread's pieces v = thread + 128 · j, kInFlight at a time: a batch's loads are all issued
  // before the first is used, so the thread waits for DRAM once per batch, not once per piece (one
  // batch covers DeepSeek-V3's 7168 columns). The sums still take the pieces in order.
  for (int base = static_cast<int>(threadIdx.x); base < row_vectors; base += kThreads * kInFlight) {
    uint4 wv[kInFlight];
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) {
      const int v = base + j * kThreads;
      if (v < row_vectors) wv[j] = __ldg(w + v);  // the router is read once: every piece by one thread
    }
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) {
      const int v = base + j * kThreads;
#pragma unroll
      for (int t = 0; t < kRouterDecodeTokens; ++t) {
        if (v < row_vectors && t < tokens) {
          sum[t] = add_dot8(sum[t], wv[j], __ldg(x + static_cast<std::int64_t>(t) * row_vectors + v));
        }
      }
    }
  }
  // The block's sum in a fixed order (each warp's by shuffles, then warp 0's, 1's, ...): the same
  // bits on every run, and equal router rows give equal logits (ties stay ties).
  __shared__ float warp_sums[kWarps][kRouterDecodeTokens];
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
#pragma unroll
  for (int t = 0; t < kRouterDecodeTokens; ++t) {
    float s = sum[t];
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xFFFFFFFFu, s, offset);
    if (lane == 0) warp_sums[warp][t] = s;
  }
  __syncthreads();
  const int t = static_cast<int>(threadIdx.x);
  if (t < tokens) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kWarps; ++i) s += warp_sums[i][t];
    logits[static_cast<std::int64_t>(t) * experts + e] = __float2bfloat16(s);
  }
}

}  // namespace

void router_logits_decode(std::int64_t tokens, int experts, std::int64_t hidden, const __nv_bfloat16* x,
                          const __nv_bfloat16* router, __nv_bfloat16* logits, cudaStream_t stream) {
  if (tokens < 1 || tokens > kRouterDecodeTokens) {
    throw InvalidArgument("tokens (" + std::to_string(tokens) + ") must be in [1, " +
                          std::to_string(kRouterDecodeTokens) + "] for the router's decode kernel");
  }
  // hidden is a multiple of 8 (moe_config_rules) and x and the router are 16-byte aligned
  // (validate_moe_layer): both rows are whole 16-byte pieces.
  router_decode_kernel<<<static_cast<unsigned>(experts), kThreads, 0, stream>>>(
      reinterpret_cast<const uint4*>(x), reinterpret_cast<const uint4*>(router), static_cast<int>(tokens), experts,
      static_cast<int>(hidden / 8), logits);
  check_launch();
}

}  // namespace kc::ch10::detail
