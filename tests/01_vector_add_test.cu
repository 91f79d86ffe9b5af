// Chapter 1 tests. CPU tests (argument rules) run everywhere; GPU tests skip with a reason
// where there is no GPU. Vector add is exact in fp32: float(double(a) + double(b)) is the correctly
// rounded fp32 sum, so every kernel must match the rounded fp64 reference bit for bit (tolerance 0).
#include <gtest/gtest.h>

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "kc/compare.hpp"
#include "kc/device_buffer.hpp"
#include "kc/random.hpp"
#include "kc/reference.hpp"
#include "kc/test_support.hpp"
#include "vector_add.hpp"

namespace {

using kc::test::expect_invalid_argument;

using LaunchFn = void (*)(const float*, const float*, float*, std::int64_t, cudaStream_t);

void launch_after_default(const float* a, const float* b, float* c, std::int64_t n, cudaStream_t s) {
  kc::ch01::vector_add_after(a, b, c, n, s);
}

struct Variant {
  const char* name;
  LaunchFn launch;
};

const Variant kVariants[] = {
    {"before", kc::ch01::vector_add_before},
    {"after", launch_after_default},
    {"uncoalesced", kc::ch01::vector_add_uncoalesced},
};

// Readable test names and failure messages: "before", not the struct's bytes.
void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

std::string variant_name(const ::testing::TestParamInfo<Variant>& info) { return info.param.name; }

// ---------------------------------------------------------------- CPU: argument rules, no GPU needed

TEST(VectorAddArguments, RejectsNegativeN) {
  float x = 0;
  expect_invalid_argument([&] { kc::ch01::validate_vector_add(&x, &x, &x, -1); }, "n (-1) must be >= 0");
}

TEST(VectorAddArguments, RejectsNullPointersWhenNPositive) {
  float x[4] = {};
  expect_invalid_argument([&] { kc::ch01::validate_vector_add(nullptr, x, x, 4); }, "a must not be null");
  expect_invalid_argument([&] { kc::ch01::validate_vector_add(x, nullptr, x, 4); }, "b must not be null");
  expect_invalid_argument([&] { kc::ch01::validate_vector_add(x, x, nullptr, 4); }, "c must not be null");
}

TEST(VectorAddArguments, AcceptsNullPointersWhenNIsZero) {
  EXPECT_NO_THROW(kc::ch01::validate_vector_add(nullptr, nullptr, nullptr, 0));
}

TEST(VectorAddArguments, AllowsInPlaceButRejectsPartialOverlap) {
  float x[16] = {}, y[16] = {};
  EXPECT_NO_THROW(kc::ch01::validate_vector_add(x, y, x, 16));
  EXPECT_NO_THROW(kc::ch01::validate_vector_add(x, y, y, 16));
  expect_invalid_argument([&] { kc::ch01::validate_vector_add(x, y, x + 1, 15); }, "c must be the same array as a");
  expect_invalid_argument([&] { kc::ch01::validate_vector_add(x, y + 2, y, 14); }, "c must be the same array as b");
}

TEST(VectorAddArguments, RejectsPointersNotAlignedForFloat) {
  alignas(16) unsigned char raw[64] = {};
  auto* odd = reinterpret_cast<float*>(raw + 2);
  auto* fine = reinterpret_cast<float*>(raw + 32);
  expect_invalid_argument([&] { kc::ch01::validate_vector_add(odd, fine, fine, 2); }, "a must be 4-byte aligned");
}

TEST(VectorAddArguments, RejectsBadVectorizedConfig) {
  using kc::ch01::VectorizedConfig;
  expect_invalid_argument(
      [] {
        kc::ch01::validate_vectorized_config(VectorizedConfig{100, 2, 8});
      },
      "config.threads_per_block (100) must be a multiple of 32");
  expect_invalid_argument(
      [] {
        kc::ch01::validate_vectorized_config(VectorizedConfig{256, 3, 8});
      },
      "config.unroll (3) must be 1, 2 or 4");
  expect_invalid_argument(
      [] {
        kc::ch01::validate_vectorized_config(VectorizedConfig{256, 2, 0});
      },
      "config.blocks_per_sm (0) must be >= 1");
}

// Every launch function validates before touching CUDA: these run (and throw) without a GPU.
TEST(VectorAddArguments, LaunchFunctionsRejectBeforeAnyCudaCall) {
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.name);
    expect_invalid_argument([&] { v.launch(nullptr, nullptr, nullptr, 5, nullptr); }, "a must not be null");
    expect_invalid_argument([&] { v.launch(nullptr, nullptr, nullptr, -3, nullptr); }, "n (-3) must be >= 0");
    EXPECT_NO_THROW(v.launch(nullptr, nullptr, nullptr, 0, nullptr)) << "n = 0 must launch nothing";
  }
}

