/// @file hopper_gemm.hpp
/// @brief Chapter 7: Chapter 2's bf16 GEMM rebuilt for Hopper (sm_90a) with TMA, wgmma and warp
/// specialization, one ladder step per kernel.
///
/// Layout and numerics are Chapter 2's (gemm_bf16.hpp): A is [M, K] row-major, W is [N, K] row-major,
/// C = A · Wᵀ is [M, N] row-major; bf16 in, fp32 accumulation, one round-to-nearest-even per output.
///
/// The ladder (each step its own kernel, file and benchmark variant):
///   1. step1_tma_wgmma.cu         TMA loads completing on an mbarrier, wgmma m64n128k16 from shared
///                                 memory with 128-byte swizzle; one warpgroup, a 64 × 128 tile, one buffer.
///   2. step2_pipeline.cu          a 128 × 128 tile on two warpgroups, 7 stages, full/empty mbarriers.
///   3. step3_warp_specialized.cu  a producer warpgroup issuing TMA, two consumer warpgroups on a
///                                 128 × 256 tile, registers moved to the consumers with setmaxnreg.
///   4. step4_persistent.cu        step 3 on a persistent grid (one block per SM) walking tiles in a
///                                 grouped order; the pipeline runs on across tiles; scale-d = 0.
///   5. step5_cluster_multicast.cu step 4 in clusters of two CTAs along M, each W tile loaded once
///                                 per cluster and multicast to both CTAs.
///   6. step6_tma_store.cu         step 5 with a TMA-store epilogue: C staged in shared memory with
///                                 stmatrix and written by TMA while the next tile's math runs.
/// The chapter's `after` is step 6's kernel as a programmatic dependent launch, with Stream-K on the
/// last round where splitting it saves at least 16 slices (gemm_bf16_hopper with a workspace).
/// Without a workspace, gemm_bf16_hopper is step 6 as a dependent launch, every tile whole.
///
/// Rules (checked on the host before any CUDA call; kc::InvalidArgument names the broken one):
///   - every dimension of @p shape in [1, 2^31 - 1] (Chapter 2's validate_gemm_shape);
///   - K a multiple of 8 and a, w 16-byte aligned: TMA reads rows whose byte stride is a multiple of 16
///     from a 16-byte-aligned base;
///   - a, w and c not null, c 2-byte aligned, c not overlapping a or w (a and w may be the same);
///   - at most 2^31 - 1 tiles (the grid is one-dimensional, and the tile orders index tiles with int).
/// Any M and N work: TMA zero-fills the rows and the K tail outside the matrices, stores are masked.
///
/// GPU: the kernels are sm_90a code (wgmma and setmaxnreg exist on sm_90 only). On any other GPU,
/// or in a build whose CMAKE_CUDA_ARCHITECTURES has no 90 entry, the launch functions throw
/// kc::ch07::UnsupportedGpu saying what they need, after validating the arguments.
///
/// The launch functions neither allocate nor synchronise (CUDA-graph capturable): they encode the
/// tensor maps (A, W, and for step 6 C) on the host (no GPU involved) and pass them by value. The first call on a
/// device queries it and raises the kernels' shared-memory limits once; call once outside a capture first.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>

#include "gemm_shape.hpp"
#include "hopper_tiles.hpp"
#include "tensor_map.hpp"

