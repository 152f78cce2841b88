"""Deterministic per-rank inputs and locally computed reference results.

Why: a collective can only be checked if every rank knows what every other
rank contributed.  ``rank_input(rank, n, dtype, seed, kind)`` is a pure
function of its arguments, so each rank recomputes all peers' inputs and the
exact (integer) or float64 reference of any reduction, with no communication.

Input kinds
-----------
``"int"``   integer-valued data.  Floats hold small integers in [-4, 4], so
            SUM / MIN / MAX / PRODUCT over <= 4 ranks (|result| <= 256) and
            PREMUL_SUM with factor 2 are exact in every float format, bfloat16
            included: those results must match the reference *exactly*.
            Integer dtypes use their full range, so SUM and PRODUCT wrap around
            (two's complement, like torch); bool is True with p = 0.8 so that
            both OR and AND give mixed results.
``"rand"``  standard-normal floats (rounded to the dtype), checked against the
            float64 reference with the error bound of a reduction that rounds
            to the dtype once per hop (see :func:`tolerance_bound`).

Reference semantics (what smdccl implements): integer SUM / PRODUCT wrap like
torch; float MIN / MAX propagate NaN; bool SUM / MAX are OR and PRODUCT / MIN
are AND; AVG and PREMUL_SUM exist only for floating dtypes, BAND / BOR / BXOR
only for integer and bool dtypes (on bool: logical AND / OR / XOR).
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np
import torch
import torch.distributed as dist

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
FLOAT_DTYPES = {torch.float32, torch.float64, torch.float16, torch.bfloat16}
INT_DTYPES = {torch.int8, torch.int32, torch.int64, torch.uint8}

#: unit roundoff (half an ulp of 1.0) per floating dtype
UNIT_ROUNDOFF = {
    torch.float64: 2.0 ** -53,
    torch.float32: 2.0 ** -24,
    torch.float16: 2.0 ** -11,
    torch.bfloat16: 2.0 ** -8,
}

OP_NAMES = ("SUM", "AVG", "MIN", "MAX", "PRODUCT", "PREMUL_SUM", "BAND", "BOR", "BXOR")
BITWISE_OPS = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def is_float(dtype: torch.dtype) -> bool:
    return dtype in FLOAT_DTYPES


def make_op(name: str, factor: float = 2.0):
    """The torch ReduceOp for ``name``; PREMUL_SUM gets ``factor``."""
    if name == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(factor)
    return getattr(dist.ReduceOp, name)


def op_valid(op: str, dtype: torch.dtype) -> bool:
    """Whether the smdccl contract defines ``op`` on ``dtype`` (else: ValueError)."""
    if op in ("AVG", "PREMUL_SUM"):
        return is_float(dtype)
    if op in BITWISE_OPS:
        return not is_float(dtype)
    return True


def _seed(*parts) -> int:
    h = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


#: from this many elements numpy draws the inputs: its generator draws 2-4x
#: faster than torch's but costs ~20 us more to create, which the thousands of
#: small inputs of a soak run would feel.
NUMPY_FROM = 4096


@lru_cache(maxsize=4096)
def _rank_input_cached(rank: int, n: int, dtype: torch.dtype, seed: int, kind: str) -> torch.Tensor:
    if kind not in ("int", "rand"):
        raise ValueError(f"unknown input kind {kind!r}")
    draw = _draw_numpy if n >= NUMPY_FROM else _draw_torch
    return draw(n, dtype, _seed(rank, n, dtype, seed, kind), kind)


def _draw_torch(n: int, dtype: torch.dtype, seed: int, kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(n, generator=g) < 0.8
    if dtype in INT_DTYPES:
        info = torch.iinfo(dtype)
        if dtype == torch.int64:
            return torch.randint(info.min, info.max, (n,), generator=g, dtype=torch.int64)
        return torch.randint(info.min, info.max + 1, (n,), generator=g, dtype=torch.int64).to(dtype)
    if kind == "int":
        return torch.randint(-4, 5, (n,), generator=g, dtype=torch.int64).to(dtype)
    return torch.randn(n, generator=g, dtype=torch.float64).to(dtype)


def _draw_numpy(n: int, dtype: torch.dtype, seed: int, kind: str) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    if dtype == torch.bool:
        return torch.from_numpy(rng.random(n) < 0.8)
    if dtype in INT_DTYPES:
        info = torch.iinfo(dtype)
        return torch.from_numpy(rng.integers(info.min, info.max, n, dtype=dtype_numpy(dtype), endpoint=True))
    if kind == "int":
        return torch.from_numpy(rng.integers(-4, 5, n)).to(dtype)
    return torch.from_numpy(rng.standard_normal(n)).to(dtype)


def rank_input(rank: int, n: int, dtype: torch.dtype, seed: int = 0, kind: str = "int") -> torch.Tensor:
    """Rank ``rank``'s input (read-only cached tensor: ``.clone()`` before use in place)."""
    return _rank_input_cached(rank, n, dtype, seed, kind)