// ---------------------------------------------------------------- GPU

// fp64 reference, rounded once to fp32: the double sum of two floats is exact, so rounding it to
// float gives the correctly rounded fp32 sum, which is what an IEEE fp32 add must produce.
std::vector<double> reference_sum(std::span<const float> a, std::span<const float> b) {
  std::vector<double> sum = kc::ref::widen(a);
  for (std::size_t i = 0; i < b.size(); ++i) sum[i] += static_cast<double>(b[i]);
  return kc::ref::round_to_float(sum);
}

class VectorAddGpu : public kc::test::GpuTest, public ::testing::WithParamInterface<Variant> {
 protected:
  // Random a and b, poisoned c with a guard; runs the variant and checks c exactly.
  void check_n(std::int64_t n) {
    SCOPED_TRACE("n = " + std::to_string(n));
    const std::uint64_t seed = kc::test::test_seed();
    std::vector<float> a(static_cast<std::size_t>(n)), b(static_cast<std::size_t>(n));
    kc::fill_uniform(std::span<float>(a), seed);
    kc::fill_uniform(std::span<float>(b), seed + 1);
    kc::DeviceBuffer<float> da(a), db(b);
    kc::test::GuardedOutput<float> dc(static_cast<std::size_t>(n));

    GetParam().launch(da.data(), db.data(), dc.data(), n, nullptr);
    kc::check(cudaDeviceSynchronize());

    const std::vector<double> ref = reference_sum(a, b);
    const std::vector<float> got = dc.to_host();
    const kc::Comparison result = kc::compare<float>(got, ref, kc::test::kPoisonByte);
    kc::test::expect_close(result, 0.0, GetParam().name);
    EXPECT_EQ(result.max_abs_error, 0.0) << "fp32 a + b is exact: every element must match";
    EXPECT_EQ(dc.guard_damage(), 0u) << "wrote past the end of c";
  }
};

TEST_P(VectorAddGpu, EmptyLaunchesNothing) { check_n(0); }
TEST_P(VectorAddGpu, OneElement) { check_n(1); }
TEST_P(VectorAddGpu, ThreeElements) { check_n(3); }
TEST_P(VectorAddGpu, OddSize1023) { check_n(1023); }
TEST_P(VectorAddGpu, MillionPlusSeven) { check_n((1 << 20) + 7); }
TEST_P(VectorAddGpu, Large2Pow28) {
  if (kc::test::small_tests_only()) GTEST_SKIP() << "KC_SMALL_TESTS is set: skipping the 1 GiB-per-array case";
  check_n(std::int64_t{1} << 28);
}

TEST_P(VectorAddGpu, InPlaceIntoA) {
  const std::int64_t n = 100003;
  const std::uint64_t seed = kc::test::test_seed();
  std::vector<float> a(n), b(n);
  kc::fill_uniform(std::span<float>(a), seed);
  kc::fill_uniform(std::span<float>(b), seed + 1);
  kc::DeviceBuffer<float> da(a), db(b);
  GetParam().launch(da.data(), db.data(), da.data(), n, nullptr);
  const std::vector<float> got = da.to_host();
  kc::test::expect_close(kc::compare<float>(got, reference_sum(a, b)), 0.0, "c == a");
}

// Pointers offset from the allocation: same offset (vector path with a scalar head) and different
// offsets (scalar fallback). Checked through the elements around the range too: nothing else written.
TEST_P(VectorAddGpu, OffsetPointers) {
  const std::uint64_t seed = kc::test::test_seed();
  const std::int64_t n = 4099;
  const int offsets[][3] = {{1, 1, 1}, {2, 2, 2}, {3, 3, 3}, {1, 2, 3}, {0, 1, 0}, {0, 0, 3}};
  for (const auto& off : offsets) {
    SCOPED_TRACE("offsets a+" + std::to_string(off[0]) + " b+" + std::to_string(off[1]) + " c+" +
                 std::to_string(off[2]));
    std::vector<float> a(n + 8), b(n + 8);
    kc::fill_uniform(std::span<float>(a), seed);
    kc::fill_uniform(std::span<float>(b), seed + 1);
    kc::DeviceBuffer<float> da(a), db(b);
    kc::DeviceBuffer<float> dc(n + 8);
    dc.fill_bytes(kc::test::kPoisonByte);
    GetParam().launch(da.data() + off[0], db.data() + off[1], dc.data() + off[2], n, nullptr);
    const std::vector<float> all = dc.to_host();
    const std::vector<double> ref =
        reference_sum(std::span<const float>(a.data() + off[0], n), std::span<const float>(b.data() + off[1], n));
    kc::test::expect_close(
        kc::compare<float>(std::span<const float>(all.data() + off[2], n), ref, kc::test::kPoisonByte), 0.0,
        "offset pointers");
    const std::size_t before = kc::count_poisoned(std::span<const float>(all.data(), off[2]), kc::test::kPoisonByte);
    const std::size_t after =
        kc::count_poisoned(std::span<const float>(all.data() + off[2] + n, 8 - off[2]), kc::test::kPoisonByte);
    EXPECT_EQ(before + after, static_cast<std::size_t>(8)) << "wrote outside [c, c + n)";
  }
}

