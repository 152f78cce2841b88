"""Thin setuptools driver: CMake does the real build (see CMakeLists.txt).

Build against the torch that is installed:  pip install --no-build-isolation .
"""
import os
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        try:
            import torch  # the user's torch: the extension is built against it
        except ImportError:
            raise SystemExit(
                "smdccl is built against the installed torch, and the build cannot "
                "import torch: pip builds in an isolated environment unless told "
                "--no-build-isolation, or torch is not installed. Install torch first, "
                "then build in your environment:\n"
                '    pip install torch "setuptools>=70.1" && pip install --no-build-isolation .'
            ) from None

        out_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_dir = Path(self.build_temp).resolve() / "cmake"
        build_dir.mkdir(parents=True, exist_ok=True)
        cfg = os.environ.get("SMDCCL_BUILD_TYPE", "Release")
        args = [
            f"-DCMAKE_BUILD_TYPE={cfg}",
            f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
            f"-DPython3_EXECUTABLE={sys.executable}",
            f"-DSMDCCL_PYTHON_OUT_DIR={out_dir}",
        ]
        if os.environ.get("SMDCCL_CMAKE_ARGS"):
            args += os.environ["SMDCCL_CMAKE_ARGS"].split()
        gen = ["-G", "Ninja"] if _have("ninja") else []
        subprocess.check_call(["cmake", str(ROOT), *gen, *args], cwd=build_dir)
        jobs = os.environ.get("SMDCCL_BUILD_JOBS", str(os.cpu_count() or 2))
        subprocess.check_call(
            ["cmake", "--build", ".", "--target", "smdccl_C", "-j", jobs], cwd=build_dir
        )


def _have(tool):
    from shutil import which

    return which(tool) is not None


setup(
    name="smdccl",
    version="0.1.0",
    description="Two-level collective communication backend for torch.distributed",
    package_dir={"": "python"},
    packages=find_packages("python"),
    ext_modules=[CMakeExtension("smdccl._C")],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.10",
    entry_points={
        # Called at `import torch` (torch >= 2.11): must never raise.
        "torch.backends": ["smdccl = smdccl._registration:autoload"],
        # Loaded lazily by init_process_group("smdccl") (torch >= 2.14).
        "torch.distributed.backends": ["smdccl = smdccl._registration:register"],
    },
    zip_safe=False,
)
