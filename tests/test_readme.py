"""The README is the user's entry point: it must point to every SMDCCL_*
variable the engine declares (docs/env.md) and name no stale one, and .ci/run
must run the README's test command."""

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

import smdccl

ROOT = Path(__file__).resolve().parents[1]


def test_readme_points_to_every_env_var():
    # The full list is docs/env.md, generated from the declarations
    # (test_env_docs.py); the README names a few: each must exist.
    readme = (ROOT / "README.md").read_text()
    assert "docs/env.md" in readme
    names = {name for name, _default, _help in smdccl.env_vars()}
    assert names, "the engine declares no variables?"
    # Not the engine's: CMake options (-DSMDCCL_...), the build's own variable
    # (setup.py) and scripts/gpu_check.sh's.
    mentioned = set(re.findall(r"(?<![\w-])SMDCCL_[A-Z0-9_]*[A-Z0-9]", readme))
    build = {"SMDCCL_CMAKE_ARGS"}
    assert all(b in (ROOT / "setup.py").read_text() for b in build)
    stale = sorted(n for n in mentioned - build - names if not n.startswith("SMDCCL_GPU_CHECK"))
    assert not stale, f"README names variables the engine does not declare: {stale}"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = next(line for line in ci.splitlines() if "pytest" in line and "pip install" in line)
    assert command.strip() in readme


def _readme_command(marker: str) -> str:
    readme = (ROOT / "README.md").read_text()
    return next(line for line in readme.splitlines() if line.startswith("pip install") and marker in line)


def _hide_numpy(tmp_path: Path) -> dict:
    """An environment in which `import numpy` fails as if it were not installed
    (a fresh venv with just torch): torch then reports "Numpy is not available"
    wherever it needs it, as in the user's first run."""
    fake = tmp_path / "no_numpy" / "numpy"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        'raise ModuleNotFoundError("numpy is hidden by this test", name="numpy")\n')
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(fake.parent), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("SMDCCL_TOPOLOGY", None)
    return env


def _torchrun(command: str) -> list[str]:
    """The torchrun part of a README command as argv, run by this interpreter
    (`python -m torch.distributed.run` is torchrun)."""
    part = command.split("&&")[-1].split()
    assert part[0] == "torchrun", command
    return [sys.executable, "-m", "torch.distributed.run", *part[1:]]


@pytest.mark.multiprocess
def test_readme_benchmark_command_runs_without_numpy(tmp_path):
    """The README's benchmark command, its Python part, where numpy is absent
    (up to 64 KB and 0.05 s a size, to keep it short): a table for smdccl and
    gloo, no wrong results, exit code 0."""
    argv = _torchrun(_readme_command("smdccl.bench")) + ["--max-bytes", "64K", "--target-time", "0.05",
                                                         "--json", "out.json"]
    out = subprocess.run(argv, env=_hide_numpy(tmp_path), cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    assert "Traceback" not in text, text[-4000:]
    assert "#wrong total: 0  OK" in out.stdout, out.stdout[-2000:]
    rows = [line.split() for line in out.stdout.splitlines() if line.strip() and not line.startswith("#")]
    assert {r[0] for r in rows} == {"smdccl", "gloo"}, out.stdout[-2000:]
    assert sum(r[0] == "smdccl" and r[1] == "65536" for r in rows) == 5  # each collective
    # three passes per line, the table's time their median (smdccl.bench.sweep)
    saved = json.loads((tmp_path / "out.json").read_text())
    assert saved["header"]["passes"] == 3
    for row in saved["rows"]:
        assert len(row["pass_us"]) == 3, row
        assert row["time_us"] == statistics.median(row["pass_us"]), row


@pytest.mark.parametrize("module", ["smdccl.bench.cli", "smdccl.bench.ddp", "smdccl.bench.accuracy",
                                    "smdccl.bench.sparse", "smdccl.tune.cli"])
@pytest.mark.parametrize("rank", ["0", "1"])
def test_only_rank_zero_prints_help_and_usage_errors(module, rank, monkeypatch, capsys):
    """Every rank under torchrun parses the same command line: rank 0 alone
    prints; every rank exits with argparse's code."""
    import importlib

    monkeypatch.setenv("RANK", rank)
    parser = importlib.import_module(module).build_parser()
    for argv, code in ((["--help"], 0), (["--no-such-option"], 2)):
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(argv)
        assert exc.value.code == code
        out, err = capsys.readouterr()
        assert bool(out + err) == (rank == "0"), (argv, out, err)


@pytest.mark.multiprocess
def test_help_under_torchrun_prints_once():
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
            "-m", "smdccl.bench", "--help"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count("usage:") == 1, out.stdout


@pytest.mark.multiprocess
def test_readme_ddp_example_runs(tmp_path):
    """The "Use with DDP" example, verbatim, under torchrun with 2 ranks."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Use with DDP"):]
    code = section[section.index("```python\n") + len("```python\n"):]
    code = code[:code.index("```")]
    (tmp_path / "train.py").write_text(code)
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "train.py"]
    out = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("backend ")]
    assert len(lines) == 1 and re.fullmatch(r"backend smdccl, 2 ranks: \d+ steps/s", lines[0]), out.stdout
