#include "common/dtype.h"

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

const char* wireName(Wire w) {
  switch (w) {
    case Wire::F16: return "fp16";
    case Wire::BF16: return "bf16";
    default: return "fp32";
  }
}

}  // namespace smdccl
