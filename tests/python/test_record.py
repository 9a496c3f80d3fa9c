"""memforensics.record without a GPU: the clear refusals, and the history fallback driven by a fake
torch (fake_torch.py) whose snapshots are the repository's sample."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import memforensics
from memforensics import _cli, _record

from fake_torch import FakeTorch


@pytest.fixture(autouse=True)
def no_recording_left(monkeypatch):
    # Whatever this install holds, the tests choose whether a hook exists.
    monkeypatch.setattr(_cli, "build_info", lambda: {})
    yield
    if _record._active is not None:
        _record._active._stopped = True
        _record._active = None


def test_without_pytorch_record_says_so(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    with pytest.raises(memforensics.MemforensicsError, match="needs PyTorch"):
        memforensics.record(tmp_path / "run.bin")
    assert not (tmp_path / "run.bin").exists()


def test_without_cuda_record_says_so(monkeypatch, tmp_path, sample):
    monkeypatch.setitem(sys.modules, "torch", FakeTorch(sample, cuda=False))
    with pytest.raises(memforensics.MemforensicsError,
                       match=r"needs a CUDA device, and torch.cuda.is_available\(\) is False"):
        with memforensics.record(tmp_path / "run.bin"):
            pass


def test_history_fallback_writes_a_native_trace_at_stop(monkeypatch, tmp_path, sample, capfd):
    torch = FakeTorch(sample)
    monkeypatch.setitem(sys.modules, "torch", torch)
    out = tmp_path / "run.bin"
    with memforensics.record(out) as rec:
        assert rec.method == "history"
        assert "no LibTorch hook" in rec.reason or "built for torch" in rec.reason
        assert memforensics.record.__module__ == "memforensics._record"
    assert "_record_memory_history" in capfd.readouterr().err
    kw = [c[2] for c in torch.calls if c[0] == "_record_memory_history"]
    assert kw[0] == {"max_entries": 1_000_000, "context": "all", "stacks": "python"}
    assert kw[-1] == {"enabled": None}
    assert out.read_bytes()[:4] != b"\x80\x04"  # converted: not the pickle
    assert memforensics.analyze(out).devices == memforensics.analyze(sample).devices
    assert rec.stop() == str(out)  # idempotent
    assert memforensics.stop() is None


def test_history_fallback_with_torch_2_0s_signature(monkeypatch, tmp_path, sample):
    torch = FakeTorch(sample, legacy=True)
    monkeypatch.setitem(sys.modules, "torch", torch)
    with memforensics.record(tmp_path / "old.pickle", max_entries=5000):
        pass
    calls = [c[1:] for c in torch.calls if c[0] == "_record_memory_history"]
    assert calls == [((True,), {"record_context": True, "trace_alloc_max_entries": 5000,
                                "trace_alloc_record_context": True}), ((False,), {})]


def test_history_fallback_writes_at_an_oom(monkeypatch, tmp_path, sample):
    torch = FakeTorch(sample)
    monkeypatch.setitem(sys.modules, "torch", torch)
    out = tmp_path / "oom.pickle"
    rec = memforensics.start(out, stacks=False)
    history = [c for c in torch.calls if c[0] == "_record_memory_history"]
    assert torch.calls[0] == ("init",) and history[0][2]["context"] is None
    with pytest.raises(memforensics.MemforensicsError, match="already running"):
        memforensics.start(tmp_path / "second.bin")
    assert len(torch.observers) == 1
    torch.observers[0](0, 4 << 30, 0, 0)  # what PyTorch calls inside the failing allocation
    assert rec.ooms_written == 1 and out.read_bytes() == open(sample, "rb").read()
    memforensics.stop()
    torch.observers[0](0, 4 << 30, 0, 0)  # after stop: nothing more
    assert rec.ooms_written == 1


def test_a_hook_built_for_another_torch_is_not_loaded(monkeypatch, tmp_path, sample):
    torch = FakeTorch(sample, version="1.99.0")
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(_cli, "build_info", lambda: {"torch_hook_built_for": "2.11.0"})
    monkeypatch.setattr(_cli, "bin_dir", lambda: tmp_path)
    (tmp_path / "libmemforensics_torch.so").write_bytes(b"")
    with memforensics.record(tmp_path / "run.pickle") as rec:
        assert rec.method == "history"
        assert rec.reason == "the LibTorch hook was built for torch 2.11.0, this is 1.99.0"
    assert not [c for c in torch.calls if c[0] == "load_library"]


def test_the_hook_is_used_for_its_torch_and_a_failed_load_falls_back(monkeypatch, tmp_path, sample):
    monkeypatch.setattr(_cli, "build_info", lambda: {"torch_hook_built_for": "2.11.0+cu130"})
    monkeypatch.setattr(_cli, "bin_dir", lambda: tmp_path)
    (tmp_path / "libmemforensics_torch.so").write_bytes(b"")
    torch = FakeTorch(sample, version="2.11.0+cu128")
    monkeypatch.setitem(sys.modules, "torch", torch)
    with memforensics.record(tmp_path / "a.bin") as rec:
        assert rec.method == "hook" and rec.reason is None
    names = [c[0] for c in torch.calls]
    assert names.index("init") < names.index("load_library") < names.index("hook.start")
    assert ("hook.start", (str(tmp_path / "a.bin"), True, False)) in torch.calls
    assert names[-2:] == ["hook.stop", "_record_memory_history"]
    torch = FakeTorch(sample, version="2.11.0", hook_loads=False)
    monkeypatch.setitem(sys.modules, "torch", torch)
    with memforensics.record(tmp_path / "b.pickle") as rec:
        assert rec.method == "history" and "undefined symbol" in rec.reason
    assert (tmp_path / "b.pickle").exists()
    torch = FakeTorch(sample, version="2.11.0", hook_starts=False)  # the hook said no
    monkeypatch.setitem(sys.modules, "torch", torch)
    with memforensics.record(tmp_path / "c.pickle") as rec:
        assert rec.method == "history" and "returned False" in rec.reason
    assert (tmp_path / "c.pickle").exists()


def test_run_without_pytorch_fails_clearly(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("print('ran')\n")
    r = subprocess.run([sys.executable, "-m", "memforensics", "run", "-o", str(tmp_path / "x.bin"),
                        str(script)], capture_output=True, text=True, cwd=tmp_path)
    if r.returncode == 0:
        pytest.skip("torch with CUDA is importable here")
    assert r.returncode == 2 and ("needs PyTorch" in r.stderr or "needs a CUDA device" in r.stderr)
    assert "ran" not in r.stdout


def test_run_records_a_script_through_the_fallback(tmp_path, sample):
    # A torch.py first on the child interpreter's path puts the fake in place of torch.
    (tmp_path / "torch.py").write_text(
        "import sys\nsys.path.insert(0, %r)\nfrom fake_torch import FakeTorch\n"
        "sys.modules['torch'] = FakeTorch(%r, version='0.0.0.fake')\n" % (str(Path(__file__).parent), sample))
    script = tmp_path / "train.py"
    script.write_text("import sys\nprint('args', sys.argv[1:])\nraise SystemExit(5)\n")
    out = tmp_path / "run.bin"
    r = subprocess.run([sys.executable, "-m", "memforensics", "run", "-o", str(out), str(script), "--lr", "1"],
                       capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert r.returncode == 5, r.stderr
    assert "args ['--lr', '1']" in r.stdout
    assert "recording with PyTorch's _record_memory_history" in r.stderr
    assert json.loads(subprocess.run([_cli.binary(), "analyze", "--json", str(out)], capture_output=True,
                                     text=True).stdout.splitlines()[0])["devices"][0]["events"] == 400


def test_an_unwritable_output_is_refused_before_recording(monkeypatch, tmp_path, sample):
    torch = FakeTorch(sample)
    monkeypatch.setitem(sys.modules, "torch", torch)
    with pytest.raises(memforensics.MemforensicsError, match="the directory .* does not exist"):
        memforensics.record(tmp_path / "missing" / "run.bin")
    with pytest.raises(memforensics.MemforensicsError, match="it is a directory"):
        memforensics.record(tmp_path)
    assert torch.calls == [] and _record._active is None


def test_a_snapshot_that_cannot_be_converted_is_kept_and_stop_keeps_failing(monkeypatch, tmp_path):
    bogus = tmp_path / "bogus.pickle"
    bogus.write_bytes(b"not a snapshot")  # what the fake dumps: the conversion refuses it
    monkeypatch.setitem(sys.modules, "torch", FakeTorch(str(bogus)))
    out = tmp_path / "run.bin"
    rec = memforensics.start(out)
    with pytest.raises(memforensics.MemforensicsError, match="snapshot is kept in .*run.bin.pickle"):
        rec.stop()
    assert (tmp_path / "run.bin.pickle").read_bytes() == b"not a snapshot"
    with pytest.raises(memforensics.MemforensicsError, match="snapshot is kept in"):
        rec.stop()  # still failed, not silently done
    assert not out.exists()


def test_a_history_the_program_turned_on_is_left_alone(monkeypatch, tmp_path, sample):
    torch = FakeTorch(sample)
    monkeypatch.setitem(sys.modules, "torch", torch)
    torch.cuda.memory._record_memory_history(max_entries=100_000)  # the program's own
    with pytest.raises(memforensics.MemforensicsError, match="already on in this process"):
        memforensics.record(tmp_path / "run.bin")
    assert [c for c in torch.calls if c[0] == "_record_memory_history"] == [
        ("_record_memory_history", (), {"max_entries": 100_000})]
    assert torch.history_on and _record._active is None


def _run_lazily(tmp_path, sample, name, code):
    """`python -m memforensics run` of a script in a child interpreter whose torch is the lazy fake
    (a torch.py first on its path); returns (the process, the output's path)."""
    (tmp_path / "torch.py").write_text(
        "import sys\nsys.path.insert(0, %r)\nfrom fake_torch import FakeTorch\n"
        "sys.modules['torch'] = FakeTorch(%r, version='0.0.0.fake', lazy=True)\n"
        % (str(Path(__file__).parent), sample))
    script = tmp_path / name
    script.write_text(code)
    out = tmp_path / "run.bin"
    r = subprocess.run([sys.executable, "-m", "memforensics", "run", "-o", str(out), str(script)],
                       capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(tmp_path)})
    return r, out


