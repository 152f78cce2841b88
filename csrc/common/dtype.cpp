#include "common/dtype.h"

#include <cctype>

#include "common/error.h"

namespace smdccl {

const char* dtypeName(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::F64: return "float64";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
    case DType::I8: return "int8";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
    case DType::U8: return "uint8";
    case DType::Bool: return "bool";
  }
  return "?";
}

const char* redOpName(RedOp op) {
  switch (op) {
    case RedOp::Sum: return "SUM";
    case RedOp::Prod: return "PRODUCT";
    case RedOp::Min: return "MIN";
    case RedOp::Max: return "MAX";
    case RedOp::BAnd: return "BAND";
    case RedOp::BOr: return "BOR";
    case RedOp::BXor: return "BXOR";
  }
  return "?";
}

Compression parseCompression(std::string name, const char* where) {
  for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (name.empty() || name == "none") return {};
  if (name == "fp16") return {.wire = Wire::F16};
  if (name == "bf16") return {.wire = Wire::BF16};
  if (name == "int8") return {.int8 = true};
  throw InvalidArgument(strCat("smdccl: compression '", name,
                               "' is not one of: ", kCompressionNames, " (", where, ")"));
}

const char* wireName(Wire w) {
  switch (w) {
    case Wire::F16: return "fp16";
    case Wire::BF16: return "bf16";
    default: return "fp32";
  }
}

}  // namespace smdccl
