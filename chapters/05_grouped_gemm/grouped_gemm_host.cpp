// Host-side rules, sizes, references and the lesson's arithmetic for Chapter 5. No CUDA call here:
// everything is tested on machines without a GPU.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "grouped_gemm.hpp"
#include "kc/check.hpp"

namespace kc::ch05 {

namespace {

constexpr std::int64_t kIntMax = 0x7FFFFFFF;

bool aligned_to(const void* p, std::uintptr_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

// True when the byte ranges [x, x + x_bytes) and [y, y + y_bytes) share at least one byte.
bool overlaps(const void* x, std::uint64_t x_bytes, const void* y, std::uint64_t y_bytes) {
  const auto xs = reinterpret_cast<std::uintptr_t>(x);
  const auto ys = reinterpret_cast<std::uintptr_t>(y);
  return x_bytes > 0 && y_bytes > 0 && xs < ys + y_bytes && ys < xs + x_bytes;
}

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
                           const __nv_bfloat16* c, const std::int32_t* offsets) {
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
  if (a == nullptr) throw InvalidArgument("a must not be null");
  if (w == nullptr) throw InvalidArgument("w must not be null");
  if (c == nullptr) throw InvalidArgument("c must not be null");
  if (offsets == nullptr) throw InvalidArgument("offsets must not be null");
  if (!aligned_to(a, 16)) throw InvalidArgument("a must be 16-byte aligned (16-byte rows for cp.async)");
  if (!aligned_to(w, 16)) throw InvalidArgument("w must be 16-byte aligned (16-byte rows for cp.async)");
  if (!aligned_to(c, 2)) throw InvalidArgument("c must be 2-byte aligned (the alignment of bf16)");
  if (!aligned_to(offsets, 4)) throw InvalidArgument("offsets must be 4-byte aligned (int32)");
  const auto m = static_cast<std::uint64_t>(shape.m_total);
  const auto n = static_cast<std::uint64_t>(shape.n);
  const auto k = static_cast<std::uint64_t>(shape.k);
  const auto e = static_cast<std::uint64_t>(shape.experts);
  const std::uint64_t c_bytes = m * n * 2;
  if (overlaps(c, c_bytes, a, m * k * 2)) throw InvalidArgument("c must not overlap a");
  if (overlaps(c, c_bytes, w, e * n * k * 2)) throw InvalidArgument("c must not overlap w");
  if (overlaps(c, c_bytes, offsets, (e + 1) * 4)) throw InvalidArgument("c must not overlap offsets");
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
  const int c_store = static_cast<int>(options.c_store);
  if (c_store < static_cast<int>(CStore::tile_default) || c_store > static_cast<int>(CStore::through_shared_memory)) {
    throw InvalidArgument("options.c_store (" + std::to_string(c_store) + ") is not a CStore");
  }
  const std::size_t needed = grouped_gemm_workspace_bytes(shape);
  if (workspace == nullptr) throw InvalidArgument("workspace must not be null");
  if (!aligned_to(workspace, 4)) throw InvalidArgument("workspace must be 4-byte aligned");
  if (workspace_bytes < needed) {
    throw InvalidArgument("workspace_bytes (" + std::to_string(workspace_bytes) +
                          ") must be >= " + std::to_string(needed) + " (grouped_gemm_workspace_bytes)");
  }
  const auto c_bytes =
      static_cast<std::uint64_t>(shape.m_total) * static_cast<std::uint64_t>(shape.n) * sizeof(__nv_bfloat16);
  if (overlaps(c, c_bytes, workspace, needed)) throw InvalidArgument("workspace must not overlap c");
}

std::size_t grouped_gemm_workspace_bytes(const GroupedGemmShape& shape) {
  check_experts("shape.experts", shape.experts);
  return round_up_256(static_cast<std::size_t>(shape.experts + 1) * sizeof(std::int32_t));
}

bool stores_c_through_shared_memory(const GroupedGemmOptions& options) {
  // The wide tile is Chapter 2's large tile and stores as that does, through shared memory; the
  // square tile from registers, where the staged store measured no faster (docs/notes/ch05.md).
  return options.c_store == CStore::through_shared_memory ||
         (options.c_store == CStore::tile_default && options.tile == GroupedTile::wide_128x256);
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
  if (x == nullptr) throw InvalidArgument("x must not be null when shape.tokens > 0");
  if (out.row_of_pair == nullptr) throw InvalidArgument("out.row_of_pair must not be null when shape.tokens > 0");
  if (out.token_of_row == nullptr) throw InvalidArgument("out.token_of_row must not be null when shape.tokens > 0");
  if (out.a == nullptr) throw InvalidArgument("out.a must not be null when shape.tokens > 0");
  if (!aligned_to(x, 16)) throw InvalidArgument("x must be 16-byte aligned");
  if (!aligned_to(out.a, 16)) throw InvalidArgument("out.a must be 16-byte aligned");
  const auto pairs = static_cast<std::uint64_t>(shape.tokens) * static_cast<std::uint64_t>(shape.k);
  const auto row_bytes = static_cast<std::uint64_t>(shape.hidden) * 2;
  if (overlaps(out.a, pairs * row_bytes, x, static_cast<std::uint64_t>(shape.tokens) * row_bytes)) {
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

PermuteReference permute_reference(std::span<const std::int32_t> ids, int k, int experts) {
  check_experts("experts", experts);
  if (k < 1 || k > 32) throw InvalidArgument("k (" + std::to_string(k) + ") must be in [1, 32]");
  if (ids.size() % static_cast<std::size_t>(k) != 0) {
    throw InvalidArgument("ids.size() (" + std::to_string(ids.size()) + ") must be a multiple of k");
  }
  PermuteReference r;
  r.counts.assign(static_cast<std::size_t>(experts), 0);
  for (std::int32_t id : ids) {
    if (id >= 0 && id < experts) ++r.counts[static_cast<std::size_t>(id)];
  }
  r.offsets.assign(static_cast<std::size_t>(experts) + 1, 0);
  for (int e = 0; e < experts; ++e) r.offsets[e + 1] = r.offsets[e] + r.counts[e];
  r.row_of_pair.assign(ids.size(), -1);
  r.token_of_row.assign(static_cast<std::size_t>(r.offsets[experts]), -1);
  std::vector<std::int32_t> next(r.offsets.begin(), r.offsets.end() - 1);
  for (std::size_t p = 0; p < ids.size(); ++p) {  // (token, slot) order: stable
    const std::int32_t id = ids[p];
    if (id < 0 || id >= experts) continue;
    const std::int32_t row = next[static_cast<std::size_t>(id)]++;
    r.row_of_pair[p] = row;
    r.token_of_row[static_cast<std::size_t>(row)] = static_cast<std::int32_t>(p / static_cast<std::size_t>(k));
  }
  return r;
}

// ------------------------------------------------------------------------------- fp64 references

double grouped_gemm_reference_element(std::span<const double> a, std::span<const double> w,
                                      std::span<const std::int32_t> host_offsets, std::int64_t n, std::int64_t k,
                                      std::int64_t row, std::int64_t col) {
  const auto experts = static_cast<std::int64_t>(host_offsets.size()) - 1;
  // The expert owning the row: the last e with offsets[e] <= row < offsets[e + 1].
  const auto it = std::upper_bound(host_offsets.begin(), host_offsets.end(), static_cast<std::int32_t>(row));
  const std::int64_t e = (it - host_offsets.begin()) - 1;
  if (row < 0 || e < 0 || e >= experts) {
    throw InvalidArgument("row (" + std::to_string(row) + ") belongs to no expert");
  }
  double sum = 0.0;
  const double* ar = a.data() + row * k;
  const double* wr = w.data() + (e * n + col) * k;
  for (std::int64_t i = 0; i < k; ++i) sum += ar[i] * wr[i];
  return sum;
}

std::vector<double> grouped_gemm_reference(std::span<const double> a, std::span<const double> w,
                                           std::span<const std::int32_t> host_offsets, std::int64_t m_total,
                                           std::int64_t n, std::int64_t k) {
  std::vector<double> c(static_cast<std::size_t>(m_total * n), std::numeric_limits<double>::quiet_NaN());
  const std::int64_t rows = host_offsets.empty() ? 0 : host_offsets.back();
  for (std::int64_t r = 0; r < rows && r < m_total; ++r) {
    for (std::int64_t col = 0; col < n; ++col) {
      c[static_cast<std::size_t>(r * n + col)] = grouped_gemm_reference_element(a, w, host_offsets, n, k, r, col);
    }
  }
  return c;
}

std::vector<std::int32_t> offsets_of_sizes(std::span<const std::int32_t> sizes) {
  std::vector<std::int32_t> offsets(sizes.size() + 1, 0);
  std::int64_t total = 0;
  for (std::size_t e = 0; e < sizes.size(); ++e) {
    if (sizes[e] < 0) {
      throw InvalidArgument("sizes[" + std::to_string(e) + "] (" + std::to_string(sizes[e]) + ") must be >= 0");
    }
    total += sizes[e];
    if (total > kIntMax) throw InvalidArgument("the sum of sizes must be at most 2^31 - 1");
    offsets[e + 1] = static_cast<std::int32_t>(total);
  }
  return offsets;
}

namespace {

// rows shared as evenly as possible among the experts marked in `takes`, extra rows to the first.
void share_uniformly(std::vector<std::int32_t>& sizes, const std::vector<bool>& takes, std::int32_t rows) {
  const auto count = static_cast<std::int32_t>(std::count(takes.begin(), takes.end(), true));
  if (count == 0) return;
  std::int32_t extra = rows % count;
  for (std::size_t e = 0; e < sizes.size(); ++e) {
    if (!takes[e]) continue;
    sizes[e] += rows / count + (extra > 0 ? 1 : 0);
    if (extra > 0) --extra;
  }
}

}  // namespace

std::vector<std::int32_t> group_sizes(GroupSizes kind, int experts, std::int32_t rows) {
  check_experts("experts", experts);
  if (rows < 0) throw InvalidArgument("rows (" + std::to_string(rows) + ") must be >= 0");
  const auto count = static_cast<std::size_t>(experts);
  std::vector<std::int32_t> sizes(count, 0);
  switch (kind) {
    case GroupSizes::uniform: share_uniformly(sizes, std::vector<bool>(count, true), rows); break;
    case GroupSizes::zipf: {
      double harmonic = 0.0;
      for (int e = 0; e < experts; ++e) harmonic += 1.0 / (e + 1);
      std::int32_t given = 0;
      for (int e = 0; e < experts; ++e) {
        sizes[e] = static_cast<std::int32_t>(std::floor(rows * (1.0 / (e + 1)) / harmonic));
        given += sizes[e];
      }
      for (int e = 0; given < rows; e = (e + 1) % experts, ++given) ++sizes[e];
      break;
    }
    case GroupSizes::one_hot: {
      sizes[0] = experts == 1 ? rows : rows / 2;
      std::vector<bool> rest(count, true);
      rest[0] = false;
      share_uniformly(sizes, rest, rows - sizes[0]);
      break;
    }
    case GroupSizes::quarter_empty: {
      std::vector<bool> takes(count);
      for (std::size_t e = 0; e < count; ++e) takes[e] = e % 4 != 0;
      if (experts == 1) takes[0] = true;
      share_uniformly(sizes, takes, rows);
      break;
    }
  }
  return sizes;
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