def test_run_starts_recording_when_the_script_first_uses_cuda(tmp_path, sample):
    r, out = _run_lazily(
        tmp_path, sample, "train.py",
        "import os, sys, torch\n"
        "torch.calls.append(('script', os.environ.get('PYTORCH_CUDA_ALLOC_CONF')))\n"
        "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'\n"
        "assert not any(c[0] == '_record_memory_history' for c in torch.calls), torch.calls\n"
        "torch.cuda.init()\n"
        "names = [c[0] for c in torch.calls]\n"
        "assert names.index('_record_memory_history') > names.index('script'), names\n"
        "print('recorded after the script began')\n")
    assert r.returncode == 0, r.stderr
    assert "recorded after the script began" in r.stdout
    assert "from the program's first use of CUDA" in r.stderr
    assert memforensics.analyze(out).devices[0].events == 400


def test_run_of_a_script_that_never_uses_cuda_says_nothing_was_recorded(tmp_path, sample):
    r, out = _run_lazily(tmp_path, sample, "cpu.py", "print('cpu only')\n")
    assert r.returncode == 0, r.stderr
    assert "nothing recorded: the program never used CUDA" in r.stderr
    assert not out.exists()


def test_a_lazy_recording_stopped_before_cuda_starts_never_starts(monkeypatch, tmp_path, sample):
    torch = FakeTorch(sample, lazy=True)
    monkeypatch.setitem(sys.modules, "torch", torch)
    rec = _record.start_with_cuda(tmp_path / "run.bin")
    assert rec.method is None and _record._active is rec
    rec.stop()
    torch.cuda.init()  # the program's first CUDA use, after the stop
    assert not [c for c in torch.calls if c[0] == "_record_memory_history"]
    assert not torch.history_on and _record._active is None


