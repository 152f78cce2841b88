#include "common/env.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <strings.h>

#include "common/error.h"

namespace smdccl {

namespace {
std::vector<EnvVar>& table() {
  static std::vector<EnvVar> vars;
  return vars;
}
}  // namespace

EnvRegistration::EnvRegistration(const EnvVar& v) {
  EnvVar entry = v;
  // __FILE__ may be absolute: keep the path from csrc/ on.
  if (const char* at = std::strstr(entry.declaredIn, "csrc/")) entry.declaredIn = at;
  auto& vars = table();
  auto pos = std::find_if(vars.begin(), vars.end(),
                          [&](const EnvVar& e) { return std::strcmp(e.name, entry.name) > 0; });
  vars.insert(pos, entry);  // a name declared twice stays twice: tests look for that
}

const std::vector<EnvVar>& envVars() { return table(); }

std::string envString(const EnvVar& v) {
  const char* s = std::getenv(v.name);
  return (s && *s) ? std::string(s) : std::string(v.defaultValue);
}

std::string envChoice(const EnvVar& v) {
  std::string s = envString(v);
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

namespace {
std::string rangeText(const EnvVar& v) {
  auto num = [](double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.15g", x);
    return std::string(buf);
  };
  return num(v.min) + " to " + num(v.max);
}

// `value` is one of the ", "-separated `choices`, ignoring case.
bool isOneOf(const char* value, const char* choices) {
  size_t n = std::strlen(value);
  for (const char* c = choices; *c;) {
    const char* end = std::strstr(c, ", ");
    size_t len = end ? static_cast<size_t>(end - c) : std::strlen(c);
    if (len == n && strncasecmp(c, value, n) == 0) return true;
    if (!end) break;
    c = end + 2;
  }
  return false;
}

[[noreturn]] void badValue(const EnvVar& v, const std::string& s, const char* what) {
  throw InvalidArgument(strCat("smdccl: ", v.name, "='", s, "' ", what, ": use ",
                               v.kind == EnvVar::Kind::Int ? "an integer" : "a number", " from ",
                               rangeText(v), " (default ", v.defaultValue, "), or unset it"));
}
}  // namespace

int64_t envInt(const EnvVar& v) {
  std::string s = envString(v);
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(s.c_str(), &end, 10);
  if (end == s.c_str() || *end != '\0') badValue(v, s, "is not an integer");
  if (errno == ERANGE || (v.kind == EnvVar::Kind::Int && (x < v.min || x > v.max)))
    badValue(v, s, "is out of range");
  return x;
}

double envDouble(const EnvVar& v) {
  std::string s = envString(v);
  char* end = nullptr;
  double x = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || *end != '\0') badValue(v, s, "is not a number");
  if (!std::isfinite(x) || (v.kind == EnvVar::Kind::Number && (x < v.min || x > v.max)))
    badValue(v, s, "is out of range");
  return x;
}

void checkEnvironment() {
  for (const auto& v : envVars()) {
    const char* set = std::getenv(v.name);
    if (!set || !*set) continue;
    if (v.kind == EnvVar::Kind::Int) envInt(v);
    else if (v.kind == EnvVar::Kind::Number) envDouble(v);
    else if (*v.choices && !isOneOf(set, v.choices))
      throw InvalidArgument(strCat("smdccl: ", v.name, "='", set, "' is not one of: ", v.choices,
                                   " (default ", v.defaultValue, "), or unset it"));
  }
}

}  // namespace smdccl
