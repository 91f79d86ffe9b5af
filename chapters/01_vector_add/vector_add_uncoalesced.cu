// Uncoalesced on purpose: split the array into one contiguous chunk per thread, as one would
// between CPU threads. Same arithmetic, same bytes, very different memory traffic: at each step
// the 32 threads of a warp touch 32 addresses a chunk apart, so one warp-wide load needs 32
// sectors of 32 bytes for 128 useful bytes. The profile helper shows it as sectors per request.
#include "kc/check.hpp"
#include "vector_add.hpp"

namespace kc::ch01 {

namespace {
constexpr int kThreadsPerBlock = 256;

__global__ void vector_add_chunk_per_thread(const float* a, const float* b, float* c, std::int64_t n,
                                            std::int64_t chunk) {
  const std::int64_t thread = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t begin = thread * chunk;
  const std::int64_t end = begin + chunk < n ? begin + chunk : n;
  for (std::int64_t i = begin; i < end; ++i) c[i] = a[i] + b[i];
}
}  // namespace

void vector_add_uncoalesced(const float* a, const float* b, float* c, std::int64_t n, cudaStream_t stream) {
  validate_vector_add(a, b, c, n);
  if (n == 0) return;
  int device = 0, sms = 0;
  check(cudaGetDevice(&device));
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  // As many threads as the GPU holds at once (8 blocks of 256 per SM), each with one chunk.
  const std::int64_t max_threads = static_cast<std::int64_t>(sms) * 8 * kThreadsPerBlock;
  const std::int64_t threads = n < max_threads ? n : max_threads;
  const std::int64_t chunk = (n + threads - 1) / threads;
  const std::int64_t blocks = (threads + kThreadsPerBlock - 1) / kThreadsPerBlock;
  vector_add_chunk_per_thread<<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream>>>(a, b, c, n, chunk);
  check_launch();
}

}  // namespace kc::ch01