def clear_input_cache() -> None:
    """Drop cached inputs (the medium sizes add up over a whole matrix run)."""
    _rank_input_cached.cache_clear()


def with_nans(t: torch.Tensor, rank: int, nranks: int) -> torch.Tensor:
    """A copy of float tensor ``t`` with NaN at positions i where i % (nranks + 1) == rank.

    Positions with i % (nranks + 1) == nranks stay NaN-free on every rank."""
    out = t.clone()
    out[rank :: nranks + 1] = float("nan")
    return out


# ---------------------------------------------------------------------------
# Reductions
# ---------------------------------------------------------------------------


def _wrap_int(inputs: list[torch.Tensor], op: str, dtype: torch.dtype) -> torch.Tensor:
    """SUM / PRODUCT modulo 2**bits: computed on uint64 (well-defined wrap), then
    truncated to the dtype; equal to torch's wrapping arithmetic in any order."""
    acc = inputs[0].numpy().astype(np.int64).view(np.uint64).copy()
    for t in inputs[1:]:
        x = t.numpy().astype(np.int64).view(np.uint64)
        if op == "SUM":
            acc += x
        else:
            acc *= x
    return torch.from_numpy(acc.view(np.int64).astype(dtype_numpy(dtype)))


def dtype_numpy(dtype: torch.dtype):
    return {torch.int8: np.int8, torch.int32: np.int32, torch.int64: np.int64, torch.uint8: np.uint8}[dtype]


class Reference:
    """Expected result of reducing ``inputs`` with ``op``.

    ``value``: exact expected tensor (int / bool dtypes) or float64 tensor.
    ``mag``:   float64 per-element magnitude of the computation (sum of |terms|
               for sums, product of |x| for PRODUCT) that scales the rounding
               error bound; None when the result must match exactly.
    """

    def __init__(self, value: torch.Tensor, mag: torch.Tensor | None, nranks: int, dtype: torch.dtype):
        self.value = value
        self.mag = mag
        self.nranks = nranks
        self.dtype = dtype

    def slice(self, start: int, stop: int) -> "Reference":
        mag = None if self.mag is None else self.mag[start:stop]
        return Reference(self.value[start:stop], mag, self.nranks, self.dtype)


def reduce_reference(inputs: list[torch.Tensor], op: str, dtype: torch.dtype,
                     factor: float = 2.0, exact: bool | None = None) -> Reference:
    """Reference for reducing ``inputs`` (one tensor per rank) with ``op``.

    ``exact``: force exact comparison (True) / tolerance (False) for floats;
    by default floats are compared with the rounding bound (MIN / MAX always
    exactly: they select, they never round)."""
    n = len(inputs)
    if op in BITWISE_OPS:  # integers and bool (bool: logical AND / OR / XOR)
        if is_float(dtype):
            raise ValueError(f"{op} is undefined on {dtype}")
        value = inputs[0].clone()
        for t in inputs[1:]:
            value = BITWISE_OPS[op](value, t)
        return Reference(value, None, n, dtype)
    if dtype == torch.bool:
        stack = torch.stack(list(inputs))
        if op in ("SUM", "MAX"):
            return Reference(stack.any(0), None, n, dtype)
        if op in ("PRODUCT", "MIN"):
            return Reference(stack.all(0), None, n, dtype)
        raise ValueError(f"{op} is undefined on bool")
    if dtype in INT_DTYPES:
        if op in ("SUM", "PRODUCT"):
            return Reference(_wrap_int(inputs, op, dtype), None, n, dtype)
        stack = torch.stack(list(inputs))
        if op == "MIN":
            return Reference(stack.amin(0), None, n, dtype)
        if op == "MAX":
            return Reference(stack.amax(0), None, n, dtype)
        raise ValueError(f"{op} is undefined on {dtype}")
    # Folded one rank at a time, in place: several times faster than
    # reducing a stacked tensor along dim 0, and these run thousands of times.
    xs = [t.to(torch.float64) for t in inputs]
    if op in ("MIN", "MAX"):  # torch.minimum / maximum propagate NaN
        pick = torch.minimum if op == "MIN" else torch.maximum
        value = xs[0].clone()  # to(float64) of a float64 input is the (cached) input itself
        for x in xs[1:]:
            value = pick(value, x)
        return Reference(value, None, n, dtype)
    if op not in ("SUM", "AVG", "PREMUL_SUM", "PRODUCT"):
        raise ValueError(op)
    if op == "PREMUL_SUM":
        xs = [x * factor for x in xs]
    value = _fold(xs, op == "PRODUCT", abs_=False)
    if op == "AVG":
        value /= n
    if exact:
        return Reference(value, None, n, dtype)
    mag = _fold(xs, op == "PRODUCT", abs_=True)
    if op == "AVG":
        mag /= n
    return Reference(value, mag, n, dtype)


