"""Recording a Python process's CUDA memory: the LibTorch hook when it was built for this torch,
else PyTorch's own allocator history (docs/python.md)."""
import atexit
import os
import pickle
import shutil
import sys
import tempfile
from pathlib import Path

from . import _cli

_active = None  # the one Recording of this process


def _say(msg):
    if os.environ.get("MEMFORENSICS_QUIET", "0") in ("", "0"):
        print(f"memforensics: {msg}", file=sys.stderr, flush=True)


def _base_version(v):
    return str(v).split("+", 1)[0]


def _torch_module():
    """torch, or the refusal to record without it (nothing about CUDA is asked: that would
    initialise the driver)."""
    try:
        import torch
    except ImportError as e:
        raise _cli.MemforensicsError(f"record() needs PyTorch, which cannot be imported ({e})") from None
    return torch


def _refuse_if_active():
    if _active is not None:
        raise _cli.MemforensicsError(f"a recording is already running ({_active.path})")


def _import_torch():
    torch = _torch_module()
    if not torch.cuda.is_available():
        raise _cli.MemforensicsError(
            "record() needs a CUDA device, and torch.cuda.is_available() is False here "
            f"(torch {torch.__version__}, CUDA {torch.version.cuda}): nothing to record. To analyse "
            "a snapshot recorded elsewhere, use memforensics.analyze(path)")
    return torch


def _check_output(path):
    """Refuses, before anything is recorded, a path the recording could not be written to."""
    d = os.path.dirname(path)
    if os.path.isdir(path):
        raise _cli.MemforensicsError(f"cannot record to {path}: it is a directory")
    if not os.path.isdir(d):
        raise _cli.MemforensicsError(f"cannot record to {path}: the directory {d} does not exist")
    if not os.access(d, os.W_OK | os.X_OK):
        raise _cli.MemforensicsError(f"cannot record to {path}: the directory {d} is not writable")


def _refuse_if_history_on(torch):
    """record() sets PyTorch's history up its own way and switches it off at stop, which would
    change and then clear a history the program turned on itself: refused instead."""
    enabled = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    if enabled is not None and enabled():
        raise _cli.MemforensicsError(
            "PyTorch's memory history (torch.cuda.memory._record_memory_history) is already on in "
            "this process: recording would change its settings and switch it off at stop. Switch "
            "it off first (_record_memory_history(enabled=None)), or keep using it on its own")


def _hook_library(torch):
    """(path of the LibTorch hook, None) when it was built for this torch, else (None, why not)."""
    lib = _cli.bin_dir() / "libmemforensics_torch.so"
    built_for = _cli.build_info().get("torch_hook_built_for")
    if not lib.exists() or not built_for:
        return None, "this install has no LibTorch hook (built without a CUDA PyTorch)"
    if _base_version(built_for) != _base_version(torch.__version__):
        return None, f"the LibTorch hook was built for torch {built_for}, this is {torch.__version__}"
    return lib, None


