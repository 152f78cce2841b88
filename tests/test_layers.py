"""The layers of csrc/ are libraries, and the build refuses an include that
goes up or across them (cmake/check_layers.cmake):

    common -> topology | kernels -> transport -> algorithms -> backend

The check runs on the real tree, on a made tree that breaks the rule in each
way it can be broken, and inside a real CMake build of the core, whose first
library must then fail to build."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CMAKE = shutil.which("cmake")  # the package was built with it


def _check(root: Path) -> subprocess.CompletedProcess:
    assert CMAKE, "cmake is not on PATH"
    return subprocess.run([CMAKE, f"-DROOT={root}", "-P", str(ROOT / "cmake" / "check_layers.cmake")],
                          capture_output=True, text=True, timeout=60)


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / "csrc" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_each_layer_includes_only_the_layers_below_it():
    res = _check(ROOT)
    assert res.returncode == 0, res.stderr


def test_an_include_going_up_or_across_is_named(tmp_path):
    _write(tmp_path, {
        "common/a.h": '#include <vector>\n#include "common/b.h"\n',            # own layer
        "transport/cuda/wait.h": '#include "algorithms/op.h"\n',                # up
        "kernels/cpu/k.cpp": '#include "common/a.h"\n#include "topology/t.h"\n',  # across
        "algorithms/ring.cpp": '#include "transport/link.h"\n#include "kernels/cpu/k.h"\n',
        "backend/b.cpp": '#include "algorithms/ring.h"\n#include "common/a.h"\n',
        "common/log.cpp": '  #  include "backend/backend.h"\n',                 # up, spaced
    })
    res = _check(tmp_path)
    assert res.returncode != 0
    named = [line.strip() for line in res.stderr.splitlines() if line.strip().startswith("csrc/")]
    assert sorted(named) == [
        "csrc/common/log.cpp (common) includes backend/backend.h",
        "csrc/kernels/cpu/k.cpp (kernels) includes topology/t.h",
        "csrc/transport/cuda/wait.h (transport) includes algorithms/op.h",
    ], res.stderr


def test_the_build_fails_on_an_upward_include(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(ROOT / "csrc", src / "csrc")
    shutil.copytree(ROOT / "cmake", src / "cmake")
    shutil.copy(ROOT / "CMakeLists.txt", src)
    header = src / "csrc" / "common" / "deadline.h"
    header.write_text(header.read_text() + '\n#include "transport/link.h"\n')
    build = tmp_path / "build"
    configure = subprocess.run([CMAKE, "-S", str(src), "-B", str(build), "-DSMDCCL_CORE_ONLY=ON",
                                "-DSMDCCL_BUILD_TESTS=OFF"], capture_output=True, text=True,
                               timeout=300)
    assert configure.returncode == 0, configure.stdout + configure.stderr
    built = subprocess.run([CMAKE, "--build", str(build), "--target", "smdccl_common"],
                           capture_output=True, text=True, timeout=300)
    out = built.stdout + built.stderr
    assert built.returncode != 0, out
    assert "csrc/common/deadline.h (common) includes transport/link.h" in out, out
    # It failed before compiling anything.
    assert not list(build.rglob("*.o")), out
