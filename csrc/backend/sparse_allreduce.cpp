#include "backend/sparse_allreduce.h"

#include <cstdint>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "algorithms/collectives.h"
#include "backend/arg_checks.h"
#include "backend/reduce_scaling.h"
#include "common/error.h"

namespace smdccl {

namespace {

// What one rank holds: enough for every rank to size the others' blocks.
struct SparseMeta {
  int64_t sparseDim = 0, denseDim = 0, nnz = 0;
  std::vector<int64_t> sizes;
};

constexpr int kMetaFields = 3;  // sparseDim, denseDim, nnz
// A peer's fields come from the same code, but a bad value must raise, not
// size an allocation.
constexpr int64_t kMaxDims = 1024;

size_t roundUp8(size_t n) { return (n + 7) & ~size_t{7}; }

size_t checkedMul(size_t a, size_t b, const OpContext& ctx) {
  SMDCCL_CHECK_ARG(b == 0 || a <= std::numeric_limits<size_t>::max() / b,
                   "smdccl: ", ctx.describe(), ": sparse tensor sizes overflow");
  return a * b;
}

// Allgathers each rank's `mine`, `lengths[r]` bytes from rank r (8-byte
// multiples, so that every block stays aligned for int64). Returns the
// blocks, consecutive in rank order, and where each starts.
at::Tensor allgatherBlocks(Comm& c, const std::vector<const at::Tensor*>& mine,
                           const std::vector<size_t>& lengths, const Tuning& tuning,
                           Blocks& blocks) {
  blocks = Blocks::fromLengths(lengths);
  at::Tensor all = at::empty({static_cast<int64_t>(blocks.total())}, at::kByte);
  char* dst = bytesOf(all) + blocks.offset[static_cast<size_t>(c.rank())];
  for (const at::Tensor* t : mine) {
    if (t->nbytes()) std::memcpy(dst, t->data_ptr(), t->nbytes());
    dst += roundUp8(t->nbytes());
  }
  smdccl::allgather(c, bytesOf(all), blocks, tuning);
  return all;
}

std::vector<SparseMeta> allgatherMeta(Comm& c, const at::Tensor& in, const Tuning& tuning) {
  const int n = c.size();
  at::Tensor counts = at::empty({n * kMetaFields}, at::kLong);
  int64_t* f = counts.data_ptr<int64_t>();
  f[c.rank() * kMetaFields + 0] = in.sparse_dim();
  f[c.rank() * kMetaFields + 1] = in.dense_dim();
  f[c.rank() * kMetaFields + 2] = in._nnz();
  smdccl::allgather(c, bytesOf(counts), Blocks::equal(n, kMetaFields * sizeof(int64_t)), tuning);

  std::vector<SparseMeta> meta(static_cast<size_t>(n));
  std::vector<size_t> lengths;
  for (int r = 0; r < n; ++r) {
    SparseMeta& m = meta[static_cast<size_t>(r)];
    m.sparseDim = f[r * kMetaFields + 0];
    m.denseDim = f[r * kMetaFields + 1];
    m.nnz = f[r * kMetaFields + 2];
    SMDCCL_CHECK_ARG(
        m.sparseDim >= 0 && m.denseDim >= 0 && m.nnz >= 0 && m.sparseDim + m.denseDim <= kMaxDims,
        "smdccl: ", c.ctx.describe(), ": rank ", r, " sent invalid sparse metadata (sparse_dim ",
        m.sparseDim, ", dense_dim ", m.denseDim, ", nnz ", m.nnz, ")");
    lengths.push_back(static_cast<size_t>(m.sparseDim + m.denseDim) * sizeof(int64_t));
  }
  // The shapes, so that a disagreement names every rank's.
  at::Tensor mySizes = at::tensor(in.sizes().vec(), at::kLong);
  Blocks b;
  at::Tensor all = allgatherBlocks(c, {&mySizes}, lengths, tuning, b);
  for (int r = 0; r < n; ++r) {
    const auto* s =
        reinterpret_cast<const int64_t*>(bytesOf(all) + b.offset[static_cast<size_t>(r)]);
    meta[static_cast<size_t>(r)].sizes.assign(
        s, s + b.length[static_cast<size_t>(r)] / sizeof(int64_t));
  }
  return meta;
}

std::string describeShape(const SparseMeta& m) {
  std::string s = "[";
  for (size_t i = 0; i < m.sizes.size(); ++i) s += strCat(i ? ", " : "", m.sizes[i]);
  return strCat(s, "] (sparse_dim ", m.sparseDim, ", dense_dim ", m.denseDim, ")");
}

// Every rank holds the same `meta`, so every rank raises the same error.
void checkSameShape(const OpContext& ctx, const std::vector<SparseMeta>& meta) {
  const SparseMeta& first = meta[0];
  for (size_t r = 1; r < meta.size(); ++r) {
    const SparseMeta& m = meta[r];
    if (m.sparseDim == first.sparseDim && m.denseDim == first.denseDim && m.sizes == first.sizes)
      continue;
    std::string all;
    for (size_t q = 0; q < meta.size(); ++q)
      all += strCat(q ? "; " : "", "rank ", q, ": ", describeShape(meta[q]));
    throw InvalidArgument(strCat("smdccl: ", ctx.describe(),
                                 ": every rank must pass a sparse tensor of the same shape and "
                                 "sparse/dense split, got ",
                                 all));
  }
}

}  // namespace

void sparseAllreduce(Comm& c, at::Tensor& t, bool average, const Tuning& tuning) {
  at::Tensor in = t.coalesce();
  std::vector<SparseMeta> meta = allgatherMeta(c, in, tuning);
  checkSameShape(c.ctx, meta);

  const size_t sparseDim = static_cast<size_t>(in.sparse_dim());
  at::Tensor indices = in._indices().contiguous();  // [sparse_dim, nnz]
  at::Tensor values = in._values().contiguous();    // [nnz, dense sizes...]
  size_t valueBytesPerEntry = static_cast<size_t>(values.element_size());
  for (int64_t d = in.sparse_dim(); d < in.dim(); ++d)
    valueBytesPerEntry = checkedMul(valueBytesPerEntry, static_cast<size_t>(in.size(d)), c.ctx);
  std::vector<size_t> lengths;
  for (const SparseMeta& m : meta) {
    size_t nnz = static_cast<size_t>(m.nnz);
    lengths.push_back(checkedMul(nnz, sparseDim * sizeof(int64_t), c.ctx) +
                      roundUp8(checkedMul(nnz, valueBytesPerEntry, c.ctx)));
  }
  Blocks b;
  at::Tensor all = allgatherBlocks(c, {&indices, &values}, lengths, tuning, b);

  // The concatenation of every rank's entries, in rank order; coalescing it
  // sums the entries that share an index.
  std::vector<at::Tensor> allIndices, allValues;
  std::vector<int64_t> valueShape = values.sizes().vec();
  for (int r = 0; r < c.size(); ++r) {
    int64_t nnz = meta[static_cast<size_t>(r)].nnz;
    char* block = bytesOf(all) + b.offset[static_cast<size_t>(r)];
    allIndices.push_back(at::from_blob(block, {in.sparse_dim(), nnz}, at::kLong));
    valueShape[0] = nnz;
    allValues.push_back(
        at::from_blob(block + static_cast<size_t>(nnz) * sparseDim * sizeof(int64_t), valueShape,
                      values.options()));
  }
  at::Tensor summands = at::cat(allValues, 0);
  // AVG: 16-bit values are scaled before the sum (as the dense path does:
  // by the power of two at or above the world size, exact in 16 bits), so
  // the sum cannot overflow where the average would not.
  bool narrow = summands.scalar_type() == at::kHalf || summands.scalar_type() == at::kBFloat16;
  double preDivide = average && narrow ? powerOfTwoAtLeast(c.size()) : 1.0;
  if (preDivide != 1.0) summands.div_(preDivide);
  at::Tensor sum =
      at::sparse_coo_tensor(at::cat(allIndices, 1), summands, in.sizes(), in.options()).coalesce();
  if (average && c.size() / preDivide != 1.0) sum._values().div_(c.size() / preDivide);
  // The result replaces the tensor's contents, as gloo does (below autograd:
  // runChecksAndBody).
  t.copy_(sum);
}

}  // namespace smdccl
