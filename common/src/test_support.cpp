#include "kc/test_support.hpp"

#include <cstdlib>
#include <iostream>
#include <optional>

#include "kc/check.hpp"
#include "kc/random.hpp"

namespace kc::test {

namespace {
std::optional<DeviceInfo>& cached_device() {
  static std::optional<DeviceInfo> info;
  return info;
}
}  // namespace

void GpuTest::SetUp() {
  if (auto reason = no_gpu_reason(required_major(), required_minor())) {
    GTEST_SKIP() << *reason;
  }
  if (!cached_device()) cached_device() = query_device(0);
}

const DeviceInfo& GpuTest::device() const { return *cached_device(); }

std::uint64_t test_seed() {
  const std::uint64_t seed = random_seed();
  std::cout << "[   SEED   ] " << seed << "  (rerun with KC_SEED=" << seed << " to reproduce)\n";
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  return seed;
}

bool small_tests_only() {
  const char* env = std::getenv("KC_SMALL_TESTS");
  return env != nullptr && *env != '\0' && std::string(env) != "0";
}

void expect_close(const Comparison& result, double rel_tol, const std::string& what) {
  EXPECT_TRUE(result.passes(rel_tol)) << what << ": " << result.summary() << " (tolerance " << rel_tol << ")";
}

void expect_graph_capturable(const LaunchUnderTest& run) {
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  run.poison_outputs();
  run.launch(stream);
  check(cudaStreamSynchronize(stream));
  const std::vector<unsigned char> eager = run.read_outputs();

  run.poison_outputs();
  cudaGraph_t graph = nullptr;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  std::string problem;  // one failure with the whole story, not one per symptom
  try {
    run.launch(stream);
  } catch (const std::exception& e) {
    problem = std::string("the launch path threw during stream capture: ") + e.what();
  }
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  cudaGetLastError();
  if (problem.empty() && (end != cudaSuccess || graph == nullptr)) {
    problem = std::string("stream capture failed: ") + cudaGetErrorString(end);
  }
  if (!problem.empty()) {
    ADD_FAILURE() << problem << " (a launch path must not synchronise or allocate)";
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
    return;
  }
  cudaGraphExec_t exec = nullptr;
  check(cudaGraphInstantiate(&exec, graph, 0));
  check(cudaGraphLaunch(exec, stream));
  check(cudaStreamSynchronize(stream));
  const std::vector<unsigned char> replayed = run.read_outputs();
  EXPECT_TRUE(replayed == eager) << "graph replay wrote different bytes than an ordinary launch";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

void expect_bitwise_repeatable(const LaunchUnderTest& run, int runs) {
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<unsigned char> first;
  for (int r = 0; r < runs; ++r) {
    run.poison_outputs();
    run.launch(stream);
    check(cudaStreamSynchronize(stream));
    std::vector<unsigned char> out = run.read_outputs();
    if (r == 0) {
      first = std::move(out);
    } else {
      EXPECT_TRUE(out == first) << "run " << r << " differs bitwise from run 0";
    }
  }
  cudaStreamDestroy(stream);
}

void expect_invalid_argument(const std::function<void()>& call, const std::string& fragment) {
  try {
    call();
    ADD_FAILURE() << "expected kc::InvalidArgument mentioning \"" << fragment << "\", nothing was thrown";
  } catch (const kc::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
        << "message \"" << e.what() << "\" does not mention \"" << fragment << "\"";
  }
}

}  // namespace kc::test