namespace kc::ch07 {

using ch02::GemmShape;

/// The steps of the ladder.
enum class HopperStep {
  tma_wgmma,          ///< step 1: TMA + mbarrier + wgmma, one warpgroup, one buffer
  pipeline,           ///< step 2: larger tile, multi-stage full/empty pipeline
  warp_specialized,   ///< step 3: producer warpgroup + two consumers, setmaxnreg
  persistent,         ///< step 4: step 3 on a persistent grid in grouped tile order
  cluster_multicast,  ///< step 5: step 4 in clusters of two, W multicast
  tma_store,          ///< step 6: step 5 with a TMA-store epilogue (the `after`)
};

/// The chapter's final step, the one gemm_bf16_hopper runs (as a programmatic dependent launch).
inline constexpr HopperStep kAfterStep = HopperStep::tma_store;

/// What a step's kernel is, in numbers (the lesson's table and the CPU tests read these).
struct HopperStepInfo {
  int block_m = 0;              ///< rows of C per block
  int block_n = 0;              ///< columns of C per block
  int block_k = 0;              ///< K per stage (64: one 128-byte swizzle row)
  int threads = 0;              ///< threads per block
  int consumer_warpgroups = 0;  ///< warpgroups issuing wgmma
  int producer_warpgroups = 0;  ///< warpgroups issuing only TMA
  int stages = 0;               ///< shared-memory buffers in the pipeline
  int stage_bytes = 0;          ///< bytes of one stage (A box + W box), what its full barrier expects
  std::size_t smem_bytes = 0;   ///< dynamic shared memory per block (with 1 KiB alignment slack)
  int cluster_m = 1;            ///< CTAs per cluster along M (2: each W box is half the tile, multicast)
  int c_staging_bytes = 0;      ///< shared memory the epilogue stages C in (step 6: the whole tile, bf16)
  bool persistent = false;      ///< one block per SM (or cluster per SM pair) looping over tiles
};

/// The numbers of @p step. Host-only, no CUDA call. Throws kc::InvalidArgument for a value that is
/// not a HopperStep.
HopperStepInfo hopper_step_info(HopperStep step);

/// The benchmark variant name of @p step: "step1_tma_wgmma", "step2_pipeline", "step3_warp_specialized",
/// "step4_persistent", "step5_cluster_multicast", "step6_tma_store".
const char* to_string(HopperStep step);

/// Thrown by the launch functions when this GPU (or this build) cannot run the sm_90a kernels.
class UnsupportedGpu : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Why a GPU of compute capability @p cc_major.@p cc_minor cannot run this chapter's kernels, or
/// std::nullopt when it can (sm_90 exactly: sm_90a code runs on no other architecture). Host-only.
std::optional<std::string> hopper_unsupported_reason(int cc_major, int cc_minor);

/// True when this library was built with the sm_90a kernels (CMAKE_CUDA_ARCHITECTURES has a 90
/// entry); false for the stub build that can only report what it needs.
bool hopper_kernels_built();

/// Why the Hopper kernels cannot run here, or std::nullopt when they can: hopper_unsupported_reason for a
/// GPU of compute capability @p cc_major.@p cc_minor, else "built without sm_90a kernels (no 90
/// architecture)" in a build without them. For callers that skip rather than throw (the benchmarks).
std::optional<std::string> hopper_unavailable_reason(int cc_major, int cc_minor);

/// Throws UnsupportedGpu unless @p kernels_built and the current GPU is sm_90: "<chapter> was built
/// without sm_90a kernels: configure with a 90 entry in CMAKE_CUDA_ARCHITECTURES ...", or
/// hopper_unsupported_reason's words. The Hopper chapters ask it after every host-side rule, before
/// their first CUDA call that needs the GPU.
/// @param chapter the calling chapter, e.g. "Chapter 8"
/// @param kernels_built whether the calling chapter's library holds its sm_90a kernels
void require_hopper(const char* chapter, bool kernels_built);

/// Checks the rules in this file's description for @p step's tile; throws kc::InvalidArgument naming
/// the first one broken, e.g. "shape.k (100) must be a multiple of 8 (TMA: rows of a multiple of 16
/// bytes)". Host-only.
void validate_gemm_bf16_hopper(const __nv_bfloat16* a, const __nv_bfloat16* w, const __nv_bfloat16* c, GemmShape shape,
                               HopperStep step = kAfterStep);

/// The two tensor maps a launch of @p step encodes, as plain numbers: A [M, K] in boxes of block_m
/// rows, W [N, K] in boxes of block_n / cluster_m rows (step 5: each CTA loads half the W tile), both
/// 64 columns wide with 128-byte swizzle.
struct OperandMaps {
  TensorMapSpec a;  ///< A's map
  TensorMapSpec w;  ///< W's map
};

/// The maps of a launch (validate_gemm_bf16_hopper first; this only does the arithmetic). Host-only.
OperandMaps operand_maps(const __nv_bfloat16* a, const __nv_bfloat16* w, GemmShape shape, HopperStep step);

/// True when step 6 can store C through TMA: @p c 16-byte aligned and N a multiple of 8 (rows of a
/// multiple of 16 bytes). Otherwise step 6 stores from registers, as step 5 does. Host-only.
bool c_tma_storable(const __nv_bfloat16* c, GemmShape shape);

/// Step 6's store map of C [M, N] at @p c: boxes of 64 rows × 64 columns with 128-byte swizzle, the
/// layout each consumer warpgroup stages its accumulators in. Host-only arithmetic (see operand_maps).
TensorMapSpec c_store_map(const __nv_bfloat16* c, GemmShape shape);

/// C = A · Wᵀ with step 6's kernel, every tile whole, launched as a programmatic dependent of the
/// previous kernel in @p stream (the chapter's `after` adds a workspace: the overload below). Its
/// blocks set up their barriers and cluster while that kernel's last tiles finish, then wait for it
/// (griddepcontrol.wait) before any load or store; with an ordinary kernel before it, it behaves
/// exactly like step 6.
/// @param a [M, K] row-major, 16-byte aligned
/// @param w [N, K] row-major, 16-byte aligned
/// @param c [M, N] row-major output, 2-byte aligned
/// @param shape M, N, K (K a multiple of 8)
/// @param stream the stream to enqueue on
void gemm_bf16_hopper(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape,
                      cudaStream_t stream = nullptr);

/// Bytes of workspace the Stream-K launch of gemm_bf16_hopper needs on a GPU of @p sms SMs: a fixed
/// region of flags, then one 256 KiB fp32 partial tile per cluster the GPU can hold (sms / 2), about
/// 17 MB on an H200. Host-only arithmetic; throws kc::InvalidArgument for sms < 2 or more SMs than
/// the flag region has room for (512).
/// @param sms streaming multiprocessors of the GPU
std::size_t hopper_workspace_bytes(int sms);

/// hopper_workspace_bytes for the current device (queried once per device).
std::size_t gemm_bf16_hopper_workspace_bytes();

/// Checks a Stream-K workspace; throws kc::InvalidArgument naming the rule broken: not null,
/// 16-byte aligned, at least @p required_bytes, not overlapping a, w or c. Host-only.
/// @param a, w, c the launch's matrices (their extents come from @p shape)
/// @param shape M, N, K
/// @param workspace the device scratch
/// @param workspace_bytes its size
/// @param required_bytes what the GPU needs (hopper_workspace_bytes)
void validate_hopper_workspace(const __nv_bfloat16* a, const __nv_bfloat16* w, const __nv_bfloat16* c, GemmShape shape,
                               const void* workspace, std::size_t workspace_bytes, std::size_t required_bytes);

/// gemm_bf16_hopper with Stream-K on the last round: when the cluster tiles do not fill the last
/// round of the persistent grid, the full rounds take whole tiles and the last round's tiles are
/// shared out slice by slice over every cluster; the pieces are summed in fp32 through
/// @p workspace (stream_k_plan in hopper_tiles.hpp says when, Chapter 6's plan says how). Results may differ from the
/// whole-tile launch in the last bits of the split tiles (another order of the fp32 sums), and are
/// the same run to run.
///
/// The workspace begins with a region of flags, one per partial tile, that must be zero before a
/// launch: zero-fill the whole workspace once before its first use (cudaMemset). Every launch puts
/// each flag it raised back to zero, so the next launch needs no clearing. The rest of the workspace
/// holds the fp32 partial tiles: scratch whose content after a launch is unspecified (a split launch
/// leaves its partials there) and whose content before a launch does not matter. One workspace
/// serves one launch at a time: launches on different streams that may run at once need one each.
/// @param a [M, K] row-major, 16-byte aligned
/// @param w [N, K] row-major, 16-byte aligned
/// @param c [M, N] row-major output, 2-byte aligned
/// @param shape M, N, K (K a multiple of 8)
/// @param workspace device scratch of at least gemm_bf16_hopper_workspace_bytes(), 16-byte aligned
/// @param workspace_bytes its size
/// @param stream the stream to enqueue on
void gemm_bf16_hopper(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape,
                      void* workspace, std::size_t workspace_bytes, cudaStream_t stream = nullptr);

/// The Stream-K plan (hopper_tiles.hpp: Chapter 6's StreamKPlan over clusters) that gemm_bf16_hopper
/// with a workspace runs for @p shape on the current device: how many cluster tiles it takes whole
/// (dp_tiles) and how many it splits by slice (sk_tiles), for the grid this GPU holds. Throws
/// kc::InvalidArgument for a bad shape, UnsupportedGpu where the kernels cannot run. Queries the device
/// once.
/// @param shape M, N, K
StreamKPlan gemm_bf16_hopper_stream_k_plan(GemmShape shape);

/// C = A · Wᵀ with the kernel of ladder step @p step (tests, benchmark, exercises). Same rules.
/// @param step the ladder step
/// @param a [M, K] row-major, 16-byte aligned
/// @param w [N, K] row-major, 16-byte aligned
/// @param c [M, N] row-major output, 2-byte aligned
/// @param shape M, N, K (K a multiple of 8)
/// @param stream the stream to enqueue on
void gemm_bf16_hopper_step(HopperStep step, const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c,
                           GemmShape shape, cudaStream_t stream = nullptr);

}  // namespace kc::ch07