def test_a_lazy_recording_that_cannot_start_lets_go_of_the_process(monkeypatch, tmp_path, sample):
    torch = FakeTorch(sample, lazy=True)
    monkeypatch.setitem(sys.modules, "torch", torch)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    rec = _record.start_with_cuda(out_dir / "run.bin")
    out_dir.rmdir()  # gone by the time CUDA starts
    torch.cuda.init()  # no exception into the program's CUDA initialisation
    assert rec.failed_to_start and "does not exist" in rec.reason and rec.method is None
    assert _record._active is None  # another recording may start
    out_dir.mkdir()
    with memforensics.record(out_dir / "again.bin") as again:
        assert again.method == "history"


def test_a_lazy_recording_does_not_start_in_a_forked_child(monkeypatch, tmp_path, sample):
    torch = FakeTorch(sample, lazy=True)
    monkeypatch.setitem(sys.modules, "torch", torch)
    rec = _record.start_with_cuda(tmp_path / "run.bin")
    real_pid = os.getpid()
    monkeypatch.setattr(os, "getpid", lambda: real_pid + 1)  # as in a child forked before CUDA
    torch.cuda.init()
    assert rec.method is None and not torch.history_on


def test_record_initialises_cuda_before_asking_about_the_history(monkeypatch, tmp_path, sample):
    torch = FakeTorch(sample)  # its _cuda_isHistoryEnabled raises before init, as PyTorch's crashes
    monkeypatch.setitem(sys.modules, "torch", torch)
    with memforensics.record(tmp_path / "run.bin") as rec:
        assert rec.method == "history"