class Recording:
    """One recording: ``method`` is "hook" (every allocator event streamed to a native trace) or
    "history" (PyTorch's _record_memory_history ring, written at stop, at exit and at an OOM);
    ``reason`` says why the hook was not used."""

    def __init__(self, path, stacks, native_stacks, max_entries):
        self.path = str(Path(path).resolve())
        self.stacks = stacks
        self.native_stacks = native_stacks
        self.max_entries = max_entries
        self.method = None
        self.reason = None
        self.ooms_written = 0
        self._torch = None
        self._stopped = False
        self._legacy = False
        self._failure = None  # why stop() could not finish the file (raised again by a later stop)
        self.failed_to_start = False  # start_with_cuda: CUDA started, the recording could not

    # -- start
    def _start(self):
        _check_output(self.path)
        torch = self._torch = _import_torch()
        # The allocator exists only once CUDA is initialised: asking it about its history before
        # reads a device's allocator that is not there yet.
        torch.cuda.init()
        _refuse_if_history_on(torch)
        lib, self.reason = _hook_library(torch)
        if lib is not None:
            try:
                torch.cuda.init()
                if self.stacks:  # PyTorch gathers the Python stack; the hook keeps it
                    torch.cuda.memory._record_memory_history(
                        context="alloc", stacks="python", max_entries=1)
                torch.ops.load_library(str(lib))
                # The hook reports a failure (an unwritable path, a recording already started
                # by MEMFORENSICS_OUT) on stderr and returns False.
                if not torch.ops.memforensics.start(self.path, self.stacks, self.native_stacks):
                    raise RuntimeError("torch.ops.memforensics.start returned False (see stderr)")
                self.method = "hook"
                _say(f"recording with the LibTorch hook to {self.path}")
                return
            except (OSError, RuntimeError, AttributeError) as e:
                self.reason = f"the LibTorch hook did not start ({e})"
        self._start_history(torch)

    def _start_history(self, torch):
        # The allocator must exist before the OOM observer is attached (torch 2.0 crashes
        # otherwise) and before the history is switched on.
        torch.cuda.init()
        kw = {"max_entries": self.max_entries}
        if self.stacks:
            kw.update(context="all", stacks="all" if self.native_stacks else "python")
        else:
            kw.update(context=None)
        try:
            torch.cuda.memory._record_memory_history(**kw)
        except TypeError:  # torch 2.0: the older signature
            torch.cuda.memory._record_memory_history(
                True, record_context=self.stacks, trace_alloc_max_entries=self.max_entries,
                trace_alloc_record_context=self.stacks)
            self._legacy = True
        torch._C._cuda_attach_out_of_memory_observer(self._on_oom)
        self.method = "history"
        _say(f"recording with PyTorch's _record_memory_history ({self.max_entries} entries; "
             f"{self.reason}); the snapshot is written to {self.path} at stop, at exit and at an OOM")

    # -- writing (history)
    def _dump(self, path):
        memory = self._torch.cuda.memory
        if hasattr(memory, "_dump_snapshot"):
            memory._dump_snapshot(path)
        else:  # torch 2.0: the snapshot as a dict
            with open(path, "wb") as f:
                pickle.dump(memory._snapshot(), f)

    def _write_history(self):
        if self.path.endswith((".pickle", ".pkl")):
            self._dump(self.path)
            return
        with tempfile.TemporaryDirectory(prefix="memforensics-") as tmp:
            pkl = os.path.join(tmp, "snapshot.pickle")
            self._dump(pkl)
            try:
                _cli.run(["convert", pkl, "--to", "native", "-o", self.path])
            except _cli.MemforensicsError as e:
                kept = _keep_snapshot(pkl, self.path)
                where = f"; PyTorch's snapshot is kept in {kept}" if kept else ""
                raise _cli.MemforensicsError(f"{e}{where}") from None

    def _on_oom(self, device, alloc, device_alloc, device_free):
        if self._stopped or self.method != "history":
            return
        try:
            self._write_history()
            self.ooms_written += 1
            _say(f"out of memory on cuda:{device}: snapshot written to {self.path}")
        except Exception as e:  # never raise inside the allocator's failure path
            _say(f"out of memory on cuda:{device}: the snapshot could not be written ({e})")

    # -- stop
    def stop(self):
        """Ends the recording and finishes the file; returns its path. Idempotent."""
        global _active
        if self._stopped:
            if self._failure:
                raise _cli.MemforensicsError(self._failure)
            return self.path
        self._stopped = True
        if _active is self:
            _active = None
        atexit.unregister(self.stop)
        if self.method is None:  # never started (start_with_cuda, and CUDA was never used)
            return self.path
        torch = self._torch
        try:
            if self.method == "hook":
                if not torch.ops.memforensics.stop():
                    raise _cli.MemforensicsError(
                        f"the LibTorch hook could not finish {self.path} (see stderr)")
            elif self.method == "history":
                self._write_history()
        except Exception as e:
            self._failure = str(e)
            raise
        finally:  # the history is switched off even when the file could not be written
            if self.method == "history" or (self.method == "hook" and self.stacks):
                if self._legacy:
                    torch.cuda.memory._record_memory_history(False)
                else:
                    torch.cuda.memory._record_memory_history(enabled=None)
        return self.path

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def __repr__(self):
        state = "stopped" if self._stopped else "recording"
        return f"<memforensics.Recording {self.method} {self.path!r} {state}>"


