// The fp64 check of the grouped Hopper chapters' epilogues (Chapter 8 and later): SwiGLU and the row
// scale, sampled, and the rows of no expert left untouched.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "grouped_gemm_problems.hpp"
#include "hopper_grouped_gemm.hpp"

namespace kc::test::grouped {

// Checks @p got (C of @p p with epilogue @p kind, [M_total, n_out]) against fp64 from the bf16
// inputs: every column of every 7th row and every 37th column of the others. SwiGLU: silu(gate) · up
// with gate column col and up column N / 2 + col of the plain product; row_scale: @p scale[row]
// times it. Rows from offsets[E] on must still hold the poison.
inline void expect_epilogue_matches_fp64(const Problem& p, ch08::EpilogueKind kind, const std::vector<float>& scale,
                                         const std::vector<bf16>& got) {
  const std::int64_t rows = p.offsets.back(), n = p.shape.n;
  const std::int64_t n_out = ch08::output_columns(n, kind);
  std::vector<bf16> sampled;
  std::vector<double> want;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t col = 0; col < n_out; col += (r % 7 == 0 ? 1 : 37)) {
      sampled.push_back(got[static_cast<std::size_t>(r * n_out + col)]);
      if (kind == ch08::EpilogueKind::swiglu) {
        const double gate = reference_element(p, r, col);
        const double up = reference_element(p, r, n / 2 + col);
        want.push_back(gate / (1.0 + std::exp(-gate)) * up);
      } else {
        want.push_back(scale[static_cast<std::size_t>(r)] * reference_element(p, r, col));
      }
    }
  }
  kc::test::expect_close(kc::compare<bf16>(sampled, want, kPoisonByte), kTolerance, "vs fp64");
  const std::span<const bf16> beyond(got.data() + rows * n_out,
                                     static_cast<std::size_t>((p.shape.m_total - rows) * n_out));
  EXPECT_EQ(kc::count_poisoned(beyond, kPoisonByte), beyond.size()) << "wrote rows of no expert";
}

}  // namespace kc::test::grouped
