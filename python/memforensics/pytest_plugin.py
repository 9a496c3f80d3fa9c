"""pytest plugin (registered by the package): ``@pytest.mark.gpu_memory(...)`` records a test's CUDA
memory and fails the test when a limit is passed, with the finding's headline and line.

    @pytest.mark.gpu_memory(max_peak="2 GiB", max_growth_per_step="16 MiB", fail_on="high")
    def test_train_step(): ...

Limits: max_peak (peak reserved bytes), max_peak_requested, max_growth_per_step (requested bytes
at an iteration's end over the previous one's), fail_on ("high" or "warning" findings; "high" when
no limit is given), device. Skipped, with the reason, where no CUDA device exists (before the
test's fixtures run). ``--gpu-memory-report DIR`` writes an HTML report per failing test;
``--gpu-memory-keep DIR`` keeps every test's recording.
"""
import hashlib
import os
import re
import shutil
import tempfile

import pytest

from . import _cli, _record

LIMITS = tuple(key for key, _ in _cli.CHECK_LIMITS)


def cuda_available():
    """(True, None) or (False, why): whether the marked tests can record here (record()'s own
    test: PyTorch importable, a CUDA device present)."""
    try:
        _record._import_torch()
    except _cli.MemforensicsError as e:
        return False, f"gpu_memory: {e}"
    return True, None


def start_recording(path):
    """Starts recording the test to ``path``; returns an object with stop(). What earlier tests
    left in PyTorch's cache is released first, so that a test's peak reserved bytes are its own.
    The plugin's tests replace this (and cuda_available) to run without a GPU."""
    import torch
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return _record.start(path)


def pytest_addoption(parser):
    group = parser.getgroup("memforensics")
    group.addoption("--gpu-memory-report", metavar="DIR", default=None,
                    help="write memforensics' HTML report of each test that fails its gpu_memory limits")
    group.addoption("--gpu-memory-keep", metavar="DIR", default=None,
                    help="keep the recording of every gpu_memory test in DIR")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "gpu_memory(max_peak=None, max_peak_requested=None, max_growth_per_step=None, "
        "fail_on=None, device=None): record the test's CUDA memory with memforensics and fail "
        "it when a limit is passed (fail_on='high' when no limit is given)")


def _limits(marker):
    if marker.args:
        raise pytest.UsageError("gpu_memory takes keyword arguments only: " + ", ".join(LIMITS))
    unknown = set(marker.kwargs) - set(LIMITS)
    if unknown:
        raise pytest.UsageError(f"gpu_memory: unknown argument(s) {sorted(unknown)}; "
                                f"known: {', '.join(LIMITS)}")
    limits = dict(marker.kwargs)
    if all(limits.get(k) is None for k in LIMITS if k != "device"):
        limits["fail_on"] = "high"
    return limits


def _slug(nodeid):
    """A file name for a test: readable, and unique (a hash of the whole id: ids that differ only
    in characters a file name cannot keep stay apart)."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_")[:110] or "test"
    return slug + "-" + hashlib.sha1(nodeid.encode()).hexdigest()[:8]


def _dir_option(config, name):
    """A directory option, relative to where pytest was started (a test may chdir)."""
    value = config.getoption(name)
    if not value:
        return None
    return os.path.join(str(config.invocation_params.dir), value)


class GpuMemoryLimitExceeded(AssertionError):
    """A test's recording passed one of its gpu_memory limits."""


def _verdict(path, limits):
    r = _cli.run(_cli.check_args(path, limits))
    return r.returncode == 0, r.stdout.strip()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    marker = item.get_closest_marker("gpu_memory")
    if marker is None:
        return
    _limits(marker)
    ok, why = cuda_available()
    if not ok:
        pytest.skip(why)
    if _record._active is not None:  # one recording a process: `memforensics run -m pytest`
        pytest.skip(f"gpu_memory: the whole process is being recorded ({_record._active.path}), "
                    "so the test cannot be recorded on its own")


def _judge(item, path, limits):
    """The text the test fails with, or None when every limit holds."""
    passed, text = _verdict(path, limits)
    if passed:
        return None
    text = "GPU memory limits exceeded\n" + text
    report_dir = _dir_option(item.config, "--gpu-memory-report")
    if report_dir:
        html = os.path.join(report_dir, _slug(item.nodeid) + ".html")
        try:
            os.makedirs(report_dir, exist_ok=True)
            _cli.run(["report", path, "-o", html])
            text += f"\nreport: {html}"
        except Exception as e:  # the verdict stands without its report
            text += f"\nreport not written: {e}"
    return text


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    # Nothing may be raised here after the test ran (pluggy 1.0 would skip the outer wrappers'
    # teardown, pytest's capture among them): the verdict is kept on the item and becomes the
    # call's exception in pytest_runtest_makereport.
    item.__dict__.pop("_memforensics_verdict", None)  # a rerun is judged afresh
    marker = item.get_closest_marker("gpu_memory")
    if marker is None:
        yield
        return
    limits = _limits(marker)
    tmp = tempfile.mkdtemp(prefix="memforensics-pytest-")
    path = os.path.join(tmp, _slug(item.nodeid) + ".bin")
    try:  # raised before the test runs, an error is the test's (outer teardowns still run)
        rec = start_recording(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    outcome = yield
    verdict = None
    try:
        rec.stop()
        # A test that failed by itself keeps its own error (a unittest.TestCase's is in _excinfo:
        # pytest makes it the call's exception only when the report is made).
        if outcome.excinfo is None and not getattr(item, "_excinfo", None):
            verdict = _judge(item, path, limits)
    except Exception as e:  # finishing the recording or judging it failed: the test fails so
        verdict = f"gpu_memory: memforensics could not judge this test: {e}"
    keep = _dir_option(item.config, "--gpu-memory-keep")
    try:
        if keep and os.path.exists(path):
            os.makedirs(keep, exist_ok=True)
            kept = os.path.join(keep, os.path.basename(path))
            shutil.copy2(path, kept)
            if verdict:
                verdict += f"\nrecording: {kept}"
        elif verdict:
            verdict += "\n(the recording is deleted; --gpu-memory-keep DIR keeps it)"
    except Exception as e:
        if verdict:
            verdict += f"\nrecording not kept: {e}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if verdict:
        item._memforensics_verdict = verdict


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # Outermost: the verdict enters as the call's exception, so that what runs inside (xfail
    # handling, --pdb, junitxml, -x) treats it as the test's own failure.
    verdict = item.__dict__.pop("_memforensics_verdict", None) if call.when == "call" else None
    if verdict and call.excinfo is None:
        try:
            raise GpuMemoryLimitExceeded(verdict)
        except GpuMemoryLimitExceeded:
            call.excinfo = pytest.ExceptionInfo.from_current()
    outcome = yield
    if verdict:
        rep = outcome.get_result()
        # The verdict itself, not the plugin's frame (and only the verdict: an exception another
        # hook made the call's keeps its traceback).
        if rep.failed and call.excinfo is not None and isinstance(call.excinfo.value,
                                                                  GpuMemoryLimitExceeded):
            rep.longrepr = call.excinfo.getrepr(style="value")
