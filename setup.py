"""Builds the native part of the Python package with CMake and ships it in the wheel.

`pip install --no-build-isolation .` runs this: it configures and builds the project (the CLI, and the
capture libraries where CUPTI / a CUDA PyTorch are found) in build/python, configured again on every
install (so that a torch installed since is found), or in the build directory MEMFORENSICS_BUILD_DIR
names (one already configured is only brought up to date: how the tests reuse the build they have),
and copies the executable and libraries into memforensics/_bin. MEMFORENSICS_CMAKE_ARGS adds
arguments to the configure step. Nothing is fetched.
"""
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent

# target -> (file in the build directory, name in the package). The CLI is required; the capture
# libraries are built when the project defines their targets (CUPTI found; a CUDA PyTorch found).
CLI = ("memforensics", "src/cli/memforensics", "memforensics")
OPTIONAL = [
    ("memforensics_cupti", "src/capture/libmemforensics_cupti.so", "libmemforensics_cupti.so"),
    ("memforensics_torch", "src/capture/libmemforensics_torch.so", "libmemforensics_torch.so"),
]


def torch_python():
    """sys.executable when it imports a CUDA torch (the hook is then built for that torch)."""
    probe = "import torch, sys; sys.exit(0 if torch.version.cuda else 1)"
    try:
        r = subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return sys.executable if r.returncode == 0 else None


def configure(build):
    args = ["cmake", "-S", str(ROOT), "-B", str(build), "-DMEMF_BUILD_TESTS=OFF",
            "-DCMAKE_BUILD_TYPE=Release"]
    if shutil.which("ninja") and not (build / "CMakeCache.txt").exists():
        args += ["-G", "Ninja"]
    py = torch_python()
    args.append(f"-DMEMF_TORCH_PYTHON={py or ''}")
    args += shlex.split(os.environ.get("MEMFORENSICS_CMAKE_ARGS", ""))
    print("memforensics: " + " ".join(args), flush=True)
    subprocess.run(args, check=True)


def known_targets(build):
    listing = subprocess.run(["cmake", "--build", str(build), "--target", "help"],
                             capture_output=True, text=True).stdout
    # Ninja prints "name: phony", Makefiles "... name".
    return {w.rstrip(":") for line in listing.splitlines() for w in line.split()[:2]}


class BuildNative(build_py):
    def run(self):
        super().run()
        given = os.environ.get("MEMFORENSICS_BUILD_DIR")
        build = Path(given or ROOT / "build" / "python").resolve()
        if not given or not (build / "CMakeCache.txt").exists():
            configure(build)
        jobs = str(os.cpu_count() or 1)
        known = known_targets(build)
        subprocess.run(["cmake", "--build", str(build), "-j", jobs, "--target", CLI[0]], check=True)
        built = [CLI]
        for target in OPTIONAL:
            if target[0] not in known:
                continue
            r = subprocess.run(["cmake", "--build", str(build), "-j", jobs, "--target", target[0]])
            if r.returncode == 0:
                built.append(target)
            else:
                print(f"memforensics: {target[0]} did not build; the package goes without it",
                      flush=True)
        dest = Path(self.build_lib) / "memforensics" / "_bin"
        shutil.rmtree(dest, ignore_errors=True)  # nothing left from an earlier build
        dest.mkdir(parents=True)
        for _, rel, name in built:
            shutil.copy2(build / rel, dest / name)
        names = [name for _, _, name in built]
        hook_version = build / "memforensics_torch_hook.txt"
        info = {
            "files": sorted(names),
            "torch_hook_built_for": hook_version.read_text().strip()
            if "libmemforensics_torch.so" in names and hook_version.exists() else None,
        }
        (dest / "build_info.json").write_text(json.dumps(info, indent=1) + "\n")


class BinaryDistribution(Distribution):
    def has_ext_modules(self):  # a platform wheel: it carries executables
        return True


commands = {"build_py": BuildNative}
try:  # setuptools >= 70.1 has its own; Debian 12's takes it from the wheel package
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:
        bdist_wheel = None
if bdist_wheel is not None:
    class PlatformWheel(bdist_wheel):
        """Tagged py3-none-PLATFORM: the executables and libraries it carries are tied to the
        platform, not to a Python version (nothing in it links libpython)."""

        def get_tag(self):
            return ("py3", "none", super().get_tag()[2])

    commands["bdist_wheel"] = PlatformWheel

# setuptools' own scratch space stays out of the CMake build directory's top level.
setup(cmdclass=commands, distclass=BinaryDistribution,
      options={"build": {"build_base": "build/setuptools"}})
