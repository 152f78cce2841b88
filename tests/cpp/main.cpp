#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "check.h"

int gFailures = 0;
std::vector<TestCase>& testRegistry() {
  static std::vector<TestCase> r;
  return r;
}

std::vector<std::pair<std::string, ChildMain>>& childRegistry() {
  static std::vector<std::pair<std::string, ChildMain>> r;
  return r;
}

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "--child") {
    for (auto& [name, fn] : childRegistry())
      if (name == argv[2]) return fn(std::vector<std::string>(argv + 3, argv + argc));
    std::fprintf(stderr, "no child entry named %s\n", argv[2]);
    return 2;
  }
  // --only NAME [REPEATS]: the tests whose name contains NAME, REPEATS
  // times (default 1), stopping at the first failure: to chase a flaky test.
  if (argc >= 3 && std::string(argv[1]) == "--only") {
    const int repeats = argc >= 4 ? std::atoi(argv[3]) : 1;
    int ran = 0;
    for (int k = 0; k < repeats; ++k)
      for (const TestCase& t : testRegistry())
        if (std::string(t.name).find(argv[2]) != std::string::npos) {
          t.fn();
          ++ran;
          if (gFailures) {
            std::printf("FAIL %s on run %d\n", t.name, k + 1);
            return 1;
          }
        }
    std::printf("%d runs passed\n", ran);
    return ran ? 0 : 2;
  }
  // --shard K/N: only the tests whose index is K modulo N, so that N
  // processes can share the suite (tests/test_cpp_core.py runs two).
  size_t shard = 0, shards = 1;
  if (argc >= 3 && std::string(argv[1]) == "--shard" &&
      std::sscanf(argv[2], "%zu/%zu", &shard, &shards) != 2) {
    std::fprintf(stderr, "--shard takes K/N, e.g. 0/2; got %s\n", argv[2]);
    return 2;
  }
  if (shards == 0 || shard >= shards) {
    std::fprintf(stderr, "--shard %zu/%zu: K must be below N\n", shard, shards);
    return 2;
  }
  int passed = 0, failed = 0;
  const auto& tests = testRegistry();
  for (size_t i = shard; i < tests.size(); i += shards) {
    const TestCase& t = tests[i];
    int before = gFailures;
    auto start = std::chrono::steady_clock::now();
    try {
      t.fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "  %s: unexpected exception: %s\n", t.name, e.what());
      ++gFailures;
    }
    bool ok = gFailures == before;
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%s %s (%.2f s)\n", ok ? "PASS" : "FAIL", t.name, secs);
    (ok ? passed : failed)++;
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
