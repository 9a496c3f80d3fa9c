"""memforensics from Python: record a training script's CUDA memory, analyse snapshots and traces in a
notebook, gate GPU memory in pytest. docs/python.md."""
import os
import pickle
import tempfile

from . import _cli
from ._cli import MemforensicsError
from ._record import Recording, record, start, stop
from ._result import Analysis, Doc

__version__ = "0.1.0"
__all__ = ["analyze", "check", "record", "start", "stop", "Analysis", "Doc", "Recording",
           "MemforensicsError", "cli"]


def _source(snapshot):
    """(path, temporary directory to keep alive) for a path or a snapshot dict."""
    if isinstance(snapshot, dict):
        tmp = tempfile.TemporaryDirectory(prefix="memforensics-")
        path = os.path.join(tmp.name, "snapshot.pickle")
        try:
            with open(path, "wb") as f:
                pickle.dump(snapshot, f, protocol=4)
        except BaseException:
            tmp.cleanup()
            raise
        return path, tmp
    return _cli.path_arg(snapshot), None


def _refused(e, path, keep):
    """The CLI's error about a snapshot dict names the dict, not the temporary file it was written
    to (which is gone by the time the error is read)."""
    if keep is None:
        return e
    return MemforensicsError(
        str(e).replace(path, "the snapshot dict") + "\n(memforensics reads a snapshot dict as plain "
        "data: dicts, lists, tuples, strings, numbers, booleans and None)")


def analyze(snapshot, device=None, threads=None, salvage=False):
    """Analyses one file (a PyTorch snapshot pickle, memory_viz HTML, JSON, profiler trace or
    native trace) or a snapshot dict (``torch.cuda.memory._snapshot()``); returns the document
    ``memforensics analyze --json`` prints, as an Analysis (attribute and dict access, ``.report``,
    ``.events``, ``.live_at``, ``.timeline``; in a notebook it displays itself)."""
    path, keep = _source(snapshot)
    args = ["analyze", path]
    if device is not None:
        args += ["--device", device]
    if threads is not None:
        args += ["--threads", threads]
    if salvage:
        args.append("--salvage")
    try:
        doc = _cli.run_json(args, object_hook=Doc)
    except MemforensicsError as e:
        if keep is not None:
            keep.cleanup()
        raise _refused(e, path, keep) from None
    except BaseException:
        if keep is not None:
            keep.cleanup()
        raise
    # The document names the file as given; the result's methods read it again by its absolute
    # path, which a later chdir does not change.
    return Analysis(doc)._attach(path if keep is not None else os.path.abspath(path), keep)


def check(snapshot, max_peak=None, max_peak_requested=None, max_growth_per_step=None,
          fail_on=None, device=None):
    """`memforensics check` on one file or snapshot dict: returns its JSON document (``passed``,
    ``violations`` with each figure, limit and line). Sizes: bytes or "2 GiB", "512MiB"."""
    path, keep = _source(snapshot)
    args = _cli.check_args(path, {"max_peak": max_peak, "max_peak_requested": max_peak_requested,
                                  "max_growth_per_step": max_growth_per_step, "fail_on": fail_on,
                                  "device": device})
    try:
        return _cli.run_json(args, object_hook=Doc)
    except MemforensicsError as e:
        raise _refused(e, path, keep) from None
    finally:
        if keep is not None:
            keep.cleanup()


def cli(*args):
    """Runs the native CLI with these arguments; returns the CompletedProcess (text output)."""
    return _cli.run(list(args), check=False)
