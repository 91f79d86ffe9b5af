// The fp64 references, and the benchmark's group sizes and cases of Chapter 5, on the host: what the
// tests compare the kernels with, and what the benchmark runs. No CUDA call here.
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>

#include "grouped_gemm.hpp"
#include "kc/check.hpp"

namespace kc::ch05 {

namespace {

void check_experts(const char* name, int experts) {
  if (experts < 1 || experts > kMaxExperts) {
    throw InvalidArgument(std::string(name) + " (" + std::to_string(experts) + ") must be in [1, " +
                          std::to_string(kMaxExperts) + "]");
  }
}

}  // namespace

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
    if (total > 0x7FFFFFFF) throw InvalidArgument("the sum of sizes must be at most 2^31 - 1");
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
    case GroupSizes::ragged: {
      std::int64_t given = 0;
      for (int e = 0; e < experts; ++e) {
        sizes[e] = std::max(0, rows / experts + (37 * e) % 39 - 19);
        given += sizes[e];
      }
      for (int e = 0; given < rows; e = (e + 1) % experts, ++given) ++sizes[e];
      for (int e = 0; given > rows; e = (e + 1) % experts) {
        if (sizes[e] > 0) {
          --sizes[e];
          --given;
        }
      }
      break;
    }
  }
  return sizes;
}

GroupedCase uniform_case(int experts, std::int32_t rows_per_expert, std::int64_t n, std::int64_t k,
                         const std::string& prefix) {
  GroupedCase cs;
  std::ostringstream label;  // not a chain of string +: GCC 12's -Wrestrict misfires on those
  label << prefix << "G" << experts << "xM" << rows_per_expert << "_N" << n << "_K" << k;
  cs.label = label.str();
  cs.sizes = group_sizes(GroupSizes::uniform, experts, experts * rows_per_expert);
  cs.shape = {static_cast<std::int64_t>(experts) * rows_per_expert, n, k, experts};
  return cs;
}

GroupedCase skewed_case(GroupSizes kind, int experts, std::int32_t rows, std::int64_t n, std::int64_t k) {
  if (kind == GroupSizes::uniform) throw InvalidArgument("kind must be a skewed distribution (uniform_case)");
  const char* name = kind == GroupSizes::zipf            ? "zipf"
                     : kind == GroupSizes::one_hot       ? "hot"
                     : kind == GroupSizes::quarter_empty ? "empty25"
                                                         : "ragged";
  GroupedCase cs;
  std::ostringstream label;
  label << "E" << experts << "_M" << rows << "_" << name << "_N" << n << "_K" << k;
  cs.label = label.str();
  cs.sizes = group_sizes(kind, experts, rows);
  cs.shape = {rows, n, k, experts};
  return cs;
}

std::vector<GroupedCase> benchmark_cases() {
  return {uniform_case(8, 4096, 4096, 7168),
          uniform_case(32, 256, 4096, 7168),
          uniform_case(256, 128, 4096, 7168),
          skewed_case(GroupSizes::zipf, 256, 8192, 4096, 7168),
          skewed_case(GroupSizes::one_hot, 256, 8192, 4096, 7168),
          skewed_case(GroupSizes::quarter_empty, 256, 8192, 4096, 7168),
          uniform_case(8, 4096, 7168, 2048),
          uniform_case(8, 4096, 28672, 4096)};
}

}  // namespace kc::ch05
