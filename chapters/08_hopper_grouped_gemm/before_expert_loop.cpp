// Before: a host loop over experts, Chapter 7's `after` launched once per non-empty expert on its rows
// of A and C and its W (`for e in range(E): out[s:t] = x[s:t] @ w[e].T` with the best dense kernel).
// It needs every group size on the host, so the caller has already paid a device → host copy and a
// synchronisation for them.
//
// What it costs besides that synchronisation: each launch covers one expert's tiles only, and Chapter
// 7's grid holds as many clusters as the GPU does or as the expert has tiles, whichever is fewer. At
// 128 rows per expert and N = 4096 a launch is 16 tiles of 128 × 256: 16 of 132 SMs busy, each
// launch waiting for the one before. The grouped kernels walk every expert's tiles in one launch.
#include "hopper_gemm.hpp"
#include "hopper_grouped_gemm.hpp"

namespace kc::ch08 {

void grouped_gemm_hopper_loop(const GroupedGemmShape& shape, const __nv_bfloat16* a, const __nv_bfloat16* w,
                              __nv_bfloat16* c, std::span<const std::int32_t> host_offsets, cudaStream_t stream) {
  ch05::validate_host_offsets(shape, host_offsets);
  ch05::validate_grouped_gemm(shape, a, w, c, host_offsets.data());
  for (int e = 0; e < shape.experts; ++e) {
    const std::int64_t row0 = host_offsets[e];
    const std::int64_t rows = host_offsets[e + 1] - row0;
    if (rows == 0) continue;  // an empty expert launches nothing
    ch07::gemm_bf16_hopper(a + row0 * shape.k, w + static_cast<std::int64_t>(e) * shape.n * shape.k, c + row0 * shape.n,
                           ch07::GemmShape{rows, shape.n, shape.k}, stream);
  }
}

}  // namespace kc::ch08
