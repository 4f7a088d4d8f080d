"""`pip install .` for the promptcache Python package (docs/python.md).

setuptools (Debian's python3-setuptools: nothing comes from PyPI) drives this CMake project:
it configures it with the Python that runs pip, builds the one target promptcache_python and
puts the module into the wheel's promptcache/ folder beside the package's .py files. Inside a
virtual environment made with --system-site-packages (for python3-torch and pybind11-dev):

    python3 -m venv --system-site-packages .venv && . .venv/bin/activate
    pip install --no-build-isolation --no-index .

CMAKE_ARGS adds configure arguments; PROMPTCACHE_BUILD_JOBS sets the build's parallelism.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        package_dir = Path(self.get_ext_fullpath(ext.name)).parent.resolve()
        build_dir = Path(self.build_temp).resolve() / "cmake"
        build_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        args = [
            "-S", str(ROOT), "-B", str(build_dir),
            "-DCMAKE_BUILD_TYPE=Release",
            "-DPROMPTCACHE_BUILD_PYTHON=ON",
            "-DPROMPTCACHE_BUILD_TESTS=OFF",
            "-DPROMPTCACHE_BUILD_BENCHMARKS=OFF",
            "-DPROMPTCACHE_BUILD_EXAMPLES=OFF",
            "-DPython3_EXECUTABLE=" + sys.executable,
            "-DPROMPTCACHE_PYTHON_PACKAGE_DIR=" + str(package_dir),
        ]
        if shutil.which("ccache"):  # as scripts/build.sh
            args.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
            env.setdefault("CCACHE_BASEDIR", str(ROOT))
            env.setdefault("CCACHE_SLOPPINESS",
                           "pch_defines,time_macros,include_file_mtime,include_file_ctime")
        args += os.environ.get("CMAKE_ARGS", "").split()
        subprocess.run(["cmake", *args], check=True, env=env)
        jobs = os.environ.get("PROMPTCACHE_BUILD_JOBS", str(os.cpu_count() or 1))
        subprocess.run(["cmake", "--build", str(build_dir), "--target", "promptcache_python",
                        "-j", jobs], check=True, env=env)


setup(
    name="promptcache",
    version="0.1.0",
    description="Prompt Cache: modular attention reuse for low-latency inference (Python bindings)",
    license="MIT",
    python_requires=">=3.9",
    packages=["promptcache"],
    package_dir={"": "python"},
    package_data={"promptcache": ["__init__.pyi", "py.typed"]},
    ext_modules=[CMakeExtension("promptcache._promptcache")],
    cmdclass={"build_ext": CMakeBuild},
    # Kept out of build/, the CMake build folder of scripts/build.sh.
    options={"build": {"build_base": "build-pip"}, "egg_info": {"egg_base": "build-pip"}},
    zip_safe=False,
)
