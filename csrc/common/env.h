#pragma once
// Every SMDCCL_* environment variable is declared once, beside the code that
// reads it, with SMDCCL_ENV_TEXT / _CHOICE / _INT / _NUMBER: name, default,
// values, help. The declarations register themselves in one table, from
// which `python -m smdccl.info`, docs/env.md and the error messages for bad
// values are made.
#include <cstdint>
#include <string>
#include <vector>

namespace smdccl {

struct EnvVar {
  enum class Kind { Text, Int, Number };
  const char* name;
  const char* defaultValue;
  const char* help;
  // Numbers: what they must be, and the range they must lie in (checked
  // when a group is created, so a bad value fails there and says the range).
  Kind kind = Kind::Text;
  double min = 0;
  double max = 0;
  // Text with a fixed set of values: them, separated by ", " ("" = any).
  const char* choices = "";
  // The source file that declares (and reads) it, from csrc/.
  const char* declaredIn = "";
};

// Adds a declared variable to the table (at load time; see SMDCCL_ENV_*).
struct EnvRegistration {
  explicit EnvRegistration(const EnvVar& v);
};

// The declared variables, sorted by name.
const std::vector<EnvVar>& envVars();

// Reads a declared variable. envInt / envDouble throw InvalidArgument,
// naming the variable and its range, for a value that is not a number of
// the right kind or lies outside the range.
std::string envString(const EnvVar& v);
// A SMDCCL_ENV_CHOICE variable's value in lower case (choices take any case).
std::string envChoice(const EnvVar& v);
int64_t envInt(const EnvVar& v);
double envDouble(const EnvVar& v);

// Reads every declared variable that is set, so that a bad value fails at
// group creation (naming it) instead of at the first collective that reads it.
void checkEnvironment();

}  // namespace smdccl

// Declares `ident` (a constant EnvVar, usable from static initializers) for
// variable `name` and registers it. One each, beside the code that reads it.
#define SMDCCL_ENV_DECLARE_(ident, name, def, help, kind, lo, hi, choices)            \
  constexpr ::smdccl::EnvVar ident{name, def, help, kind, lo, hi, choices, __FILE__}; \
  static const ::smdccl::EnvRegistration ident##Registration_(ident)
// Free text; the empty default means unset.
#define SMDCCL_ENV_TEXT(ident, name, def, help) \
  SMDCCL_ENV_DECLARE_(ident, name, def, help, ::smdccl::EnvVar::Kind::Text, 0, 0, "")
// One of `choices` (", "-separated, any case).
#define SMDCCL_ENV_CHOICE(ident, name, def, choices, help) \
  SMDCCL_ENV_DECLARE_(ident, name, def, help, ::smdccl::EnvVar::Kind::Text, 0, 0, choices)
// An integer in [lo, hi].
#define SMDCCL_ENV_INT(ident, name, def, lo, hi, help) \
  SMDCCL_ENV_DECLARE_(ident, name, #def, help, ::smdccl::EnvVar::Kind::Int, lo, hi, "")
// A number in [lo, hi].
#define SMDCCL_ENV_NUMBER(ident, name, def, lo, hi, help) \
  SMDCCL_ENV_DECLARE_(ident, name, #def, help, ::smdccl::EnvVar::Kind::Number, lo, hi, "")
