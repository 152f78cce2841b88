#include <chrono>
#include <cstdio>
#include <exception>
#include <string>

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
  int passed = 0, failed = 0;
  for (auto& t : testRegistry()) {
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
