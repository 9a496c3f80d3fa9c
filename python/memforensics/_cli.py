"""The native CLI this package ships (memforensics/_bin, built by setup.py) and how to run it."""
import json
import os
import subprocess
from pathlib import Path

_BIN = Path(__file__).resolve().parent / "_bin"


class MemforensicsError(RuntimeError):
    """The native tool refused an input or failed; the message is its own stderr."""


def bin_dir():
    return _BIN


def binary():
    """The CLI: MEMFORENSICS_BINARY when set (a build tree's src/cli/memforensics), else the copy
    installed with the package."""
    override = os.environ.get("MEMFORENSICS_BINARY")
    path = Path(override) if override else _BIN / "memforensics"
    if not path.is_file() or not os.access(path, os.X_OK):
        raise MemforensicsError(
            f"the memforensics executable is missing ({path}): install the package with "
            "`pip install --no-build-isolation .` from a checkout, or set MEMFORENSICS_BINARY")
    return str(path)


def build_info():
    try:
        return json.loads((_BIN / "build_info.json").read_text())
    except (OSError, ValueError):
        return {}


def run(args, check=True, text=True):
    """Runs `memforensics ARGS`; returns the CompletedProcess. check: raise MemforensicsError on
    exit status 1 or 2 (an error; 3 is check's verdict, a result)."""
    kw = {"encoding": "utf-8", "errors": "replace"} if text else {}
    r = subprocess.run([binary(), *map(str, args)], capture_output=True, **kw)
    if check and r.returncode not in (0, 3):
        err = r.stderr if text else r.stderr.decode(errors="replace")
        raise MemforensicsError(err.strip() or f"memforensics {args[0]} exited with {r.returncode}")
    return r


def path_arg(path):
    """A file name as an argument: one starting with '-' would read as an option."""
    p = os.fspath(path)
    return "./" + p if p.startswith("-") else p


# The limits of `memforensics check`, as memforensics.check() and the pytest marker name them.
CHECK_LIMITS = (("max_peak", "--max-peak-reserved"),
                ("max_peak_requested", "--max-peak-requested"),
                ("max_growth_per_step", "--max-growth-per-step"),
                ("fail_on", "--fail-on"), ("device", "--device"))


def check_args(path, limits):
    """`check PATH` with a flag for each limit in the dict that is not None."""
    args = ["check", path]
    for key, flag in CHECK_LIMITS:
        if limits.get(key) is not None:
            args += [flag, limits[key]]
    return args


def run_json(args, object_hook=None):
    """Runs a command with --json; returns its first document (one per line)."""
    r = run([*args, "--json"])
    line = r.stdout.split("\n", 1)[0]
    return json.loads(line, object_hook=object_hook)
