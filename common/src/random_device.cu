#include "kc/check.hpp"
#include "kc/random.hpp"

namespace kc {

namespace {
__global__ void fill_uniform_kernel(float* out, std::size_t count, std::uint64_t seed, double lo, double width) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    out[i] = static_cast<float>(lo + width * uniform01(seed, i));
  }
}
}  // namespace

void fill_uniform_device(float* out, std::size_t count, std::uint64_t seed, double lo, double hi, cudaStream_t stream) {
  if (count == 0) return;
  const std::size_t blocks = (count + 255) / 256;
  fill_uniform_kernel<<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), 256, 0, stream>>>(out, count, seed, lo,
                                                                                                  hi - lo);
  check_launch();
}

}  // namespace kc