TEST_P(VectorAddGpu, BadArgumentsWriteNothing) {
  kc::DeviceBuffer<float> da(64), db(64);
  kc::test::GuardedOutput<float> dc(64);
  expect_invalid_argument([&] { GetParam().launch(nullptr, db.data(), dc.data(), 64, nullptr); }, "a must not be null");
  expect_invalid_argument([&] { GetParam().launch(da.data(), db.data(), dc.data(), -64, nullptr); }, "n (-64)");
  kc::check(cudaDeviceSynchronize());
  EXPECT_EQ(kc::count_poisoned(std::span<const float>(dc.to_host()), kc::test::kPoisonByte), 64u)
      << "a rejected call must write nothing";
}

kc::test::LaunchUnderTest make_run(const Variant& v, kc::DeviceBuffer<float>& a, kc::DeviceBuffer<float>& b,
                                   kc::DeviceBuffer<float>& c) {
  const auto n = static_cast<std::int64_t>(c.size());
  return {[&, n, v](cudaStream_t s) { v.launch(a.data(), b.data(), c.data(), n, s); },
          [&] { c.fill_bytes(kc::test::kPoisonByte); },
          [&] {
            const std::vector<float> h = c.to_host();
            const auto* bytes = reinterpret_cast<const unsigned char*>(h.data());
            return std::vector<unsigned char>(bytes, bytes + h.size() * sizeof(float));
          }};
}

TEST_P(VectorAddGpu, GraphCapturableAndRepeatable) {
  const std::uint64_t seed = kc::test::test_seed();
  const std::size_t n = (1 << 16) + 5;
  std::vector<float> a(n), b(n);
  kc::fill_uniform(std::span<float>(a), seed);
  kc::fill_uniform(std::span<float>(b), seed + 1);
  kc::DeviceBuffer<float> da(a), db(b), dc(n);
  const kc::test::LaunchUnderTest run = make_run(GetParam(), da, db, dc);
  kc::test::expect_graph_capturable(run);
  kc::test::expect_bitwise_repeatable(run);
}

INSTANTIATE_TEST_SUITE_P(Variants, VectorAddGpu, ::testing::ValuesIn(kVariants), variant_name);

// Every tuning of the vectorized kernel computes the same exact result.
class VectorAddConfigGpu : public kc::test::GpuTest {};

TEST_F(VectorAddConfigGpu, EveryConfigIsExact) {
  const std::uint64_t seed = kc::test::test_seed();
  const std::int64_t n = 3 * (1 << 18) + 3;
  std::vector<float> a(n), b(n);
  kc::fill_uniform(std::span<float>(a), seed);
  kc::fill_uniform(std::span<float>(b), seed + 1);
  const std::vector<double> ref = reference_sum(a, b);
  kc::DeviceBuffer<float> da(a), db(b);
  kc::test::GuardedOutput<float> dc(n);
  for (int threads : {32, 256, 1024}) {
    for (int unroll : {1, 2, 4}) {
      for (int blocks_per_sm : {1, 8}) {
        SCOPED_TRACE(std::to_string(threads) + " threads, unroll " + std::to_string(unroll) + ", " +
                     std::to_string(blocks_per_sm) + " blocks/SM");
        dc.poison();
        kc::ch01::vector_add_after(da.data(), db.data(), dc.data(), n, nullptr, {threads, unroll, blocks_per_sm});
        kc::test::expect_close(kc::compare<float>(dc.to_host(), ref, kc::test::kPoisonByte), 0.0, "config");
        EXPECT_EQ(dc.guard_damage(), 0u);
      }
    }
  }
}

}  // namespace
