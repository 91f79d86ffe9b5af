// Chapter 8's host side: the rules, the workspace, the tensor maps and the launch path of every step.
// Everything before the first CUDA call is host arithmetic, tested on machines without a GPU.
#include <string>

#include "grouped_launch.hpp"
// Angle brackets: the exercise build puts the skeleton's grouped_tiles.hpp first on the include path.
#include <grouped_tiles.hpp>

#include "hopper_grouped_gemm.hpp"
#include "kc/check.hpp"
#include "kc/validate.hpp"
#include "ragged_map.hpp"
#include "tensor_map.hpp"

namespace kc::ch08 {

namespace {

// The most rows W may have as one matrix: a tile's second W box starts up to 128 rows past row
// E · N - 1 and the coordinate is an int.
constexpr std::int64_t kMaxWRows = 0x7FFFFFFF - 255;

}  // namespace

const char* to_string(GroupedStep step) {
  switch (step) {
    case GroupedStep::masked_store: return "step1_masked_store";
    case GroupedStep::device_tensor_maps: return "step2_device_tensor_maps";
    case GroupedStep::ragged_tensor_map: return "step3_ragged_tensor_map";
    case GroupedStep::a_evict_last: return "step4_a_evict_last";
    case GroupedStep::block_per_tile: return "step5_block_per_tile";
  }
  throw InvalidArgument("step (" + std::to_string(static_cast<int>(step)) + ") is not a GroupedStep");
}

std::size_t grouped_gemm_hopper_workspace_bytes(const GroupedGemmShape& shape) {
  if (shape.experts < 1 || shape.experts > ch05::kMaxExperts) {
    throw InvalidArgument("shape.experts (" + std::to_string(shape.experts) + ") must be in [1, " +
                          std::to_string(ch05::kMaxExperts) + "]");
  }
  return detail::WorkspaceLayout::bytes(shape.experts);
}

void validate_grouped_gemm_hopper_operands(const GroupedGemmShape& shape, const __nv_bfloat16* a,
                                           const __nv_bfloat16* w, const __nv_bfloat16* c, const std::int32_t* offsets,
                                           const GroupedEpilogue& epilogue, GroupedStep step, std::int64_t a_rows) {
  to_string(step);  // throws for a value that is no step
  const int kind = static_cast<int>(epilogue.kind);
  if (kind < static_cast<int>(EpilogueKind::plain) || kind > static_cast<int>(EpilogueKind::row_scale)) {
    throw InvalidArgument("epilogue.kind (" + std::to_string(kind) + ") is not an EpilogueKind");
  }
  const std::int64_t n_out = output_columns(shape.n, epilogue.kind);
  ch05::validate_grouped_gemm(shape, a, w, c, offsets, n_out, a_rows);
  if (shape.m_total > kRaggedRows) {
    throw InvalidArgument("shape.m_total (" + std::to_string(shape.m_total) +
                          ") must be at most 2^30 (the ragged store map counts rows below 2^30)");
  }
  if (static_cast<std::int64_t>(shape.experts) * shape.n > kMaxWRows) {
    throw InvalidArgument("shape.experts * shape.n (" + std::to_string(shape.experts * shape.n) +
                          ") must be at most 2^31 - 256 (W is read as one [E * N, K] matrix with int row "
                          "coordinates, a box up to 255 rows past its last row)");
  }
  if (epilogue.kind == EpilogueKind::swiglu && shape.n % 2 != 0) {
    throw InvalidArgument("shape.n (" + std::to_string(shape.n) +
                          ") must be a multiple of 2 for swiglu (W[e] is [gate; up], N / 2 rows each)");
  }
  if (uses_tma_store(step) && shape.m_total > 0) {
    if (n_out % 8 != 0) {
      throw InvalidArgument("the columns of C (" + std::to_string(n_out) +
                            (epilogue.kind == EpilogueKind::swiglu ? ", shape.n / 2" : ", shape.n") +
                            ") must be a multiple of 8 for " + to_string(step) +
                            "'s TMA store (rows of a multiple of 16 bytes)");
    }
    if (!kc::aligned_to(c, 16)) {
      throw InvalidArgument(std::string("c must be 16-byte aligned for ") + to_string(step) + "'s TMA store");
    }
  }
  const std::uint64_t c_bytes = static_cast<std::uint64_t>(shape.m_total) * static_cast<std::uint64_t>(n_out) * 2;
  if (epilogue.kind == EpilogueKind::row_scale && shape.m_total > 0) {
    if (epilogue.row_scale == nullptr) {
      throw InvalidArgument("epilogue.row_scale must not be null for row_scale when shape.m_total > 0");
    }
    if (!kc::aligned_to(epilogue.row_scale, 4)) throw InvalidArgument("epilogue.row_scale must be 4-byte aligned");
    if (kc::overlaps(c, c_bytes, epilogue.row_scale, static_cast<std::uint64_t>(shape.m_total) * 4)) {
      throw InvalidArgument("c must not overlap epilogue.row_scale");
    }
  }
}

void validate_grouped_gemm_hopper(const GroupedGemmShape& shape, const __nv_bfloat16* a, const __nv_bfloat16* w,
                                  const __nv_bfloat16* c, const std::int32_t* offsets, const GroupedEpilogue& epilogue,
                                  const void* workspace, std::size_t workspace_bytes, GroupedStep step,
                                  std::int64_t a_rows) {
  validate_grouped_gemm_hopper_operands(shape, a, w, c, offsets, epilogue, step, a_rows);
  const std::int64_t n_out = output_columns(shape.n, epilogue.kind);
  const std::uint64_t c_bytes = static_cast<std::uint64_t>(shape.m_total) * static_cast<std::uint64_t>(n_out) * 2;
  const std::size_t needed = grouped_gemm_hopper_workspace_bytes(shape);
  if (workspace == nullptr) throw InvalidArgument("workspace must not be null");
  if (!kc::aligned_to(workspace, 128)) {
    throw InvalidArgument("workspace must be 128-byte aligned (it holds tensor maps)");
  }
  if (workspace_bytes < needed) {
    throw InvalidArgument("workspace_bytes (" + std::to_string(workspace_bytes) +
                          ") must be >= " + std::to_string(needed) + " (grouped_gemm_hopper_workspace_bytes)");
  }
  const auto m = static_cast<std::uint64_t>(shape.m_total);
  const auto e = static_cast<std::uint64_t>(shape.experts);
  const auto n = static_cast<std::uint64_t>(shape.n);
  const auto k = static_cast<std::uint64_t>(shape.k);
  if (kc::overlaps(workspace, needed, c, c_bytes)) throw InvalidArgument("workspace must not overlap c");
  const std::uint64_t a_bytes = (a_rows >= 0 ? static_cast<std::uint64_t>(a_rows) : m) * k * 2;
  if (kc::overlaps(workspace, needed, a, a_bytes)) throw InvalidArgument("workspace must not overlap a");
  if (kc::overlaps(workspace, needed, w, e * n * k * 2)) throw InvalidArgument("workspace must not overlap w");
  if (kc::overlaps(workspace, needed, offsets, (e + 1) * 4)) {
    throw InvalidArgument("workspace must not overlap offsets");
  }
  if (epilogue.kind == EpilogueKind::row_scale && kc::overlaps(workspace, needed, epilogue.row_scale, m * 4)) {
    throw InvalidArgument("workspace must not overlap epilogue.row_scale");
  }
}

void grouped_gemm_hopper_step(GroupedStep step, const GroupedGemmShape& shape, const __nv_bfloat16* a,
                              const __nv_bfloat16* w, __nv_bfloat16* c, const std::int32_t* offsets,
                              const GroupedEpilogue& epilogue, void* workspace, std::size_t workspace_bytes,
                              cudaStream_t stream) {
  detail::grouped_gemm_hopper_ordered(step, kGroupM, shape, a, w, c, offsets, epilogue, workspace, workspace_bytes,
                                      stream);
}

void grouped_gemm_hopper(const GroupedGemmShape& shape, const __nv_bfloat16* a, const __nv_bfloat16* w,
                         __nv_bfloat16* c, const std::int32_t* offsets, const GroupedEpilogue& epilogue,
                         void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  grouped_gemm_hopper_step(after_step(shape), shape, a, w, c, offsets, epilogue, workspace, workspace_bytes, stream);
}

void validate_gathered_a(const GroupedGemmShape& shape, const GatheredA& a, const __nv_bfloat16* c,
                         std::int64_t n_out) {
  if (shape.m_total == 0) return;
  if (a.x_rows < 1 || a.x_rows > 0x7FFFFFFF) {
    throw InvalidArgument("a.x_rows (" + std::to_string(a.x_rows) + ") must be in [1, 2^31 - 1]");
  }
  if (a.rows == nullptr) throw InvalidArgument("a.rows must not be null when shape.m_total > 0");
  if (!kc::aligned_to(a.rows, 4)) throw InvalidArgument("a.rows must be 4-byte aligned");
  const std::uint64_t c_bytes = static_cast<std::uint64_t>(shape.m_total) * static_cast<std::uint64_t>(n_out) * 2;
  if (kc::overlaps(c, c_bytes, a.rows, static_cast<std::uint64_t>(shape.m_total) * 4)) {
    throw InvalidArgument("c must not overlap a.rows");
  }
}

namespace {

// A launch whose arguments have passed every rule: the maps' rules, the GPU, then the maps, the prefix
// kernel and the GEMM. With @p gather, A's rows are loaded from gather->x through gather->rows.
void enqueue_grouped(GroupedStep step, int group_m, const GroupedGemmShape& shape, const __nv_bfloat16* a,
                     const GatheredA* gather, const __nv_bfloat16* w, __nv_bfloat16* c, const std::int32_t* offsets,
                     const GroupedEpilogue& epilogue, void* workspace, cudaStream_t stream) {
  const bool swiglu = epilogue.kind == EpilogueKind::swiglu;
  const std::int64_t n_out = output_columns(shape.n, epilogue.kind);
  const ch07::TensorMapSpec a_spec = gather != nullptr
                                         ? ch07::bf16_row_major_map(gather->x, gather->x_rows, shape.k, 1)
                                         : ch07::bf16_row_major_map(a, shape.m_total, shape.k, kTile.block_m);
  const ch07::TensorMapSpec w_spec =
      ch07::bf16_row_major_map(w, static_cast<std::int64_t>(shape.experts) * shape.n, shape.k, kWBoxRows);
  ch07::validate_tensor_map(a_spec, "a");
  ch07::validate_tensor_map(w_spec, "w");
  // Can this build and GPU run it?
  ch07::require_hopper("Chapter 8", detail::kernels_built());
  // The maps (host-only encoding), the prefix kernel, the GEMM.
  const CUtensorMap a_map = ch07::encode_tensor_map(a_spec, "a");
  const CUtensorMap w_map = ch07::encode_tensor_map(w_spec, "w");
  CUtensorMap c_map{};  // step 2: the base of the experts' maps; step 3: the ragged map
  if (step == GroupedStep::device_tensor_maps) {
    c_map = ch07::encode_tensor_map(ch07::bf16_row_major_map(c, shape.m_total, n_out, ch07::kStoreBoxRows), "c");
  } else if (uses_ragged_map(step)) {
    c_map = encode_ragged_store_map(ragged_store_map(c, n_out));
  }
  auto* tile_prefix = static_cast<std::int32_t*>(workspace);
  auto* expert_maps = reinterpret_cast<CUtensorMap*>(static_cast<unsigned char*>(workspace) +
                                                     detail::WorkspaceLayout::prefix_bytes(shape.experts));
  const int m_total = static_cast<int>(shape.m_total);
  detail::launch_expert_prefix(offsets, shape.experts, m_total, tile_prefix, c_map, c, static_cast<int>(n_out),
                               step == GroupedStep::device_tensor_maps ? expert_maps : nullptr, stream);
  detail::GroupedArgs args;
  args.c = c;
  args.offsets = offsets;
  args.tile_prefix = tile_prefix;
  args.expert_maps = expert_maps;
  args.row_scale = epilogue.kind == EpilogueKind::row_scale ? epilogue.row_scale : nullptr;
  args.m_total = m_total;
  args.n = static_cast<int>(shape.n);
  args.k = static_cast<int>(shape.k);
  args.experts = shape.experts;
  args.n_out = static_cast<int>(n_out);
  args.tiles_n = grouped_tiles_n(args.n, epilogue.kind);
  args.group_m = group_m;
  args.paired_stores = n_out % 2 == 0 && kc::aligned_to(c, 4);
  args.gather_rows = gather != nullptr ? gather->rows : nullptr;
  const std::int64_t tile_bound = ch05::max_m_tiles(shape.m_total, shape.experts, kTile.block_m) * args.tiles_n;
  if (gather != nullptr) {
    detail::launch_gather(swiglu, a_map, w_map, c_map, args, tile_bound, stream);
  } else {
    detail::launch_grouped(step, swiglu, a_map, w_map, c_map, args, tile_bound, stream);
  }
}

}  // namespace

void detail::grouped_gemm_hopper_ordered(GroupedStep step, int group_m, const GroupedGemmShape& shape,
                                         const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c,
                                         const std::int32_t* offsets, const GroupedEpilogue& epilogue, void* workspace,
                                         std::size_t workspace_bytes, cudaStream_t stream) {
  // Every rule, before any CUDA call.
  validate_grouped_gemm_hopper(shape, a, w, c, offsets, epilogue, workspace, workspace_bytes, step);
  if (group_m < 1) throw InvalidArgument("group_m (" + std::to_string(group_m) + ") must be at least 1");
  if (shape.m_total == 0) return;  // no rows: nothing to compute or write
  enqueue_grouped(step, group_m, shape, a, nullptr, w, c, offsets, epilogue, workspace, stream);
}

void grouped_gemm_hopper_gather(const GroupedGemmShape& shape, const GatheredA& a, const __nv_bfloat16* w,
                                __nv_bfloat16* c, const std::int32_t* offsets, const GroupedEpilogue& epilogue,
                                void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  validate_gathered_a(shape, a, c, output_columns(shape.n, epilogue.kind));
  // The gathering kernel is step 4's kernel with A's loads changed: step 4's rules and store.
  validate_grouped_gemm_hopper(shape, a.x, w, c, offsets, epilogue, workspace, workspace_bytes,
                               GroupedStep::a_evict_last, a.x_rows);
  if (shape.m_total == 0) return;
  enqueue_grouped(GroupedStep::a_evict_last, kGroupM, shape, nullptr, &a, w, c, offsets, epilogue, workspace, stream);
}

}  // namespace kc::ch08
