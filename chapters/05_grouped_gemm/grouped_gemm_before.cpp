// Before: a host loop over experts, one Chapter 2 GEMM launch per non-empty expert, as a framework
// writes it (`for e in range(E): out[s:t] = x[s:t] @ w[e].T`). It needs every group size on the
// host, so the caller has already paid a device → host copy and a synchronisation for them.
//
// What it costs besides that synchronisation: each launch covers one expert's tiles only. At 128
// rows per expert and N = 4096, a launch is 1 × 32 blocks of 128 × 128, which fills 32 of an H200's
// 132 SMs; the next expert's launch starts only as the last of them finishes. One launch of all the
// tiles (grouped_gemm_after.cu) keeps every SM busy.
#include "gemm_bf16.hpp"
#include "grouped_gemm.hpp"

namespace kc::ch05 {

void grouped_gemm_loop(const GroupedGemmShape& shape, const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c,
                       std::span<const std::int32_t> host_offsets, cudaStream_t stream) {
  validate_host_offsets(shape, host_offsets);
  validate_grouped_gemm(shape, a, w, c, host_offsets.data());
  for (int e = 0; e < shape.experts; ++e) {
    const std::int64_t row0 = host_offsets[e];
    const std::int64_t rows = host_offsets[e + 1] - row0;
    if (rows == 0) continue;  // an empty expert launches nothing
    ch02::gemm_bf16_with_tile(a + row0 * shape.k, w + static_cast<std::int64_t>(e) * shape.n * shape.k,
                              c + row0 * shape.n, ch02::GemmShape{rows, shape.n, shape.k}, ch02::GemmBf16Tile::medium,
                              stream);
  }
}

}  // namespace kc::ch05
