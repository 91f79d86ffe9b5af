// Chapter 7's GPU tests of the launch itself: unaligned outputs, graph capture and bitwise
// repeatability, the dependent launch's ordering, and the message on a GPU that is not sm_90.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "hopper_gemm.hpp"
#include "hopper_gemm_checks.hpp"
#include "hopper_launch.hpp"
#include "kc/compare.hpp"
#include "kc/device_buffer.hpp"
#include "kc/random.hpp"
#include "kc/test_support.hpp"

namespace {

using namespace kc::test::hopper;  // NOLINT: the chapter's test vocabulary

// c only 2-byte aligned (an odd element offset) and N even: the launch must fall back to element
// stores, and still write every element.
// Step 6 with N a multiple of 8 but c only 8-byte aligned (4 elements in) falls back to register
// stores too; with c 16-byte aligned (8 elements in) it stores through TMA from an offset base.
TEST_F(HopperGpuTest, OddOutputOffsetUsesElementStores) {
  struct Case {
    GemmShape shape;
    int offset;  // elements between the allocation and c
  };
  for (const Case& k : {Case{{70, 130, 64}, 1}, Case{{70, 136, 64}, 4}, Case{{70, 136, 64}, 8}}) {
    const GemmShape s = k.shape;
    SCOPED_TRACE(shape_name(s) + ", c at element " + std::to_string(k.offset));
    const Inputs in = random_inputs(s, kc::test::test_seed());
    kc::DeviceBuffer<bf16> a(in.a), w(in.w);
    const auto offset = static_cast<std::size_t>(k.offset);
    kc::test::GuardedOutput<bf16> storage(static_cast<std::size_t>(s.m * s.n) + offset);
    for (const auto& [name, launch] : every_launch()) {
      storage.poison();
      launch(a.data(), w.data(), storage.data() + offset, s, nullptr);
      kc::check(cudaDeviceSynchronize());
      const std::vector<bf16> all = storage.to_host();
      EXPECT_EQ(kc::count_poisoned(std::span<const bf16>(all.data(), offset), kc::test::kPoisonByte), offset)
          << name << " wrote before c";
      const std::span<const bf16> got(all.data() + offset, all.size() - offset);
      kc::test::expect_close(compare_with_reference(in, got, s, 0), kTolerance, name);
      EXPECT_EQ(storage.guard_damage(), 0u) << name;
    }
  }
}

// Graph capture (global mode: any synchronisation or allocation in the launch path fails it) and
// bitwise repeatability, for every kernel.
TEST_F(HopperGpuTest, GraphCapturableAndRepeatable) {
  // N = 296 also takes step 6's TMA-store path (N a multiple of 8); N = 300 its register fallback.
  for (const GemmShape s : {GemmShape{257, 300, 1032}, GemmShape{257, 296, 1032}}) {
    const Inputs in = random_inputs(s, kc::test::test_seed());
    kc::DeviceBuffer<bf16> a(in.a), w(in.w);
    kc::test::GuardedOutput<bf16> c(static_cast<std::size_t>(s.m * s.n));
    for (const auto& [name, launch] : every_launch()) {
      SCOPED_TRACE(name + ", " + shape_name(s));
      kc::test::LaunchUnderTest run{
          [&, launch = launch](cudaStream_t stream) { launch(a.data(), w.data(), c.data(), s, stream); },
          [&] { c.poison(); },
          [&] {
            const std::vector<bf16> host = c.to_host();
            const auto* bytes = reinterpret_cast<const unsigned char*>(host.data());
            return std::vector<unsigned char>(bytes, bytes + host.size() * sizeof(bf16));
          }};
      kc::test::expect_graph_capturable(run);
      kc::test::expect_bitwise_repeatable(run);
    }
  }
}

// `after` is a programmatic dependent launch: its blocks may start while the previous kernel in the
// stream still runs, and must wait for it before touching memory. Two pairs of launches on one
// stream, one per hazard, each against step 6 run launch by launch with a synchronisation between
// them, bit for bit (the same kernel code, the same order of sums):
//   - read after write: X = A·W1ᵀ, then Y = X·W2ᵀ reads the X the first launch is writing;
//   - write after read: X = A·W1ᵀ, then A = B·Vᵀ overwrites the A the first launch is reading.
// The first launch of each pair is long (2048 × 2048 × 4096, several µs per tile), so a second launch
// that did not wait would read X before it is written or overwrite A before it is read.
TEST_F(HopperGpuTest, AfterWaitsForThePreviousKernel) {
  if (kc::test::small_tests_only()) GTEST_SKIP() << "KC_SMALL_TESTS is set: large shapes";
  const GemmShape first{2048, 2048, 4096};    // X = A·W1ᵀ
  const GemmShape chained{2048, 264, 2048};   // Y = X·W2ᵀ
  const GemmShape overwrite{2048, 4096, 72};  // A = B·Vᵀ, A's own shape
  const std::uint64_t seed = kc::test::test_seed();
  const Inputs in_first = random_inputs(first, seed);
  const Inputs in_chained = random_inputs(chained, seed + 1);
  const Inputs in_overwrite = random_inputs(overwrite, seed + 2);
  kc::DeviceBuffer<bf16> w1(in_first.w), w2(in_chained.w), b(in_overwrite.a), v(in_overwrite.w);
  const auto step6 = [](const bf16* a, const bf16* w, bf16* c, GemmShape s) {
    kc::ch07::gemm_bf16_hopper_step(HopperStep::tma_store, a, w, c, s);
    kc::check(cudaDeviceSynchronize());
  };
  const Launch after = after_launch();  // none of these shapes splits its last round: whole tiles, as step 6
  const auto elements = [](GemmShape s) { return static_cast<std::size_t>(s.m * s.n); };
  const auto same_bits = [](const kc::DeviceBuffer<bf16>& got, const kc::DeviceBuffer<bf16>& want) {
    const std::vector<bf16> g = got.to_host(), w = want.to_host();
    return g.size() == w.size() && std::memcmp(g.data(), w.data(), g.size() * sizeof(bf16)) == 0;
  };

  // Read after write.
  {
    kc::DeviceBuffer<bf16> a(in_first.a), x_want(elements(first)), y_want(elements(chained));
    step6(a.data(), w1.data(), x_want.data(), first);
    step6(x_want.data(), w2.data(), y_want.data(), chained);
    kc::DeviceBuffer<bf16> x(elements(first)), y(elements(chained));
    x.fill_bytes(kc::test::kPoisonByte);
    y.fill_bytes(kc::test::kPoisonByte);
    kc::check(cudaDeviceSynchronize());
    after(a.data(), w1.data(), x.data(), first, nullptr);
    after(x.data(), w2.data(), y.data(), chained, nullptr);
    kc::check(cudaDeviceSynchronize());
    EXPECT_TRUE(same_bits(x, x_want)) << "X = A·W1ᵀ differs from step 6";
    EXPECT_TRUE(same_bits(y, y_want)) << "Y = X·W2ᵀ read X before the launch writing it had finished";
  }
  // Write after read.
  {
    kc::DeviceBuffer<bf16> a(in_first.a), x_want(elements(first)), a_want(elements(overwrite));
    step6(a.data(), w1.data(), x_want.data(), first);
    step6(b.data(), v.data(), a_want.data(), overwrite);
    kc::DeviceBuffer<bf16> x(elements(first));
    x.fill_bytes(kc::test::kPoisonByte);
    kc::check(cudaDeviceSynchronize());
    after(a.data(), w1.data(), x.data(), first, nullptr);
    after(b.data(), v.data(), a.data(), overwrite, nullptr);
    kc::check(cudaDeviceSynchronize());
    EXPECT_TRUE(same_bits(x, x_want)) << "X = A·W1ᵀ read an A that the next launch had overwritten";
    EXPECT_TRUE(same_bits(a, a_want)) << "A = B·Vᵀ differs from step 6";
  }
}
// On a GPU that is not sm_90 the launch says what it needs (and launches nothing).
class HopperGemmOtherGpu : public kc::test::GpuTest {};

TEST_F(HopperGemmOtherGpu, SaysWhatItNeeds) {
  if (!kc::ch07::hopper_unsupported_reason(device().cc_major, device().cc_minor)) {
    GTEST_SKIP() << "this GPU is sm_90: the kernels run here (the other GPU tests cover it)";
  }
  kc::DeviceBuffer<bf16> a(64), w(64), c(64);
  c.fill_bytes(kc::test::kPoisonByte);
  try {
    kc::ch07::gemm_bf16_hopper(a.data(), w.data(), c.data(), {8, 8, 8});
    ADD_FAILURE() << "expected kc::ch07::UnsupportedGpu";
  } catch (const kc::ch07::UnsupportedGpu& e) {
    EXPECT_NE(std::string(e.what()).find("sm_90"), std::string::npos) << e.what();
  }
  const std::vector<bf16> after = c.to_host();
  EXPECT_EQ(kc::count_poisoned(std::span<const bf16>(after), kc::test::kPoisonByte), after.size()) << "nothing written";
}

}  // namespace