def _keep_snapshot(pkl, path):
    """Moves a snapshot that could not be converted next to ``path`` (else into the temporary
    directory) so that the recording is not lost; returns where it went, None when it could not."""
    for dest in (path + ".pickle", None):
        try:
            if dest is None:
                fd, dest = tempfile.mkstemp(prefix="memforensics-", suffix=".pickle")
                os.close(fd)
            shutil.move(pkl, dest)
            return dest
        except OSError:
            continue
    return None


def start(path="memforensics.bin", stacks=True, native_stacks=False, max_entries=1_000_000):
    """Starts recording this process's CUDA memory to ``path`` (a native trace; a name ending in
    .pickle keeps PyTorch's snapshot format when the history fallback is used). Returns the
    Recording; raises MemforensicsError without PyTorch or a CUDA device, or when a recording is
    already running. Stopped at exit if ``stop()`` was not called."""
    global _active
    _refuse_if_active()
    rec = Recording(path, stacks, native_stacks, max_entries)
    rec._start()
    _active = rec
    atexit.register(rec.stop)
    return rec


def start_with_cuda(path, stacks=True, native_stacks=False, max_entries=1_000_000):
    """For `run`: a recording that starts when the program first initialises CUDA (now, if it
    already has), so that what a script sets before its first CUDA call (CUDA_VISIBLE_DEVICES,
    PYTORCH_CUDA_ALLOC_CONF) still applies, as it would without memforensics. Returns the
    Recording; its ``method`` stays None while CUDA is not initialised (and for good when the
    recording could not start then: ``reason`` says why)."""
    global _active
    _refuse_if_active()
    torch = _torch_module()
    lazy_call = getattr(torch.cuda, "_lazy_call", None)
    initialized = getattr(torch.cuda, "is_initialized", None)
    if lazy_call is None or initialized is None or initialized():
        return start(path, stacks, native_stacks, max_entries)
    rec = Recording(path, stacks, native_stacks, max_entries)
    _check_output(rec.path)  # refused now, before the program runs, not at its first CUDA call
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        # a CPU-only build: known without initialising anything
        raise _cli.MemforensicsError(
            f"record() needs a CUDA device, and this torch {torch.__version__} is built without CUDA")
    pid = os.getpid()

    def begin():  # inside torch.cuda's initialisation: an exception here would break the program
        global _active
        # Not in a process forked before CUDA started (its queued calls are the parent's), and
        # not once the recording was stopped.
        if os.getpid() != pid or rec._stopped:
            return
        try:
            rec._start()
        except Exception as e:  # noqa: BLE001
            rec.reason = f"the recording did not start when CUDA did ({e})"
            rec.failed_to_start = True
            _say(rec.reason)
            if _active is rec:
                _active = None
            atexit.unregister(rec.stop)

    _active = rec
    atexit.register(rec.stop)
    lazy_call(begin)
    _say(f"recording to {rec.path} from the program's first use of CUDA")
    return rec


def stop():
    """Stops the running recording; returns its path, or None when none runs."""
    return _active.stop() if _active is not None else None


def record(path="memforensics.bin", stacks=True, native_stacks=False, max_entries=1_000_000):
    """``with memforensics.record("run.bin"):`` records the block's CUDA memory (see start)."""
    return start(path, stacks, native_stacks, max_entries)
