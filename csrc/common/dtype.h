#pragma once
// Element types and reduction operators as the torch-free layers see them.
#include <cstddef>
#include <cstdint>
#include <string>

namespace smdccl {

enum class DType : uint8_t { F32, F64, F16, BF16, I8, I32, I64, U8, Bool };
// AVG and PREMUL_SUM are SUM with a scale applied by the backend, so the
// engine only knows the associative operators. The bitwise ones (as gloo
// has them) take integer and bool data only: their kernels exist for those.
enum class RedOp : uint8_t { Sum, Prod, Min, Max, BAnd, BOr, BXor };
inline bool isBitwise(RedOp op) {
  return op == RedOp::BAnd || op == RedOp::BOr || op == RedOp::BXor;
}

// What float32 data travels as over a link: itself, or rounded to 16 bits
// (added back in float32 on arrival).
enum class Wire : uint8_t { F32, F16, BF16 };
const char* wireName(Wire w);
// A group's compression between nodes (compression="..."): a 16-bit wire,
// or block int8.
struct Compression {
  Wire wire = Wire::F32;
  bool int8 = false;
};
inline constexpr const char* kCompressionNames = "none, fp16, bf16, int8";
// One of kCompressionNames (any case; "" is none); anything else raises
// InvalidArgument naming the choices and `where` it was set.
Compression parseCompression(std::string name, const char* where);

inline size_t elementSize(DType t) {
  switch (t) {
    case DType::F64:
    case DType::I64: return 8;
    case DType::F32:
    case DType::I32: return 4;
    case DType::F16:
    case DType::BF16: return 2;
    default: return 1;
  }
}

inline bool isFloating(DType t) {
  return t == DType::F32 || t == DType::F64 || t == DType::F16 || t == DType::BF16;
}

const char* dtypeName(DType t);
const char* redOpName(RedOp op);

}  // namespace smdccl
