"""The README is the user's entry point: it must list every SMDCCL_* variable
the engine declares, and .ci/run must run the README's test command."""

from pathlib import Path

import smdccl

ROOT = Path(__file__).resolve().parents[1]


def test_readme_documents_every_env_var():
    readme = (ROOT / "README.md").read_text()
    names = [name for name, _default, _help in smdccl.env_vars()]
    assert names, "the engine declares no variables?"
    missing = [n for n in names if f"`{n}`" not in readme]
    assert not missing, f"README lacks {missing}"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = next(line for line in ci.splitlines() if "pytest" in line and "pip install" in line)
    assert command.strip() in readme
