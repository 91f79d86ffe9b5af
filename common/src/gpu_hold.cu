// The GPU-side hold that EventTimer puts in front of its start event (timer.hpp says why).
#include "kc/check.hpp"
#include "kc/timer.hpp"

namespace kc {

namespace {
// One thread reads the GPU's nanosecond clock until the time has passed. %globaltimer ticks in steps
// of about a microsecond on recent GPUs: plenty for a hold of tens of microseconds.
__global__ void hold_kernel(unsigned long long nanoseconds) {
  unsigned long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < nanoseconds);
}
}  // namespace

void hold_stream(cudaStream_t stream, unsigned microseconds) {
  hold_kernel<<<1, 1, 0, stream>>>(static_cast<unsigned long long>(microseconds) * 1000ull);
  check_launch();
}

}  // namespace kc
