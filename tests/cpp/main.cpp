#include <cstdio>
#include <exception>

#include "check.h"

int gFailures = 0;
std::vector<TestCase>& testRegistry() {
  static std::vector<TestCase> r;
  return r;
}

int main() {
  int passed = 0, failed = 0;
  for (auto& t : testRegistry()) {
    int before = gFailures;
    try {
      t.fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "  %s: unexpected exception: %s\n", t.name, e.what());
      ++gFailures;
    }
    bool ok = gFailures == before;
    std::printf("%s %s\n", ok ? "PASS" : "FAIL", t.name);
    (ok ? passed : failed)++;
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
