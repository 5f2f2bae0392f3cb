"""Thin driver: setuptools hands the native build to CMake (see CMakeLists.txt).

Environment knobs (all optional), passed to CMake as cache entries:
  FDMTP_WITH_CUDA   AUTO (default: build CUDA kernels when nvcc is found), ON, OFF
  FDMTP_CUDA_ARCHS  e.g. "80-real;90-real;90a-real;90-virtual" (the default)
  FDMTP_BUILD_DIR   CMake build folder (default: build/cmake-<python tag> in the repo)
  FDMTP_BUILD_JOBS  parallel compile jobs (default: number of CPUs)
  FDMTP_WITH_XPU    OFF (default: XPU3 kernels for the emulator only), ON (Kunlun SDK)
  FDMTP_XPU_SDK     Kunlun SDK root (or CLANG_PATH, XRE_PATH, XDNN_PATH, read by CMake)
"""

import os
import shutil
import subprocess
import sys
import sysconfig
import time

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


# The two libraries the CMake project produces, as extension names (the Paddle ops
# library carries Python's extension suffix only so that setuptools places it).
EXTENSIONS = ("fastdeploy_mtp._kernels", "fastdeploy_mtp.ops._fdmtp_ops")
# The typed Python op wrappers CMake generates from custom_ops/ops/*.toml (never committed).
GENERATED_WRAPPERS = "_op_wrappers.py"


def _build_dir():
    """The CMake build folder (FDMTP_BUILD_DIR, default build/cmake-<python tag>)."""
    tag = sysconfig.get_config_var("SOABI") or "py"
    return os.environ.get("FDMTP_BUILD_DIR", os.path.join(ROOT, "build", f"cmake-{tag}"))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


def _cmake_binary():
    try:
        import cmake  # the PyPI package; its binary is newer than most distro packages

        return os.path.join(cmake.CMAKE_BIN_DIR, "cmake")
    except ImportError:
        found = shutil.which("cmake")
        if not found:
            raise RuntimeError("CMake >= 3.18 is required: pip install cmake") from None
        return found


class CMakeBuild(build_ext):
    """Runs CMake once (for the first extension), then copies each library to the path
    setuptools expects for it; setuptools itself copies them in place for editable
    installs."""

    def build_extension(self, ext):
        build_dir = _build_dir()
        stage = os.path.join(build_dir, "out")
        if not getattr(self, "_fdmtp_built", False):
            self._run_cmake(build_dir, stage)
            self._fdmtp_built = True
        relative = os.path.join(*ext.name.split(".")[1:]) + sysconfig.get_config_var("EXT_SUFFIX")
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(stage, relative), target)
        if ext.name == "fastdeploy_mtp.ops._fdmtp_ops":
            # The Python op wrappers generated from the op declarations go with the library.
            self._copy_wrappers(stage, os.path.dirname(target))

    def copy_extensions_to_source(self):
        """Editable installs: setuptools copies the libraries into the source tree; the
        generated wrappers must land beside them."""
        super().copy_extensions_to_source()
        self._copy_wrappers(
            os.path.join(_build_dir(), "out"), os.path.join(ROOT, "fastdeploy_mtp", "ops")
        )

    @staticmethod
    def _copy_wrappers(stage, package_dir):
        os.makedirs(package_dir, exist_ok=True)
        shutil.copyfile(
            os.path.join(stage, "ops", GENERATED_WRAPPERS),
            os.path.join(package_dir, GENERATED_WRAPPERS),
        )

    def _run_cmake(self, build_dir, stage):
        os.makedirs(build_dir, exist_ok=True)
        cmake = _cmake_binary()
        args = [
            f"-DPython3_EXECUTABLE={sys.executable}",
            f"-DFDMTP_OUTPUT_DIR={stage}",
            "-DCMAKE_BUILD_TYPE=Release",
        ]
        for key in ("FDMTP_WITH_CUDA", "FDMTP_CUDA_ARCHS", "FDMTP_WITH_XPU", "FDMTP_XPU_SDK"):
            if os.environ.get(key):
                args.append(f"-D{key}={os.environ[key]}")
        jobs = os.environ.get("FDMTP_BUILD_JOBS", str(os.cpu_count() or 1))
        start = time.time()
        print(f"fastdeploy_mtp: configuring native build in {build_dir}", flush=True)
        subprocess.run([cmake, "-S", ROOT, "-B", build_dir, *args], check=True)
        print(f"fastdeploy_mtp: compiling with {jobs} jobs", flush=True)
        subprocess.run([cmake, "--build", build_dir, "-j", jobs], check=True)
        print(f"fastdeploy_mtp: native build done in {time.time() - start:.1f} s", flush=True)


setup(
    ext_modules=[CMakeExtension(name) for name in EXTENSIONS],
    cmdclass={"build_ext": CMakeBuild},
)
