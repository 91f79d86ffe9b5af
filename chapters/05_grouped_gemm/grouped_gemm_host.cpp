// Host-side rules, sizes and the lesson's arithmetic for Chapter 5. No CUDA call here:
// everything is tested on machines without a GPU.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "grouped_gemm.hpp"
#include "kc/check.hpp"
#include "kc/validate.hpp"

namespace kc::ch05 {

namespace {

constexpr std::int64_t kIntMax = 0x7FFFFFFF;

std::size_t round_up_256(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

void check_experts(const char* name, int experts) {
  if (experts < 1 || experts > kMaxExperts) {
    throw InvalidArgument(std::string(name) + " (" + std::to_string(experts) + ") must be in [1, " +
                          std::to_string(kMaxExperts) + "]");
  }
}

void check_range(const char* name, std::int64_t v, std::int64_t lo) {
  if (v < lo || v > kIntMax) {
    throw InvalidArgument(std::string(name) + " (" + std::to_string(v) + ") must be in [" + std::to_string(lo) +
                          ", 2^31 - 1]");
  }
}

std::int64_t tiles_n_of(std::int64_t n) { return (n + kBlockN - 1) / kBlockN; }

}  // namespace

void validate_grouped_gemm(const GroupedGemmShape& shape, const __nv_bfloat16* a, const __nv_bfloat16* w,
                           const __nv_bfloat16* c, const std::int32_t* offsets, std::int64_t c_columns,
                           std::int64_t a_rows) {
  check_range("shape.m_total", shape.m_total, 0);
  check_range("shape.n", shape.n, 1);
  check_range("shape.k", shape.k, 1);
  if (shape.k % 8 != 0) {
    throw InvalidArgument("shape.k (" + std::to_string(shape.k) +
                          ") must be a multiple of 8 (16-byte rows for cp.async)");
  }
  check_experts("shape.experts", shape.experts);
  const std::int64_t blocks = grouped_gemm_grid_blocks(shape);
  if (blocks > kIntMax) {
    throw InvalidArgument("the grid (" + std::to_string(blocks) +
                          " blocks for shape.m_total x shape.n) must be at most 2^31 - 1 blocks");
  }
  // A [M_total, K] and C [M_total, N] are empty when M_total = 0, and an empty tensor's data
  // pointer may be null (PyTorch's is); W [E, N, K] and offsets [E + 1] never are.
  if (shape.m_total > 0 && a == nullptr) throw InvalidArgument("a must not be null when shape.m_total > 0");
  if (w == nullptr) throw InvalidArgument("w must not be null");
  if (shape.m_total > 0 && c == nullptr) throw InvalidArgument("c must not be null when shape.m_total > 0");
  if (offsets == nullptr) throw InvalidArgument("offsets must not be null");
  if (!kc::aligned_to(a, 16)) throw InvalidArgument("a must be 16-byte aligned (16-byte rows for cp.async)");
  if (!kc::aligned_to(w, 16)) throw InvalidArgument("w must be 16-byte aligned (16-byte rows for cp.async)");
  if (!kc::aligned_to(c, 2)) throw InvalidArgument("c must be 2-byte aligned (the alignment of bf16)");
  if (!kc::aligned_to(offsets, 4)) throw InvalidArgument("offsets must be 4-byte aligned (int32)");
  const auto m = static_cast<std::uint64_t>(shape.m_total);
  const auto n = static_cast<std::uint64_t>(shape.n);
  const auto k = static_cast<std::uint64_t>(shape.k);
  const auto e = static_cast<std::uint64_t>(shape.experts);
  const std::uint64_t c_bytes = m * (c_columns > 0 ? static_cast<std::uint64_t>(c_columns) : n) * 2;
  const std::uint64_t a_bytes = (a_rows >= 0 ? static_cast<std::uint64_t>(a_rows) : m) * k * 2;
  if (kc::overlaps(c, c_bytes, a, a_bytes)) throw InvalidArgument("c must not overlap a");
  if (kc::overlaps(c, c_bytes, w, e * n * k * 2)) throw InvalidArgument("c must not overlap w");
  if (kc::overlaps(c, c_bytes, offsets, (e + 1) * 4)) throw InvalidArgument("c must not overlap offsets");
}

void validate_grouped_gemm_options(const GroupedGemmShape& shape, const __nv_bfloat16* c,
                                   const GroupedGemmOptions& options, const void* workspace,
                                   std::size_t workspace_bytes) {
  const int order = static_cast<int>(options.order);
  if (order != static_cast<int>(TileOrder::row_major) && order != static_cast<int>(TileOrder::grouped)) {
    throw InvalidArgument("options.order (" + std::to_string(order) + ") is not a TileOrder");
  }
  if (options.group_m < 1) {
    throw InvalidArgument("options.group_m (" + std::to_string(options.group_m) + ") must be >= 1");
  }
  const int tile = static_cast<int>(options.tile);
  if (tile != static_cast<int>(GroupedTile::square_128x128) && tile != static_cast<int>(GroupedTile::wide_128x256)) {
    throw InvalidArgument("options.tile (" + std::to_string(tile) + ") is not a GroupedTile");
  }
  const std::size_t needed = grouped_gemm_workspace_bytes(shape);
  if (workspace == nullptr) throw InvalidArgument("workspace must not be null");
  if (!kc::aligned_to(workspace, 4)) throw InvalidArgument("workspace must be 4-byte aligned");
  if (workspace_bytes < needed) {
    throw InvalidArgument("workspace_bytes (" + std::to_string(workspace_bytes) +
                          ") must be >= " + std::to_string(needed) + " (grouped_gemm_workspace_bytes)");
  }
  const auto c_bytes =
      static_cast<std::uint64_t>(shape.m_total) * static_cast<std::uint64_t>(shape.n) * sizeof(__nv_bfloat16);
  if (kc::overlaps(c, c_bytes, workspace, needed)) throw InvalidArgument("workspace must not overlap c");
}

std::size_t grouped_gemm_workspace_bytes(const GroupedGemmShape& shape) {
  check_experts("shape.experts", shape.experts);
  return round_up_256(static_cast<std::size_t>(shape.experts + 1) * sizeof(std::int32_t));
}

std::int64_t grouped_gemm_grid_blocks(const GroupedGemmShape& shape, GroupedTile tile) {
  const std::int64_t block_n = block_n_of(tile);
  return max_m_tiles(shape.m_total, shape.experts, kBlockM) * ((shape.n + block_n - 1) / block_n);
}

void validate_host_offsets(const GroupedGemmShape& shape, std::span<const std::int32_t> host_offsets) {
  check_experts("shape.experts", shape.experts);
  if (host_offsets.size() != static_cast<std::size_t>(shape.experts) + 1) {
    throw InvalidArgument("host_offsets must hold experts + 1 (" + std::to_string(shape.experts + 1) +
                          ") values, not " + std::to_string(host_offsets.size()));
  }
  if (host_offsets[0] != 0) {
    throw InvalidArgument("host_offsets[0] (" + std::to_string(host_offsets[0]) + ") must be 0");
  }
  for (int e = 0; e < shape.experts; ++e) {
    if (host_offsets[e + 1] < host_offsets[e]) {
      throw InvalidArgument("host_offsets[" + std::to_string(e + 1) + "] (" + std::to_string(host_offsets[e + 1]) +
                            ") must be >= host_offsets[" + std::to_string(e) + "] (" + std::to_string(host_offsets[e]) +
                            ")");
    }
  }
  if (host_offsets[shape.experts] > shape.m_total) {
    throw InvalidArgument("host_offsets[E] (" + std::to_string(host_offsets[shape.experts]) +
                          ") must be <= shape.m_total (" + std::to_string(shape.m_total) + ")");
  }
}

double grouped_gemm_flops(const GroupedGemmShape& shape, std::span<const std::int32_t> host_offsets) {
  validate_host_offsets(shape, host_offsets);
  return 2.0 * host_offsets[shape.experts] * static_cast<double>(shape.n) * static_cast<double>(shape.k);
}

double grouped_gemm_min_bytes(const GroupedGemmShape& shape, std::span<const std::int32_t> host_offsets) {
  validate_host_offsets(shape, host_offsets);
  int nonempty = 0;
  for (int e = 0; e < shape.experts; ++e) nonempty += host_offsets[e + 1] > host_offsets[e] ? 1 : 0;
  const double rows = host_offsets[shape.experts];
  const double n = static_cast<double>(shape.n), k = static_cast<double>(shape.k);
  return 2.0 * (rows * k + nonempty * n * k + rows * n);
}

// ------------------------------------------------------------------------------------ permutation

void validate_permute(const PermuteShape& shape, const std::int32_t* ids, const __nv_bfloat16* x,
                      const PermuteOutputs& out) {
  if (shape.tokens < 0) throw InvalidArgument("shape.tokens (" + std::to_string(shape.tokens) + ") must be >= 0");
  if (shape.k < 1 || shape.k > 32)
    throw InvalidArgument("shape.k (" + std::to_string(shape.k) + ") must be in [1, 32]");
  check_experts("shape.experts", shape.experts);
  if (shape.tokens * shape.k > kIntMax) {
    throw InvalidArgument("shape.tokens x shape.k (" + std::to_string(shape.tokens * shape.k) +
                          ") must be at most 2^31 - 1");
  }
  check_range("shape.hidden", shape.hidden, 1);
  if (shape.hidden % 8 != 0) {
    throw InvalidArgument("shape.hidden (" + std::to_string(shape.hidden) +
                          ") must be a multiple of 8 (rows are copied 16 bytes at a time)");
  }
  // counts and offsets are written even for T = 0 (all zeros); the per-token arrays are then empty,
  // and an empty tensor's data pointer may be null (PyTorch's is), so they are checked only for T > 0.
  if (out.counts == nullptr) throw InvalidArgument("out.counts must not be null");
  if (out.offsets == nullptr) throw InvalidArgument("out.offsets must not be null");
  if (shape.tokens == 0) return;
  if (ids == nullptr) throw InvalidArgument("ids must not be null when shape.tokens > 0");
  if (out.row_of_pair == nullptr) throw InvalidArgument("out.row_of_pair must not be null when shape.tokens > 0");
  if (out.token_of_row == nullptr) throw InvalidArgument("out.token_of_row must not be null when shape.tokens > 0");
  if (out.a == nullptr) return;  // the index maps only: no copies, x is not read
  if (x == nullptr) throw InvalidArgument("x must not be null when out.a is not");
  if (!kc::aligned_to(x, 16)) throw InvalidArgument("x must be 16-byte aligned");
  if (!kc::aligned_to(out.a, 16)) throw InvalidArgument("out.a must be 16-byte aligned");
  const auto pairs = static_cast<std::uint64_t>(shape.tokens) * static_cast<std::uint64_t>(shape.k);
  const auto row_bytes = static_cast<std::uint64_t>(shape.hidden) * 2;
  if (kc::overlaps(out.a, pairs * row_bytes, x, static_cast<std::uint64_t>(shape.tokens) * row_bytes)) {
    throw InvalidArgument("out.a must not overlap x");
  }
}

std::size_t permute_workspace_bytes(const PermuteShape& shape) {
  check_experts("shape.experts", shape.experts);
  const std::int64_t pairs = std::max<std::int64_t>(0, shape.tokens) * std::max(0, shape.k);
  const std::int64_t chunks = (pairs + kPairsPerChunk - 1) / kPairsPerChunk;
  return round_up_256(static_cast<std::size_t>(std::max<std::int64_t>(chunks, 1)) *
                      static_cast<std::size_t>(shape.experts) * sizeof(std::int32_t));
}

// ---------------------------------------------------------------------- the lesson's arithmetic

double reread_bytes_bound(double flops, int block_m) {
  if (block_m < 1) throw InvalidArgument("block_m (" + std::to_string(block_m) + ") must be >= 1");
  return flops / block_m;
}

double predicted_dram_bytes(const GroupedGemmShape& shape, int rows_per_expert, TileOrder order, int group_m,
                            int concurrent_blocks) {
  check_experts("shape.experts", shape.experts);
  if (rows_per_expert < 0) throw InvalidArgument("rows_per_expert must be >= 0");
  if (group_m < 1) throw InvalidArgument("group_m (" + std::to_string(group_m) + ") must be >= 1");
  if (concurrent_blocks < 1) throw InvalidArgument("concurrent_blocks must be >= 1");
  const double e = shape.experts, n = static_cast<double>(shape.n), k = static_cast<double>(shape.k);
  const double rows = e * rows_per_expert;
  const int m_tiles = m_tiles_of(rows_per_expert, kBlockM);
  if (m_tiles == 0) return 0.0;
  const auto tiles_n = static_cast<int>(tiles_n_of(shape.n));
  const int shared = order == TileOrder::row_major ? std::max(1, concurrent_blocks / tiles_n) : group_m;
  const int reuse = std::min(shared, m_tiles);
  const int reads = (m_tiles + reuse - 1) / reuse;  // W of each expert read this many times
  return 2.0 * (rows * k + e * reads * n * k + rows * n);
}

}  // namespace kc::ch05
