"""Fit ``T(m) = alpha + m / bw`` to measured (bytes, seconds) points.

Method: least squares on the *relative* error, i.e. minimise
``sum(((alpha + m * beta) - T) / T) ** 2`` with ``beta = 1 / bw``. Plain
least squares on absolute times would let the largest messages (tens of
milliseconds) decide everything and leave alpha (microseconds) to noise;
weighting each point by ``1 / T`` makes a 10 % miss at 8 bytes count as much
as a 10 % miss at 16 MB, so the small sizes pin alpha and the large ones pin
the bandwidth. It is a weighted linear least-squares problem with a closed
form (2 x 2 normal equations).

Both parameters must be positive for the profile: when the unconstrained
optimum has ``alpha <= 0`` (latency lost in the noise), alpha is set to
:data:`MIN_ALPHA_US` and beta refitted alone; when ``beta <= 0`` (times do
not grow with size: too small a size range) :class:`FitError` is raised.
Pure Python, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

#: the floor for alpha (microseconds) when the fit would make it <= 0
MIN_ALPHA_US = 0.01


class FitError(ValueError):
    """The points do not determine a positive alpha and bandwidth."""


@dataclass(frozen=True)
class Fit:
    alpha_us: float   # per-message latency, microseconds
    gbps: float       # bandwidth, GB/s (1e9 bytes per second)
    max_rel_err: float  # largest |fit - T| / T over the points
    note: str = ""    # how a constraint was applied, if one was

    def seconds(self, nbytes: float) -> float:
        return self.alpha_us * 1e-6 + nbytes / (self.gbps * 1e9)


def fit_alpha_beta(sizes: list[float], seconds: list[float]) -> Fit:
    """Relative-error least squares fit of ``T(m) = alpha + m / bw``."""
    if len(sizes) != len(seconds):
        raise FitError(f"{len(sizes)} sizes but {len(seconds)} times")
    points = [(float(m), float(t)) for m, t in zip(sizes, seconds)]
    bad = [(m, t) for m, t in points if not (m >= 0 and t > 0)]
    if bad:
        raise FitError(f"sizes must be >= 0 and times > 0, got {bad[:3]}")
    if len({m for m, _ in points}) < 2:
        raise FitError("need at least two different sizes")

    # Weighted normal equations, weight w = 1 / T^2.
    s0 = s1 = s2 = r0 = r1 = 0.0
    for m, t in points:
        w = 1.0 / (t * t)
        s0 += w
        s1 += w * m
        s2 += w * m * m
        r0 += w * t
        r1 += w * m * t
    det = s0 * s2 - s1 * s1
    if det <= 0:
        raise FitError("degenerate sizes")
    alpha = (r0 * s2 - r1 * s1) / det
    beta = (s0 * r1 - s1 * r0) / det
    note = ""
    if alpha <= 0:
        alpha = MIN_ALPHA_US * 1e-6
        beta = sum(m * (t - alpha) / (t * t) for m, t in points) / s2
        note = f"alpha fitted <= 0, set to {MIN_ALPHA_US} us"
    if beta <= 0:
        raise FitError("message time does not grow with size: measure larger messages "
                       "(--max-bytes)")
    err = max(abs(alpha + m * beta - t) / t for m, t in points)
    return Fit(alpha_us=alpha * 1e6, gbps=1.0 / beta / 1e9, max_rel_err=err, note=note)