def _fold(xs: list[torch.Tensor], product: bool, abs_: bool) -> torch.Tensor:
    """sum (or product) of xs (of their absolute values with ``abs_``), in a new tensor."""
    acc = xs[0].abs() if abs_ else xs[0].clone()
    for x in xs[1:]:
        term = x.abs() if abs_ else x
        if product:
            acc *= term
        else:
            acc += term
    return acc


def tolerance_bound(ref: Reference) -> torch.Tensor:
    """Per-element absolute error bound for a float reduction over ``nranks``.

    A reduction of n terms that rounds to the dtype after every hop (smdccl
    accumulates fp16/bf16 in float32 *per step* and stores the 16-bit partial
    result) makes at most ~n roundings, plus one for the premultiply / the AVG
    division and one for the final store: |err| <= (n + 2) * u * mag, with u the
    unit roundoff and mag the sum of |terms| (product of |x| for PRODUCT).
    A factor 2 of slack covers double rounding; a tiny absolute floor covers
    subnormal flushing.
    """
    u = UNIT_ROUNDOFF[ref.dtype]
    floor = torch.finfo(ref.dtype).tiny * 4
    return 2.0 * (ref.nranks + 2) * u * ref.mag + floor


def mismatch(out: torch.Tensor, ref: Reference, max_show: int = 5) -> str | None:
    """None if ``out`` matches ``ref`` (exactly or within the bound), else a description."""
    if out.dtype != ref.dtype:
        return f"output dtype {out.dtype}, expected {ref.dtype}"
    if out.numel() != ref.value.numel():
        return f"output has {out.numel()} elements, expected {ref.value.numel()}"
    if out.numel() == 0:
        return None
    out = out.reshape(-1)
    exp = ref.value.reshape(-1)
    if not is_float(ref.dtype):
        if torch.equal(out, exp):  # one pass for the common case; the report below finds what differs
            return None
        idx = (out != exp).nonzero().flatten()
        shown = ", ".join(f"[{i}] got {out[i].item()} expected {exp[i].item()}" for i in idx[:max_show].tolist())
        return f"{idx.numel()} of {out.numel()} elements differ: {shown}"
    got = out.to(torch.float64)
    # The common case in few passes (a NaN anywhere fails both tests: the report below says where).
    if ref.mag is None:
        if torch.equal(got, exp):
            return None
    elif bool(((got - exp).abs() <= tolerance_bound(ref)).all()):
        return None
    nan_got, nan_exp = torch.isnan(got), torch.isnan(exp)
    problems = []
    nan_bad = nan_got != nan_exp
    if bool(nan_bad.any()):
        idx = nan_bad.nonzero().flatten()
        shown = ", ".join(f"[{i}] got {got[i].item()} expected {exp[i].item()}" for i in idx[:max_show].tolist())
        problems.append(f"NaN pattern differs at {idx.numel()} positions: {shown}")
    ok = ~(nan_got | nan_exp)
    if ref.mag is None:
        bad = ok & (got != exp)
        bound = None
    else:
        bound = tolerance_bound(ref)
        bad = ok & ((got - exp).abs() > bound)
    if bool(bad.any()):
        idx = bad.nonzero().flatten()
        if bound is None:
            shown = ", ".join(f"[{i}] got {got[i].item()!r} expected {exp[i].item()!r}"
                              for i in idx[:max_show].tolist())
            problems.append(f"{idx.numel()} of {out.numel()} elements differ (exact check): {shown}")
        else:
            shown = ", ".join(
                f"[{i}] got {got[i].item():.9g} expected {exp[i].item():.9g} "
                f"(|err| {abs(got[i].item() - exp[i].item()):.3g} > bound {bound[i].item():.3g})"
                for i in idx[:max_show].tolist())
            problems.append(f"{idx.numel()} of {out.numel()} elements outside the rounding bound: {shown}")
    return "; ".join(problems) or None


def assert_matches(out: torch.Tensor, ref: Reference | torch.Tensor, what: str = "") -> None:
    """AssertionError unless ``out`` matches ``ref`` (a Reference, or a tensor to match exactly)."""
    if isinstance(ref, torch.Tensor):
        ref = Reference(ref, None, 1, ref.dtype)
    msg = mismatch(out, ref)
    if msg:
        raise AssertionError(f"{what}{': ' if what else ''}{msg}")


def assert_equal_bits(out: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
    """Data movement must be bit-exact (NaN payloads included)."""
    if out.dtype != expected.dtype or out.shape != expected.shape:
        raise AssertionError(f"{what}: got {out.dtype}{tuple(out.shape)}, expected {expected.dtype}{tuple(expected.shape)}")
    if out.numel() == 0:
        return
    a = out.contiguous().view(-1).view(torch.uint8)
    b = expected.contiguous().view(-1).view(torch.uint8)
    if not torch.equal(a, b):
        assert_matches(out, expected, what)  # detailed element report
        raise AssertionError(f"{what}: bytes differ")
