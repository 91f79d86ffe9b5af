// After: 16-byte vector loads in a grid-stride loop that fills the GPU once.
//
// Three changes over the one-thread-per-element kernel, each aimed at keeping more bytes in flight
// per instruction and per thread, because a memory-bound kernel is fast only when enough requests
// are outstanding to cover the ~600-800 ns DRAM latency (Little's law: bandwidth x latency ≈ 3 MB
// in flight on an H200):
//   1. float4 accesses: one LDG.128 moves 16 bytes where LDG.32 moved 4 - a quarter of the
//      load/store instructions for the same bytes.
//   2. unroll: each thread issues all its loads (kUnroll float4 of a and of b) before the first add,
//      so they are in flight together instead of one after the other.
//   3. grid-stride loop over a grid sized to the GPU (SMs x blocks per SM): every block lives for the
//      whole kernel, with no block-scheduling gaps, and any n works with the same launch.
// float4 needs 16-byte-aligned addresses. cudaMalloc returns 256-byte-aligned memory, but a caller
// may pass `p + 1`; if a, b and c share the same offset within 16 bytes, we peel 1-3 scalar elements
// (the head) until all three are aligned. If their offsets differ, no shared float4 view exists and
// every element takes the scalar path.
#include <string>

#include "kc/check.hpp"
#include "vector_add.hpp"

namespace kc::ch01 {

namespace {

__device__ __forceinline__ float4 add4(float4 x, float4 y) {
  // exercise 1: Return the element-wise sum of two float4 (make_float4 builds one from four floats).
  // stub: (void)x;
  // stub: (void)y;
  // stub: return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  return make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
  // end exercise 1
}

// Elements [0, head) and [tail_begin, n) are added one float at a time; the n4 float4 in between
// through the aligned float4 views.
template <int kUnroll>
__global__ void vector_add_vectorized(const float* a, const float* b, float* c, std::int64_t head, std::int64_t n4,
                                      std::int64_t n) {
  const std::int64_t thread = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;

  const float4* a4 = reinterpret_cast<const float4*>(a + head);
  const float4* b4 = reinterpret_cast<const float4*>(b + head);
  float4* c4 = reinterpret_cast<float4*>(c + head);

  std::int64_t i = thread;
  // Main loop: kUnroll float4 per array per thread, all loads issued before any store.
  for (; i + (kUnroll - 1) * stride < n4; i += kUnroll * stride) {
    float4 x[kUnroll], y[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      // exercise 2: Load the u-th float4 of a and of b for this thread. This thread's float4 in this
      // exercise 2: step are i, i + stride, i + 2 * stride, ...: neighbouring threads must read
      // exercise 2: neighbouring float4 (coalescing), so the step between a thread's own loads is `stride`.
      // stub: x[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      // stub: y[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      x[u] = a4[i + u * stride];
      y[u] = b4[i + u * stride];
      // end exercise 2
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      // exercise 3: Store add4(x[u], y[u]) to the matching float4 of c.
      // stub: (void)c4;
      c4[i + u * stride] = add4(x[u], y[u]);
      // end exercise 3
    }
  }
  // Remainder of the float4 body: fewer than kUnroll * stride float4 are left.
  for (; i < n4; i += stride) c4[i] = add4(a4[i], b4[i]);

  // Scalar head and tail (at most 3 elements each, or everything in the fallback).
  for (std::int64_t j = thread; j < head; j += stride) c[j] = a[j] + b[j];
  // exercise 4: The tail. Elements [head + 4 * n4, n) are not covered by the float4 body: add them one
  // exercise 4: float at a time with a grid-stride loop like the head's. Which test sizes fail without it?
  // stub: (void)n;
  const std::int64_t tail_begin = head + 4 * n4;
  for (std::int64_t j = tail_begin + thread; j < n; j += stride) c[j] = a[j] + b[j];
  // end exercise 4
}

template <int kUnroll>
void launch(const float* a, const float* b, float* c, std::int64_t head, std::int64_t n4, std::int64_t n,
            unsigned blocks, int threads, cudaStream_t stream) {
  vector_add_vectorized<kUnroll><<<blocks, threads, 0, stream>>>(a, b, c, head, n4, n);
}

std::uintptr_t offset_in_16_bytes(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16; }

}  // namespace

void vector_add_after(const float* a, const float* b, float* c, std::int64_t n, cudaStream_t stream,
                      const VectorizedConfig& config) {
  validate_vector_add(a, b, c, n);
  validate_vectorized_config(config);
  if (n == 0) return;

  // Split [0, n) into a scalar head, a float4 body and a scalar tail.
  std::int64_t head = n;  // fallback: all scalar
  std::int64_t n4 = 0;
  const std::uintptr_t offset = offset_in_16_bytes(a);
  if (offset_in_16_bytes(b) == offset && offset_in_16_bytes(c) == offset) {
    const std::int64_t to_alignment = static_cast<std::int64_t>((16 - offset) % 16 / sizeof(float));
    head = to_alignment < n ? to_alignment : n;
    n4 = (n - head) / 4;
  }
  const std::int64_t tail = n - head - 4 * n4;

  // Enough threads for the work, but no more than the GPU holds at once: the loop covers the rest.
  int device = 0, sms = 0;
  check(cudaGetDevice(&device));
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  std::int64_t work_per_thread_step = (n4 + config.unroll - 1) / config.unroll;
  if (head > work_per_thread_step) work_per_thread_step = head;
  if (tail > work_per_thread_step) work_per_thread_step = tail;
  const std::int64_t wanted = (work_per_thread_step + config.threads_per_block - 1) / config.threads_per_block;
  const std::int64_t resident = static_cast<std::int64_t>(sms) * config.blocks_per_sm;
  const auto blocks = static_cast<unsigned>(wanted < resident ? wanted : resident);

  switch (config.unroll) {
    case 1: launch<1>(a, b, c, head, n4, n, blocks, config.threads_per_block, stream); break;
    case 2: launch<2>(a, b, c, head, n4, n, blocks, config.threads_per_block, stream); break;
    default: launch<4>(a, b, c, head, n4, n, blocks, config.threads_per_block, stream); break;
  }
  check_launch();
}

}  // namespace kc::ch01
