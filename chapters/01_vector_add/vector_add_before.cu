// Before: the first CUDA kernel most people write. One thread per element.
//
// It is already coalesced: thread i of a warp reads a[i], so the 32 threads of a warp read 128
// consecutive bytes, four 32-byte sectors, the least memory traffic possible. What it leaves on
// the table: every thread issues 4-byte accesses (four times as many load/store instructions as
// 16-byte ones), and it launches n / 256 blocks, each doing a sliver of work before the next one is
// scheduled.
#include <string>

#include "kc/check.hpp"
#include "vector_add.hpp"

namespace kc::ch01 {

namespace {
constexpr int kThreadsPerBlock = 256;

__global__ void vector_add_one_per_thread(const float* a, const float* b, float* c, std::int64_t n) {
  // 64-bit index: blockIdx.x * blockDim.x overflows int beyond 2^31 elements.
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}
}  // namespace

void vector_add_before(const float* a, const float* b, float* c, std::int64_t n, cudaStream_t stream) {
  validate_vector_add(a, b, c, n);
  const std::int64_t blocks = (n + kThreadsPerBlock - 1) / kThreadsPerBlock;
  if (blocks > 0x7FFFFFFF) {
    throw InvalidArgument("n (" + std::to_string(n) + ") must be < 2^31 * 256 for one thread per element");
  }
  if (n == 0) return;  // a grid of zero blocks is a launch error
  vector_add_one_per_thread<<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream>>>(a, b, c, n);
  check_launch();
}

}  // namespace kc::ch01
