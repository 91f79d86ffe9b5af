// Source of the fixtures gbench_1.7.json and gbench_1.8.json (see tools/README.md). Build it against
// an installed Google Benchmark: g++ -O2 -std=c++17 gbench_fixture.cc -lbenchmark -lpthread, run with
// --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// --benchmark_enable_random_interleaving=true --benchmark_min_time=0.005 --benchmark_out=FILE.json
#include <benchmark/benchmark.h>
#include <chrono>
#include <string>
#include <cstdint>
#include <vector>
#include <algorithm>
// Spin the CPU for `cpu_us`, but report `manual_us` as the iteration time, so rates
// derived from CPU time and from manual time differ by a known factor.
static void spin(double us) {
  auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() < us) {}
}
static double vmin(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }
static double vmax(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }
static void run(benchmark::State& state, double manual_us, double cpu_us, int64_t min_bytes, double flop) {
  // deterministic jitter (0..8%) per run, so the repetitions have a spread
  static unsigned long call = 0;
  const double jitter = 1.0 + 0.02 * double(call++ % 5);
  for (auto _ : state) {
    spin(cpu_us);
    state.SetIterationTime(manual_us * jitter * 1e-6);
  }
  state.SetBytesProcessed(min_bytes * state.iterations());
  if (flop > 0) {
    state.counters["flops"] = benchmark::Counter(flop, benchmark::Counter::kIsIterationInvariantRate);
  }
}
int main(int argc, char** argv) {
  struct V { const char* name; double manual_us; };
  V vs[] = {{"before", 400}, {"step1_coalesced", 250}, {"after", 100}, {"vendor", 110}, {"limit", 95}};
  for (auto& v : vs) {
    for (int64_t n : {int64_t(1) << 16, int64_t(1) << 20}) {
      std::string name = std::string("ch01/") + v.name + "/fp32_N" + std::to_string(n);
      double scale = double(n) / double(1 << 20);
      double mus = v.manual_us * scale;
      int64_t bytes = 12 * n;
      if (std::string(v.name) == "limit") bytes = 16 * n;
      benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) { run(s, mus, 20.0, bytes, double(n)); })
          ->UseManualTime()->Unit(n < (1 << 20) ? benchmark::kNanosecond : benchmark::kMillisecond)
          ->ComputeStatistics("min", vmin)->ComputeStatistics("max", vmax);
    }
  }
  // A variant that cannot run here reports an error instead of a time.
  benchmark::RegisterBenchmark("ch01/vendor_cub/fp32_N65536", [](benchmark::State& s) {
    s.SkipWithError("needs a GPU of sm_90 or newer");
    for (auto _ : s) {}
  })->UseManualTime()->ComputeStatistics("min", vmin)->ComputeStatistics("max", vmax);
  benchmark::Initialize(&argc, argv);
  benchmark::AddCustomContext("gpu", "fake GPU (fixture)");
  benchmark::AddCustomContext("commit", "0123abc");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
