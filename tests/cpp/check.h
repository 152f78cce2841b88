#pragma once
// A minimal test registry: TEST(name) { CHECK(...); } — no dependency.
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

struct TestCase {
  const char* name;
  std::function<void()> fn;
};
std::vector<TestCase>& testRegistry();
struct TestRegistrar {
  TestRegistrar(const char* n, std::function<void()> f) { testRegistry().push_back({n, f}); }
};
extern int gFailures;

// A test that needs a second process runs this binary again with
// `--child <name> <args...>`: main() then runs the entry `name` registered
// here and exits with what it returns (threads of one process cannot be two
// ranks of a group: the TCP listener is per process).
using ChildMain = std::function<int(const std::vector<std::string>&)>;
std::vector<std::pair<std::string, ChildMain>>& childRegistry();
struct ChildRegistrar {
  ChildRegistrar(const char* n, ChildMain f) { childRegistry().push_back({n, std::move(f)}); }
};

#define TEST(name)                                     \
  static void test_##name();                           \
  static TestRegistrar reg_##name(#name, test_##name); \
  static void test_##name()

#define CHECK(cond)                                                                   \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "  %s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++gFailures;                                                                    \
    }                                                                                 \
  } while (0)

#define CHECK_THROWS(expr, ExType)             \
  do {                                         \
    bool thrown = false;                       \
    try {                                      \
      expr;                                    \
    } catch (const ExType&) { thrown = true; } \
    CHECK(thrown && #expr " throws " #ExType); \
  } while (0)
