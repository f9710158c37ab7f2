"""Build and install horovod 0.28.1 (PyTorch + Gloo, CPU) into the running interpreter's environment.

horovod 0.28.1 is its last release and ships only as an sdist. Its CMake files force C++14, while
torch >= 2.1 headers need C++17, so a plain ``pip install horovod`` fails to compile against any
current torch. This script is the one recipe: download the sdist, raise the C++ standard to 17 in the
two CMake files that set it, and build with PyTorch and Gloo only (no MPI, TensorFlow or MXNet),
without build isolation (the build must see the installed torch) and constrained by
``tools/constraints.txt`` so that pip never swaps torch for another build.

Usage: ``python tools/build_horovod.py``. Needs cmake and a C++ compiler; prints how long the build
took. When horovod 0.28.1 is already installed and ``horovod.torch`` loads against the installed torch,
it says so and builds nothing (a torch with another ABI fails that check, and horovod is rebuilt).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

VERSION = "0.28.1"
CONSTRAINTS = Path(__file__).resolve().parent / "constraints.txt"
# The files that set the standard, and the exact line each carries in 0.28.1.
CMAKE_FILES = ("CMakeLists.txt", "horovod/torch/CMakeLists.txt")
CXX14 = "set(CMAKE_CXX_STANDARD 14)"
CXX17 = "set(CMAKE_CXX_STANDARD 17)"
BUILD_ENV = {
    "HOROVOD_WITH_PYTORCH": "1",
    "HOROVOD_WITH_GLOO": "1",
    "HOROVOD_WITHOUT_MPI": "1",
    "HOROVOD_WITHOUT_TENSORFLOW": "1",
    "HOROVOD_WITHOUT_MXNET": "1",
}


def pip(*args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True, env=env)


def raise_cxx_standard(source: Path) -> None:
    for relative in CMAKE_FILES:
        path = source / relative
        text = path.read_text()
        if CXX14 not in text:
            raise RuntimeError(f"{path} no longer contains {CXX14!r}; the recipe targets horovod {VERSION}")
        path.write_text(text.replace(CXX14, CXX17))


def installed_and_loading() -> bool:
    probe = f"import horovod, horovod.torch; raise SystemExit(horovod.__version__ != {VERSION!r})"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def main() -> None:
    if installed_and_loading():
        print(f"horovod {VERSION}: already installed and loads against this torch", flush=True)
        return
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="horovod-build-") as work:
        workdir = Path(work)
        pip("download", "--no-deps", "--no-binary", ":all:", f"horovod=={VERSION}", "-d", str(workdir))
        with tarfile.open(workdir / f"horovod-{VERSION}.tar.gz") as archive:
            archive.extractall(workdir, filter="data")
        source = workdir / f"horovod-{VERSION}"
        raise_cxx_standard(source)
        # The build's own requirements, installed up front because isolation is off. CMake 4 refuses
        # the ``cmake_minimum_required(2.8.12)`` of the bundled gloo, hence the upper bound.
        pip("install", "-c", str(CONSTRAINTS), "cmake>=3.13,<4", "setuptools", "wheel")
        pip(
            "install",
            "--no-build-isolation",
            "--no-cache-dir",
            "-c",
            str(CONSTRAINTS),
            str(source),
            # horovod's setup.py runs ``make -j8`` unless MAKEFLAGS is set; match the machine instead.
            env={"MAKEFLAGS": f"-j{os.cpu_count() or 1}", **os.environ, **BUILD_ENV},
        )
    print(f"horovod {VERSION}: built and installed in {time.perf_counter() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
