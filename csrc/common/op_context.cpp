#include "common/op_context.h"

#include "common/error.h"

namespace smdccl {

namespace {

// torch's c10d::ReduceOp::RedOpType, in its order.
const char* torchRedOpName(int code) {
  static const char* names[] = {"sum",  "avg", "product", "min",       "max",
                                "band", "bor", "bxor",    "premul_sum"};
  return code >= 0 && code < 9 ? names[code] : "?";
}

}  // namespace

std::string OpSignature::describe() const {
  std::string s = name + "(";
  bool first = true;
  auto add = [&](const std::string& part) {
    s += (first ? "" : ", ") + part;
    first = false;
  };
  if (dtype >= 0) add(dtypeName);
  if (count != kAnyCount) add(strCat(count, count == 1 ? " element" : " elements"));
  if (redop >= 0) add(torchRedOpName(redop));
  if (root >= 0) add(strCat("root ", root));
  return s + ")";
}

std::string OpContext::describe() const {
  return strCat(opName, " #", seq, " on group '", group ? *group : std::string("?"), "' (rank ",
                rank, ")");
}

}  // namespace smdccl
