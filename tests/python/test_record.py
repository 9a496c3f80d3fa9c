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
