#include "kc/check.hpp"
#include "kc/random.hpp"

namespace kc {

namespace {
// The same value as the host fill: lo + width * u rounded to float, then (for bf16) to nearest bf16.
__device__ void store(float* out, std::size_t i, double v) { out[i] = static_cast<float>(v); }
__device__ void store(__nv_bfloat16* out, std::size_t i, double v) {
  out[i] = __float2bfloat16_rn(static_cast<float>(v));
}

template <typename T>
__global__ void fill_uniform_kernel(T* out, std::size_t count, std::uint64_t seed, double lo, double width) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    // __dmul_rn/__dadd_rn forbid fusing into an FMA, which would round differently from the host.
    store(out, i, __dadd_rn(lo, __dmul_rn(width, uniform01(seed, i))));
  }
}

template <typename T>
void launch_fill(T* out, std::size_t count, std::uint64_t seed, double lo, double hi, cudaStream_t stream) {
  if (count == 0) return;
  const std::size_t blocks = (count + 255) / 256;
  fill_uniform_kernel<<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), 256, 0, stream>>>(out, count, seed, lo,
                                                                                                  hi - lo);
  check_launch();
}
}  // namespace

void fill_uniform_device(float* out, std::size_t count, std::uint64_t seed, double lo, double hi, cudaStream_t stream) {
  launch_fill(out, count, seed, lo, hi, stream);
}

void fill_uniform_device(__nv_bfloat16* out, std::size_t count, std::uint64_t seed, double lo, double hi,
                         cudaStream_t stream) {
  launch_fill(out, count, seed, lo, hi, stream);
}

}  // namespace kc
