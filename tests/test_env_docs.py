"""Every SMDCCL_* variable is declared once, beside the code that reads it,
and everything users read about the variables is made from those
declarations: docs/env.md (compared as text, not only names),
``python -m smdccl.info --env`` and the range in a bad value's error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from smdccl import _C
from smdccl._registration import AUTOLOAD_ENV, env_table
from smdccl.info import env_markdown

ROOT = Path(__file__).resolve().parents[1]


def test_docs_env_md_is_what_the_declarations_make():
    want = env_markdown(env_table())
    have = (ROOT / "docs" / "env.md").read_text()
    assert have == want, ("docs/env.md differs from the declarations: regenerate it with "
                          "`python -m smdccl.info --env-markdown > docs/env.md`")


def test_each_variable_is_declared_once_where_it_is_read():
    table = _C.env_table()
    names = [v["name"] for v in table]
    assert names == sorted(set(names)), f"declared twice (or out of order): {names}"
    assert len(names) >= 20, names  # every reader's file is linked into the engine
    for v in table:
        src = ROOT / v["declared_in"]
        assert src.is_file(), v
        text = src.read_text()
        assert f'"{v["name"]}"' in text, v  # the declaration
        ident = next(line.split("(", 1)[1].split(",", 1)[0] for line in text.splitlines()
                     if f'"{v["name"]}"' in line and "SMDCCL_ENV_" in line)
        uses = text.count(f"env::{ident}") + text.count(f"({ident})")
        assert uses >= 1, f"{v['name']} is declared in {src} but not read there"
    # The one the Python package reads before the engine loads: declared
    # there once (default included), and not in the engine.
    assert AUTOLOAD_ENV["name"] not in names
    assert [v["name"] for v in env_table()] == sorted(names + [AUTOLOAD_ENV["name"]])
    registration = (ROOT / AUTOLOAD_ENV["declared_in"]).read_text()
    assert registration.count('"SMDCCL_AUTOLOAD"') == 1 and 'AUTOLOAD_ENV["default"]' in registration


def test_info_env_lists_every_variable_with_its_value_here():
    env = dict(os.environ, SMDCCL_FUSION_MB="7")
    out = subprocess.run([sys.executable, "-m", "smdccl.info", "--env"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for v in env_table():
        assert f"{v['name']} = " in out.stdout, v["name"]
    assert "SMDCCL_FUSION_MB = 7  [default 16; integer, 0 to 1024]" in out.stdout, out.stdout


def test_smdccl_algo_names_every_registered_algorithm():
    algo = next(v for v in env_table() if v["name"] == "SMDCCL_ALGO")
    for name, _collectives in _C.algorithms():
        assert name in algo["help"], f"SMDCCL_ALGO's help does not name {name}"
