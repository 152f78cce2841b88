"""smdccl.bench's passes, in-process: the lines whose passes disagree are the
ones listed under the table, and the table says how its times were taken."""

import pytest

from smdccl.bench import report


def _row(backend, size, pass_us):
    return {"backend": backend, "collective": "allreduce", "size": size, "count": size // 4,
            "dtype": "float32", "op": "sum", "time_us": sorted(pass_us)[len(pass_us) // 2],
            "algbw": 1.0, "busbw": 1.0, "wrong": 0, "pass_us": pass_us}


def test_uneven_lists_lines_whose_passes_differ_more_than_twice():
    rows = [_row("smdccl", 4096, [10.0, 11.0, 19.0]),   # 1.9x: jitter, not listed
            _row("smdccl", 1 << 20, [100.0, 310.0, 105.0]),
            _row("gloo", 1 << 20, [1000.0, 1000.0, 1000.0]),
            _row("gloo", 4096, [5.0])]                    # one pass: nothing to compare
    assert report.uneven(rows) == ["smdccl allreduce 1048576 (3.1x)"]
    text = report.table(rows, [], ["smdccl", "gloo"], ["allreduce"], "# preamble")
    assert "# 1 of 4 lines: passes differ by more than 2x" in text
    assert "smdccl allreduce 1048576 (3.1x)" in text


def test_preamble_names_the_passes():
    info = {"command_line": "torchrun ...", "hostname": "h", "cpu_count": 2, "torch_version": "t",
            "world_size": 2, "device": "cpu", "warmup": 5, "iters": "auto", "passes": 3}
    text = report.preamble(info)
    assert "3 passes (backends in turn at each size)" in text
    assert "max over ranks, median over passes;" in text
    assert "median over passes" not in report.preamble(dict(info, passes=1))


def test_passes_option_is_checked():
    from smdccl.bench.cli import parse_args

    assert parse_args([]).passes == 3
    assert parse_args(["--passes", "1"]).passes == 1
    with pytest.raises(SystemExit):
        parse_args(["--passes", "0"])
