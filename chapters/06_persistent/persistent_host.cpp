// Host-side rules, sizes and the lesson's arithmetic for Chapter 6. No CUDA call here: everything
// is tested on machines without a GPU.
#include <cstdio>
#include <string>

#include "kc/check.hpp"
#include "kc/validate.hpp"
#include "persistent_gemm.hpp"

namespace kc::ch06 {

namespace {

std::size_t round_up_256(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

// The workspace rules both entry points share: not null, 16-byte aligned, and at least @p needed
// bytes (@p source names where that number comes from).
void check_workspace(const void* workspace, std::size_t workspace_bytes, std::size_t needed, const char* source) {
  if (workspace == nullptr) throw InvalidArgument("workspace must not be null");
  if (!kc::aligned_to(workspace, 16)) {
    throw InvalidArgument("workspace must be 16-byte aligned (float4 partial tiles)");
  }
  if (workspace_bytes < needed) {
    throw InvalidArgument("workspace_bytes (" + std::to_string(workspace_bytes) +
                          ") must be >= " + std::to_string(needed) + " (" + source + ")");
  }
}

}  // namespace

std::size_t workspace_counter_bytes() {
  return round_up_256(static_cast<std::size_t>(counter_words()) * sizeof(std::int32_t));
}

std::size_t workspace_prefix_row_bytes(int experts) {
  return round_up_256(static_cast<std::size_t>(experts + 1) * sizeof(std::int32_t));
}

std::size_t persistent_workspace_bytes(const GroupedGemmShape& shape, int grid) {
  if (shape.experts < 1 || shape.experts > ch05::kMaxExperts) {
    throw InvalidArgument("shape.experts (" + std::to_string(shape.experts) + ") must be in [1, " +
                          std::to_string(ch05::kMaxExperts) + "]");
  }
  if (grid < 1 || grid > kMaxPersistentGrid) {
    throw InvalidArgument("grid (" + std::to_string(grid) + ") must be in [1, " + std::to_string(kMaxPersistentGrid) +
                          "]");
  }
  // Every block keeps its own copy of the m-tile prefix: grid rows of E + 1 int32.
  const std::size_t prefixes = static_cast<std::size_t>(grid) * workspace_prefix_row_bytes(shape.experts);
  const std::size_t partials = static_cast<std::size_t>(partial_slots(grid)) * ch05::kBlockM * ch05::kBlockN * 4;
  return workspace_counter_bytes() + prefixes + partials;
}

void validate_workspace_init(const void* workspace, std::size_t workspace_bytes) {
  check_workspace(workspace, workspace_bytes, workspace_counter_bytes(), "the counters");
}

void validate_persistent_options(const PersistentOptions& options) {
  const int scheduler = static_cast<int>(options.scheduler);
  if (scheduler < 0 || scheduler >= kSchedulers) {
    throw InvalidArgument("options.scheduler (" + std::to_string(scheduler) + ") is not a Scheduler");
  }
  if (options.group_m < 1) {
    throw InvalidArgument("options.group_m (" + std::to_string(options.group_m) + ") must be >= 1");
  }
  if (options.stream_k_max_tail_percent < 0 || options.stream_k_max_tail_percent > 100) {
    throw InvalidArgument("options.stream_k_max_tail_percent (" + std::to_string(options.stream_k_max_tail_percent) +
                          ") must be in [0, 100]");
  }
}

void validate_persistent_options(const GroupedGemmShape& shape, const __nv_bfloat16* c,
                                 const PersistentOptions& options, const void* workspace, std::size_t workspace_bytes,
                                 int grid) {
  validate_persistent_options(options);
  const std::size_t needed = persistent_workspace_bytes(shape, grid);
  check_workspace(workspace, workspace_bytes, needed, "grouped_gemm_persistent_workspace_bytes");
  const auto c_bytes = static_cast<std::uint64_t>(shape.m_total) * static_cast<std::uint64_t>(shape.n) * 2;
  if (kc::overlaps(c, c_bytes, workspace, needed)) throw InvalidArgument("workspace must not overlap c");
}

std::int64_t grouped_tiles(const GroupedGemmShape& shape, std::span<const std::int32_t> host_offsets) {
  ch05::validate_host_offsets(shape, host_offsets);
  std::int64_t m_tiles = 0;
  for (int e = 0; e < shape.experts; ++e) {
    m_tiles += ch05::m_tiles_of(host_offsets[e + 1] - host_offsets[e], ch05::kBlockM);
  }
  return m_tiles * ((shape.n + ch05::kBlockN - 1) / ch05::kBlockN);
}

std::vector<BenchCase> benchmark_cases() {
  std::vector<BenchCase> cases = ch05::benchmark_cases();
  // Poor last waves on 132 slots: 9 m-tiles × 16 n-tiles = 144 tiles (1.09 waves) and 12 × 16 = 192
  // tiles (1.45 waves); DeepSeek-V3's K = 7168, one 2048-wide projection.
  cases.push_back(ch05::uniform_case(3, 384, 2048, 7168, "tail_"));
  cases.push_back(ch05::uniform_case(4, 384, 2048, 7168, "tail_"));
  return cases;
}

std::string wave_table_row(const BenchCase& bench_case, int slots) {
  const std::vector<std::int32_t> offsets = ch05::offsets_of_sizes(bench_case.sizes);
  const std::int64_t tiles = grouped_tiles(bench_case.shape, offsets);
  const Waves w = waves_of(tiles, slots);
  const double stream_k_waves = static_cast<double>(tiles) / static_cast<double>(slots);
  char line[256];
  std::snprintf(line, sizeof line, "| `%s` | %lld | %lld | %lld | %.0f %% | %.1f %% | %.2f × |",
                bench_case.label.c_str(), static_cast<long long>(tiles), static_cast<long long>(w.waves),
                static_cast<long long>(w.last_wave_tiles), 100.0 * w.last_wave_utilisation, 100.0 * w.efficiency,
                stream_k_waves > 0 ? static_cast<double>(w.waves) / stream_k_waves : 0.0);
  return line;
}

}  // namespace kc::ch06
