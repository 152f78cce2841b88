"""``python -m smdccl.tune`` and the cost model it feeds.

Three layers:

* pure (no processes): the alpha-beta fit, the profile writer round-tripping
  through the C++ parser (``CostModel::fromFile`` via ``smdccl._C.plan``),
  bad profiles, the CLI's usage errors, the choice of pairs;
* the cost model's algorithm choice for known group shapes, through
  ``smdccl._C.plan`` (pure unit tests of the model and of the selection,
  including ``SMDCCL_ALGO`` forcing);
* real processes: the tool under ``torch.distributed.run`` on 4 ranks split
  into 2 virtual nodes (``SMDCCL_TOPOLOGY=2x2``), then a 4-rank allreduce run
  with ``SMDCCL_TUNE_FILE`` pointing at the profile it wrote, checked against
  a reference, with the backend's log showing it loaded the file.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness import REPO_ROOT, run_ranks

from smdccl import _C
from smdccl.tune import cli
from smdccl.tune.fit import MIN_ALPHA_US, FitError, fit_alpha_beta
from smdccl.tune.layout import Layout
from smdccl.tune.measure import MIN_ITERS, Point, iters_for, quantile
from smdccl.tune.profile import KEYS, Level, Reduce, builtin_defaults, parse_description, render

SIZES = [8 << (2 * i) for i in range(12)]  # 8 B .. 32 MB, x4


@pytest.fixture(autouse=True)
def _plain_env(monkeypatch):
    """No test here may see a tune file or a forced algorithm it did not set."""
    monkeypatch.delenv("SMDCCL_TUNE_FILE", raising=False)
    monkeypatch.delenv("SMDCCL_ALGO", raising=False)
    monkeypatch.delenv("SMDCCL_PIPELINE_CHUNK_KB", raising=False)


# ---------------------------------------------------------------------------
# fit
# ---------------------------------------------------------------------------


def _times(alpha_us: float, gbps: float, noise: float = 0.0, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [(alpha_us * 1e-6 + m / (gbps * 1e9)) * (1 + rng.uniform(-noise, noise)) for m in SIZES]


@pytest.mark.parametrize("alpha_us,gbps", [(2.0, 8.0), (40.0, 1.25), (0.5, 30.0), (150.0, 0.1)])
def test_fit_recovers_exact_parameters(alpha_us, gbps):
    fit = fit_alpha_beta(SIZES, _times(alpha_us, gbps))
    assert fit.alpha_us == pytest.approx(alpha_us, rel=1e-9)
    assert fit.gbps == pytest.approx(gbps, rel=1e-9)
    assert fit.max_rel_err < 1e-9
    assert fit.note == ""


@pytest.mark.parametrize("seed", range(5))
def test_fit_tolerates_noise(seed):
    # +-10 % multiplicative noise on every point: both parameters within 10 %.
    fit = fit_alpha_beta(SIZES, _times(25.0, 2.5, noise=0.10, seed=seed))
    assert fit.alpha_us == pytest.approx(25.0, rel=0.10)
    assert fit.gbps == pytest.approx(2.5, rel=0.10)
    assert 0 < fit.max_rel_err < 0.25


def test_fit_weights_small_and_large_sizes_alike():
    # alpha 10 us, bw 1 GB/s: a 32 MB message takes ~33.5 ms. Absolute least
    # squares would let that point decide alpha; the relative fit must still
    # get alpha from the small sizes although the largest point is 20 % off.
    times = _times(10.0, 1.0)
    times[-1] *= 1.2
    fit = fit_alpha_beta(SIZES, times)
    assert fit.alpha_us == pytest.approx(10.0, rel=0.05)


def test_fit_clamps_a_non_positive_alpha():
    # Pure bandwidth with a few small points measured slightly low: the
    # unconstrained optimum has alpha < 0; the profile needs alpha > 0.
    times = [m / 2e9 for m in SIZES[4:]]
    times[0] *= 0.8
    times[1] *= 0.9
    fit = fit_alpha_beta(SIZES[4:], times)
    assert fit.alpha_us == pytest.approx(MIN_ALPHA_US)
    assert "alpha" in fit.note
    assert fit.gbps == pytest.approx(2.0, rel=0.1)


@pytest.mark.parametrize("sizes,times,msg", [
    ([8, 8, 8], [1e-6, 2e-6, 3e-6], "two different sizes"),
    ([8, 1 << 20], [1e-3, 1e-6], "does not grow"),
    ([8, 64], [1e-6], "sizes but"),
    ([8, 64], [1e-6, 0.0], "times > 0"),
])
def test_fit_rejects_unusable_points(sizes, times, msg):
    with pytest.raises(FitError, match=msg):
        fit_alpha_beta(sizes, times)


def test_round_trips_per_size():
    assert iters_for(8, 50, 32 << 20) == 50
    assert iters_for(2 << 20, 50, 32 << 20) == 16
    assert iters_for(16 << 20, 50, 32 << 20) == MIN_ITERS
    assert iters_for(8, 3, 32 << 20) == 3  # --iters below the floor wins


def test_quantile_matches_the_median_and_interpolates():
    import statistics

    for xs in ([3.0], [5.0, 1.0], [4.0, 1.0, 9.0, 2.0], [float(i * i) for i in range(11)]):
        assert quantile(xs, 0.5) == pytest.approx(statistics.median(xs))
    assert quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.0) == 1.0
    assert quantile([1.0, 2.0, 3.0, 4.0, 5.0], 1.0) == 5.0
    assert quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.2) == pytest.approx(1.8)


# ---------------------------------------------------------------------------
# node map -> pairs
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("nodes,intra,inter", [
    ([[0, 1], [2, 3]], (0, 1), (0, 2)),
    ([[0], [1, 2, 3]], (1, 2), (0, 1)),
    ([[0, 1, 2, 3]], (0, 1), None),
    ([[0], [1]], None, (0, 1)),
    ([[0]], None, None),
])
def test_pairs_from_node_map(nodes, intra, inter):
    lay = Layout(rank=0, world=sum(map(len, nodes)), nodes=nodes, topology="")
    assert lay.intra_pair() == intra
    assert lay.inter_pair() == inter
    assert lay.max_local == max(map(len, nodes))


# ---------------------------------------------------------------------------
# the profile file <-> the C++ parser
# ---------------------------------------------------------------------------


def _info(path) -> dict:
    return {"date": "2000-01-01T00:00:00+00:00", "host": "testhost", "torch": "x", "smdccl": "y",
            "command": "pytest", "world": 4, "topology": "2 nodes: [0,1] [2,3]",
            "method": cli.METHOD, "path": str(path), "defaults": builtin_defaults()}


def _level(name, alpha_us, gbps, pair=(0, 1)) -> Level:
    pts = [Point(m, alpha_us * 1e-6 + m / (gbps * 1e9), 5) for m in SIZES[:6]]
    return Level(name, pair, pts, fit_alpha_beta([p.nbytes for p in pts], [p.seconds for p in pts]))


def _model(path) -> dict[str, float]:
    """What the C++ parser made of ``path``, by profile key."""
    _, _, desc = _C.plan("allreduce", 4096, (4, 2, 2), str(path))
    assert desc.endswith(f"({path})"), desc
    return parse_description(desc)


def test_builtin_defaults_are_the_engines():
    assert builtin_defaults() == {"intra_alpha_us": 2.0, "intra_gbps": 8.0, "inter_alpha_us": 40.0,
                                  "inter_gbps": 1.25, "reduce_gbps": 16.0}


def test_profile_round_trips_through_the_cpp_parser(tmp_path):
    path = tmp_path / "p.txt"
    levels = [_level("intra", 3.5, 6.25), _level("inter", 55.0, 2.5, (0, 2))]
    text = render(levels, Reduce(4 << 20, 1e-3, 12.0), _info(path))
    path.write_text(text)
    assert _model(path) == pytest.approx({"intra_alpha_us": 3.5, "intra_gbps": 6.25,
                                          "inter_alpha_us": 55.0, "inter_gbps": 2.5,
                                          "reduce_gbps": 12.0}, rel=1e-5)
    assert "not measured" not in text
    keys = [line.split()[0] for line in text.splitlines() if line and not line.startswith("#")]
    assert keys == list(KEYS)
    assert "ranks 0 <-> 2 (TCP)" in text and "host testhost" in text
    assert f"export SMDCCL_TUNE_FILE={path}" in text


def test_unmeasured_level_keeps_the_builtin_defaults(tmp_path):
    path = tmp_path / "p.txt"
    levels = [_level("intra", 3.5, 6.25), Level("inter", None, skipped="one node")]
    text = render(levels, Reduce(4 << 20, 1e-3, 12.0), _info(path))
    path.write_text(text)
    assert "# inter: not measured (one node); keys left out, so the built-in defaults apply " \
           "(40 us, 1.25 GB/s)" in text
    assert not re.search(r"^inter_", text, re.M)
    model = _model(path)
    assert model["intra_alpha_us"] == pytest.approx(3.5, rel=1e-5)
    assert model["inter_alpha_us"] == 40.0 and model["inter_gbps"] == 1.25


@pytest.mark.parametrize("body,needle", [
    ("intra_alpha_us 2\nbogus_key 3\n", "unknown key 'bogus_key'"),
    ("intra_gbps -4\n", "'intra_gbps' needs a positive number"),
    ("inter_alpha_us 0\n", "'inter_alpha_us' needs a positive number"),
    ("reduce_gbps fast\n", "'reduce_gbps' needs a positive number"),
    ("inter_gbps nan\n", "'inter_gbps' needs a positive number"),
])
def test_bad_profile_raises_value_error_naming_file_and_key(tmp_path, body, needle):
    path = tmp_path / "bad.txt"
    path.write_text("# a comment\n" + body)
    with pytest.raises(ValueError) as err:
        _C.plan("allreduce", 4096, (4, 2, 2), str(path))
    assert str(path) in str(err.value) and needle in str(err.value), str(err.value)


def test_missing_profile_raises_value_error_naming_the_file(tmp_path, monkeypatch):
    path = tmp_path / "nope.txt"
    with pytest.raises(ValueError, match=re.escape(str(path))):
        _C.plan("allreduce", 4096, (4, 2, 2), str(path))
    monkeypatch.setenv("SMDCCL_TUNE_FILE", str(path))  # the same through the variable
    with pytest.raises(ValueError, match="SMDCCL_TUNE_FILE"):
        _C.plan("allreduce", 4096, (4, 2, 2))


# ---------------------------------------------------------------------------
# the cost model's choices (smdccl._C.plan)
# ---------------------------------------------------------------------------

KB, MB = 1 << 10, 1 << 20


def _plan(collective, nbytes, ranks, nodes, max_local, uniform=True, tune_file=""):
    return _C.plan(collective, nbytes, (ranks, nodes, max_local, uniform), str(tune_file))


def _write(tmp_path, **keys) -> Path:
    path = tmp_path / "profile.txt"
    path.write_text("".join(f"{k} {v}\n" for k, v in keys.items()))
    return path


def test_two_nodes_small_allreduce_picks_a_latency_algorithm():
    algo, est, _ = _plan("allreduce", 4 * KB, 4, 2, 2)
    assert algo in ("rd", "two_level_rd")
    assert set(est) == {"rd", "ring", "halving", "tree", "two_level", "two_level_rd", "two_level_tree"}
    assert est[algo] == min(est.values())
    assert est["ring"] > 2 * est[algo]  # 6 inter-node latencies vs 1


def test_two_nodes_large_allreduce_picks_two_level():
    algo, est, _ = _plan("allreduce", 64 * MB, 4, 2, 2)
    assert algo == "two_level"
    assert est["two_level"] < est["ring"] < est["rd"]


def test_one_node_picks_rd_then_ring():
    small, est, _ = _plan("allreduce", 4 * KB, 4, 1, 4)
    assert small == "rd" and set(est) == {"rd", "ring", "halving", "tree"}
    large, est, _ = _plan("allreduce", 64 * MB, 4, 1, 4)
    assert large == "ring" and est["ring"] < est["rd"]


def test_inter_as_fast_as_intra_never_worse_than_the_flat_ring(tmp_path):
    flat = _write(tmp_path, intra_alpha_us=2, intra_gbps=8, inter_alpha_us=2, inter_gbps=8)
    algo, est, desc = _plan("allreduce", 64 * MB, 4, 2, 2, tune_file=flat)
    assert "inter 2 us + 8 GB/s" in desc
    assert est[algo] <= est["ring"]
    assert est[algo] == min(est.values())
    # the fast uplink makes the flat ring itself cheaper than with the defaults
    _, default_est, _ = _plan("allreduce", 64 * MB, 4, 2, 2)
    assert est["ring"] < default_est["ring"] / 2


SHAPES = [(4, 2, 2, True), (4, 1, 4, True), (4, 2, 3, False), (8, 2, 4, True), (6, 3, 2, True),
          (3, 1, 3, True), (2, 2, 1, True)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "p%d-n%d-L%d%s" % (*s[:3], "" if s[3] else "-uneven"))
@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather", "broadcast"])
def test_estimates_grow_with_size(collective, shape):
    sizes = [1 << k for k in range(3, 31, 2)]  # 8 B .. 512 MB
    series = [_plan(collective, n, *shape)[1] for n in sizes]
    for algo in series[0]:
        values = [est[algo] for est in series]
        assert all(v > 0 for v in values), (algo, values)
        bad = [(sizes[i], values[i], values[i + 1]) for i in range(len(values) - 1)
               if not values[i + 1] > values[i]]
        assert not bad, f"{collective} {algo} on {shape}: estimate does not grow: {bad}"


@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather"])
def test_uneven_nodes_never_offer_two_level_for_rs_ag(collective, monkeypatch):
    for nbytes in (4 * KB, 1 * MB, 64 * MB):
        algo, est, _ = _plan(collective, nbytes, 4, 2, 3, uniform=False)
        assert "two_level" not in est and algo != "two_level", (nbytes, algo, est)
    # the same shape with even nodes does offer it
    assert "two_level" in _plan(collective, 64 * MB, 4, 2, 2)[1]
    # forcing a two-level algorithm on uneven nodes falls back to the flat ring
    monkeypatch.setenv("SMDCCL_ALGO", "two_level")
    assert _plan(collective, 64 * MB, 4, 2, 3, uniform=False)[0] == "ring"
    assert _plan(collective, 64 * MB, 4, 2, 2)[0] == "two_level"


def test_one_node_reduce_scatter_of_3_or_4_ranks_goes_direct():
    # Measured faster than the ring there (bench/results/cpu2-rs-direct-2026-11-29.txt);
    # at 2 ranks both are one send and one reduce (the ring, registered first,
    # keeps it); at 8 about even, and across nodes its uplinks carry more.
    for ranks in (3, 4):
        for nbytes in (4 * KB, 1 * MB, 64 * MB):
            algo, est, _ = _plan("reduce_scatter", nbytes, ranks, 1, ranks)
            assert algo == "direct" and est["direct"] < est["ring"], (ranks, nbytes, est)
    assert _plan("reduce_scatter", 64 * MB, 2, 1, 2)[0] == "ring"
    assert _plan("reduce_scatter", 64 * MB, 4, 2, 2)[0] == "two_level"
    # offered only where it was measured: not on 8 ranks, nor across nodes, at any size
    for shape in [(8, 1, 8), (4, 2, 2), (8, 8, 1), (16, 4, 4), (3, 3, 1)]:
        for nbytes in (64, 4 * KB, 1 * MB, 64 * MB):
            algo, est, _ = _plan("reduce_scatter", nbytes, *shape)
            assert algo != "direct", (shape, nbytes, est)
    assert _plan("allgather", 64 * MB, 4, 1, 4)[0] != "direct"  # its contention stays


def test_smdccl_algo_ring_forces_ring(monkeypatch):
    assert _plan("allreduce", 4 * KB, 4, 2, 2)[0] != "ring"
    assert _plan("allreduce", 64 * MB, 4, 2, 2)[0] != "ring"
    monkeypatch.setenv("SMDCCL_ALGO", "ring")
    for shape in [(4, 2, 2), (4, 1, 4)]:
        for nbytes in (8, 4 * KB, 64 * MB):
            assert _plan("allreduce", nbytes, *shape)[0] == "ring", (shape, nbytes)
    assert _plan("broadcast", 4 * KB, 4, 2, 2)[0] == "chain"  # ring's broadcast form
    monkeypatch.setenv("SMDCCL_ALGO", "fastest")
    with pytest.raises(ValueError, match="SMDCCL_ALGO"):
        _plan("allreduce", 4 * KB, 4, 2, 2)


def test_registry_lists_every_algorithm_and_what_it_runs():
    algos = dict(_C.algorithms())
    assert list(algos)[:2] == ["ring", "rd"]
    assert set(algos) >= {"ring", "rd", "halving", "tree", "direct", "chain", "two_level",
                          "two_level_rd", "two_level_tree"}
    assert set(algos["tree"]) == {"allreduce", "broadcast", "reduce"}
    assert set(algos["halving"]) == {"allreduce", "reduce_scatter", "reduce"}
    assert set(algos["two_level_tree"]) == {"allreduce", "broadcast"}
    for name, colls in algos.items():  # every collective has somebody, every algorithm a job
        assert colls, name
    for coll in ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce"):
        assert any(coll in c for c in algos.values()), coll


def test_smdccl_algo_per_collective(monkeypatch):
    monkeypatch.setenv("SMDCCL_ALGO", "allreduce:tree,allgather:ring")
    assert _plan("allreduce", 4 * KB, 8, 8, 1)[0] == "tree"
    assert _plan("allgather", 4 * KB, 8, 8, 1)[0] == "ring"
    assert _plan("broadcast", 4 * KB, 8, 8, 1)[0] == _plan_auto("broadcast", 4 * KB, 8, 8, 1)
    # a name for all, then one collective differently
    monkeypatch.setenv("SMDCCL_ALGO", "ring,allreduce:halving")
    assert _plan("allreduce", 64 * MB, 4, 1, 4)[0] == "halving"
    assert _plan("reduce_scatter", 64 * MB, 4, 1, 4)[0] == "ring"
    assert _plan("broadcast", 64 * MB, 4, 1, 4)[0] == "chain"
    # two-level forms fall back to their flat form on one node
    monkeypatch.setenv("SMDCCL_ALGO", "allreduce:two_level_tree")
    assert _plan("allreduce", 4 * KB, 8, 1, 8)[0] == "tree"
    assert _plan("allreduce", 4 * KB, 8, 2, 4)[0] == "two_level_tree"


@pytest.mark.parametrize("spec,msg", [
    ("fastest", "'fastest' is not a registered algorithm"),
    ("allreduce:direct", "'direct' does not run allreduce"),
    ("gather:ring", "'gather' is not a collective"),
    ("allreduce:nope", "'nope' is not a registered algorithm"),
])
def test_smdccl_algo_errors_name_the_problem(spec, msg, monkeypatch):
    monkeypatch.setenv("SMDCCL_ALGO", spec)
    with pytest.raises(ValueError) as exc:
        _plan("allreduce", 4 * KB, 4, 2, 2)
    assert msg in str(exc.value) and "auto, ring, rd" in str(exc.value), str(exc.value)


def _plan_auto(collective, nbytes, ranks, nodes, max_local):
    saved = os.environ.pop("SMDCCL_ALGO", None)
    try:
        return _plan(collective, nbytes, ranks, nodes, max_local)[0]
    finally:
        if saved is not None:
            os.environ["SMDCCL_ALGO"] = saved


def test_many_single_rank_nodes_use_latency_friendly_schedules():
    # 8 hosts x 1 rank (the emulated cluster's shape): halving beats the
    # ring's 14 latencies at mid sizes; 96 hosts, not a power of two: the
    # double tree beats halving's fold and the ring's 190 steps at 4 MB;
    # 8 nodes of 8: the two-level tree at 64 KB.
    assert _plan("allreduce", 256 * KB, 8, 8, 1)[0] == "halving"
    assert _plan("allreduce", 4 * MB, 96, 96, 1)[0] == "tree"
    assert _plan("allreduce", 4 * KB, 8, 8, 1)[0] == "rd"
    assert _plan("allreduce", 64 * KB, 64, 8, 8)[0] == "two_level_tree"


def test_reduce_is_planned_on_its_own():
    algo, est, _ = _plan("reduce", 4 * KB, 8, 8, 1)
    assert algo == "tree" and set(est) == {"tree", "ring", "halving"}
    big, est, _ = _plan("reduce", 64 * MB, 8, 1, 8)
    assert big in ("ring", "halving") and est[big] < est["tree"]


def test_wire16_halves_the_inter_node_bytes_and_leaves_the_ring_out():
    _, plain, _ = _plan("allreduce", 64 * MB, 8, 8, 1)
    algo, wired, _ = _C.plan("allreduce", 64 * MB, (8, 8, 1), "", "fp16")
    assert wired["halving"] < 0.6 * plain["halving"]
    assert algo != "ring"  # chained 16-bit roundings: not the model's pick on every-hop wires


def test_profile_changes_the_choice(tmp_path):
    # A slow shared memory and a fast network make the flat ring beat the
    # two-level scheme at 64 MB on 2x2, where the defaults pick two_level.
    slow_shm = _write(tmp_path, intra_alpha_us=2, intra_gbps=0.5, inter_alpha_us=40, inter_gbps=20)
    algo, est, _ = _plan("allreduce", 64 * MB, 4, 2, 2, tune_file=slow_shm)
    assert algo == "ring" and est["ring"] < est["two_level"]


# ---------------------------------------------------------------------------
# the command line, in this process
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("argv,msg", [
    (["--min-bytes", "1M", "--max-bytes", "4K"], "larger than --max-bytes"),
    (["--max-bytes", "lots"], "not a size"),
    (["--iters", "0"], "--iters must be >= 1"),
    (["--step-factor", "1"], "--step-factor must be >= 2"),
    (["--min-bytes", "8", "--max-bytes", "8"], "at least two message sizes"),
    (["--out", "/nonexistent-dir/p.txt"], "does not exist"),
    (["--timeout", "0"], "--timeout must be > 0"),
    (["--quantile", "1.5"], "--quantile must be between 0 and 1"),
    (["--passes", "0"], "--passes must be >= 1"),
])
def test_bad_arguments_exit_2_with_a_message(argv, msg, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(argv)
    assert exc.value.code == 2
    assert msg in capsys.readouterr().err


def test_sizes_end_at_max_bytes():
    assert cli.parse_args([]).sizes == [8 << (2 * i) for i in range(11)] + [16 * MB]
    assert cli.parse_args(["--min-bytes", "1K", "--max-bytes", "4K"]).sizes == [1024, 4096]


def test_help_describes_the_run(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for word in ("SMDCCL_TUNE_FILE", "intra_alpha_us", "reduce_gbps", "ping-pong", "--out",
                 "relative error", "defaults"):
        assert word in out, word


# ---------------------------------------------------------------------------
# real processes
# ---------------------------------------------------------------------------


def _env(**extra) -> dict:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    for k in ("SMDCCL_TUNE_FILE", "SMDCCL_ALGO", "SMDCCL_TOPOLOGY"):
        env.pop(k, None)
    env.update(extra)
    return env


def _values(text: str) -> dict[str, float]:
    return {line.split()[0]: float(line.split()[1])
            for line in text.splitlines() if line.strip() and not line.startswith("#")}


def test_single_process_run_keeps_defaults_for_both_levels(tmp_path):
    out = tmp_path / "one.txt"
    proc = subprocess.run([sys.executable, "-m", "smdccl.tune", "--out", str(out)],
                          env=_env(), cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    text = out.read_text()
    assert "# intra: not measured (no node has two ranks)" in text
    assert "# inter: not measured (one node)" in text
    assert list(_values(text)) == ["reduce_gbps"]
    model = _model(out)
    assert model["intra_gbps"] == 8.0 and model["inter_alpha_us"] == 40.0
    assert model["reduce_gbps"] == pytest.approx(_values(text)["reduce_gbps"], rel=1e-5)


def tune_in_existing_world(out: str) -> dict:
    """Rank side: the tool as a library call inside a job whose default group
    already exists (gloo here): it must keep that group and clean up its own."""
    import torch.distributed as dist

    from smdccl.tune.cli import main

    # Three passes: each size's median spans the run, so one burst of load
    # on a 2-core CI machine cannot make 1 MB look no slower than 4 KB (a
    # single pass failed the fit once that way: "does not grow with size").
    code = main(["--out", out, "--max-bytes", "1M", "--iters", "10", "--passes", "3",
                 "--timeout", "60"])
    assert dist.is_initialized() and dist.get_backend() == "gloo"
    t = __import__("torch").ones(3)
    dist.all_reduce(t)  # the caller's group still works
    return {"code": code, "sum": t.tolist()}


@pytest.mark.smdccl_only
@pytest.mark.multiprocess
def test_tune_inside_an_existing_gloo_job(tmp_path):
    # One rank per virtual node: only the inter level can be measured.
    out = tmp_path / "p.txt"
    results = run_ranks(2, tune_in_existing_world, str(out), backend="gloo", timeout=120,
                        env={"SMDCCL_TOPOLOGY": "1,1"})
    assert results == [{"code": 0, "sum": [2.0, 2.0, 2.0]}] * 2
    text = out.read_text()
    assert "# world: 2 ranks, 2 nodes: [0] [1]" in text
    assert "# intra: not measured (no node has two ranks); keys left out, so the built-in " \
           "defaults apply (2 us, 8 GB/s)" in text
    assert "# inter: ranks 0 <-> 1 (TCP)" in text
    assert list(_values(text)) == ["inter_alpha_us", "inter_gbps", "reduce_gbps"]
    model = _model(out)
    assert model["intra_alpha_us"] == 2.0
    assert model["inter_alpha_us"] == pytest.approx(_values(text)["inter_alpha_us"], rel=1e-5)


def tuned_allreduce(tune_file: str) -> dict:
    """Rank side: the backend loads ``tune_file`` (its INFO log says so) and
    allreduce gives exact results at every size (int-valued float32 inputs)."""
    import tempfile

    import torch
    import torch.distributed as dist

    from reference import rank_input

    # smdccl logs its cost model at group creation (SMDCCL_DEBUG=INFO): catch it.
    log = tempfile.TemporaryFile(mode="w+")
    saved = os.dup(2)
    os.dup2(log.fileno(), 2)
    try:
        group = dist.new_group(backend="smdccl")
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    log.seek(0)
    lines = [line for line in log.read().splitlines() if "cost model:" in line]
    assert lines and all(line.endswith(f"({tune_file})") for line in lines), lines

    world, rank = dist.get_world_size(), dist.get_rank()
    checked = 0
    for g in (None, group):
        for n in (1, 7, 1000, 16 << 10, 300_000, 2 << 20):  # 4 B .. 8 MB
            t = rank_input(rank, n, torch.float32).clone()
            dist.all_reduce(t, group=g)
            ref = sum(rank_input(r, n, torch.float32).to(torch.float64) for r in range(world))
            assert torch.equal(t.to(torch.float64), ref), f"n={n}: wrong sum"
            checked += 1
    return {"checked": checked, "log": lines[0]}


def bad_tune_file_is_rejected(path: str):
    import torch.distributed as dist

    try:
        dist.new_group(backend="smdccl")
    except ValueError as exc:
        assert path in str(exc) and "unknown key 'turbo'" in str(exc), str(exc)
        return "raised"
    raise AssertionError("a bad SMDCCL_TUNE_FILE was accepted")


@pytest.mark.multiprocess
def test_group_creation_rejects_a_bad_tune_file(tmp_path):
    # The default group is gloo, so creating the smdccl group is the step that
    # reads SMDCCL_TUNE_FILE and fails.
    path = tmp_path / "bad.txt"
    path.write_text("intra_gbps 4\nturbo 1\n")
    assert run_ranks(1, bad_tune_file_is_rejected, str(path), backend="gloo",
                     env={"SMDCCL_TUNE_FILE": str(path)}) == ["raised"]


@pytest.mark.smdccl_only
@pytest.mark.multiprocess
def test_tune_on_two_virtual_nodes_then_use_the_profile(tmp_path):
    out = tmp_path / "tune.txt"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
           "-m", "smdccl.tune", "--out", str(out), "--iters", "30",
           "--timeout", "60"]
    proc = subprocess.run(cmd, env=_env(SMDCCL_TOPOLOGY="2x2"), cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-5000:]}"
    text = out.read_text()
    print("\n" + text)
    assert "not measured" not in text and "defaults apply" not in text, text
    assert "# world: 4 ranks, 2 nodes: [0,1] [2,3]" in text
    assert "# intra: ranks 0 <-> 1 (shared memory)" in text
    assert "# inter: ranks 0 <-> 2 (TCP)" in text
    values = _values(text)
    assert list(values) == list(KEYS)
    assert all(v > 0 for v in values.values())
    assert values["inter_alpha_us"] > 0 and values["intra_alpha_us"] > 0
    assert _model(out) == pytest.approx(values, rel=1e-5)  # the C++ parser reads the same
    assert f"export SMDCCL_TUNE_FILE={out}" in proc.stdout
    assert "tuned pick" in proc.stdout and "64MB" in proc.stdout

    results = run_ranks(4, tuned_allreduce, str(out), timeout=120,
                        env={"SMDCCL_TOPOLOGY": "2x2", "SMDCCL_TUNE_FILE": str(out),
                             "SMDCCL_DEBUG": "INFO"})
    assert all(r["checked"] == 12 for r in results)


def test_int8_plans_halving_for_small_tensors_over_many_nodes():
    # 256 nodes x 2: the direct exchange's 255 messages per phase cost more
    # than halving's 8 start-ups up to some size; above it the direct
    # pipeline wins. On 8 nodes the direct exchange always does.
    small, est, _ = _C.plan("allreduce", 64 * KB, (512, 256, 2), "", "int8")
    assert small == "two_level_int8_halving" and est[small] < est["two_level_int8"]
    big, est, _ = _C.plan("allreduce", 256 * MB, (512, 256, 2), "", "int8")
    assert big == "two_level_int8" and est[big] < est["two_level_int8_halving"]
    assert _C.plan("allreduce", 64 * KB, (16, 8, 2), "", "int8")[0] == "two_level_int8"
    assert _C.plan("allreduce", 64 * KB, (4, 2, 2), "", "int8")[0] == "two_level_int8"
    assert _C.plan("reduce_scatter", 64 * KB, (512, 256, 2), "", "int8")[0] == "two_level_int8"


def test_plan_names_the_compressions_it_takes():
    with pytest.raises(ValueError, match="none, fp16, bf16, int8"):
        _C.plan("allreduce", 1024, (4, 2, 2), "", "fp8")
