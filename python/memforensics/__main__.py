"""`python -m memforensics ...`: the native CLI, plus `run`, which records a Python script."""
import os
import runpy
import sys

from . import _cli

USAGE = """usage: python -m memforensics run [-o FILE] [--no-stacks] SCRIPT [ARGS...]
       python -m memforensics run [-o FILE] [--no-stacks] -m MODULE [ARGS...]
Runs a Python script (or module) with its CUDA memory recorded to FILE (default
memforensics-<pid>.bin) from its first use of CUDA (what it sets before, such as
PYTORCH_CUDA_ALLOC_CONF, still applies): no change to its code.
Every other command is the native CLI's: python -m memforensics --help."""


def _run(argv):
    out, stacks, module = None, True, False
    while argv and argv[0].startswith("-"):
        a = argv.pop(0)
        if a == "--":
            break
        if a in ("-o", "--output"):
            if not argv:
                print(f"memforensics run: {a} needs a file name\n{USAGE}", file=sys.stderr)
                return 2
            out = argv.pop(0)
        elif a == "--no-stacks":
            stacks = False
        elif a == "-m":
            module = True
            break
        elif a in ("-h", "--help"):
            print(USAGE)
            return 0
        else:
            print(f"memforensics run: unknown option {a}\n{USAGE}", file=sys.stderr)
            return 2
    if not argv:
        print(USAGE, file=sys.stderr)
        return 2
    target = argv[0]
    # As `python script.py` / `python -m module` would: the script's directory, or the working
    # directory, first on the path in place of this package's entry point.
    sys.path[0] = os.getcwd() if module else os.path.dirname(os.path.abspath(target))
    if module:
        import importlib.util
        try:
            found = importlib.util.find_spec(target) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            print(f"memforensics run: no module named {target}", file=sys.stderr)
            return 1
    elif not os.path.isfile(target):
        print(f"memforensics run: can't open file {target!r}", file=sys.stderr)
        return 2
    from ._record import start_with_cuda
    try:
        rec = start_with_cuda(out or f"memforensics-{os.getpid()}.bin", stacks=stacks)
    except _cli.MemforensicsError as e:
        print(f"memforensics run: {e}", file=sys.stderr)
        return 2
    sys.argv = list(argv)
    finished = True
    try:  # the script's SystemExit and exceptions pass through, after the file is finished
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    finally:
        try:
            rec.stop()
        except Exception as e:  # never hide the script's own outcome
            print(f"memforensics run: the recording could not be finished: {e}", file=sys.stderr)
            finished = False
        if rec.method is None:
            print(f"memforensics run: nothing recorded: {rec.reason or 'the program never used CUDA'}",
                  file=sys.stderr)
            finished = finished and not rec.failed_to_start
    return 0 if finished else 1


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "run":
        return _run(argv[1:])
    try:
        exe = _cli.binary()
    except _cli.MemforensicsError as e:
        print(f"memforensics: {e}", file=sys.stderr)
        return 2
    os.execv(exe, [exe, *argv])


if __name__ == "__main__":
    sys.exit(main())
