"""The pytest plugin's pass, fail and skip paths, with the recording replaced by the repository's
fabricated sample snapshot (no GPU needed)."""
import pytest

pytest_plugins = ["pytester"]

CONFTEST = '''
import shutil
import memforensics.pytest_plugin as plugin

class Fake:
    def __init__(self, path):
        self.path = path
    def stop(self):
        shutil.copyfile(%r, self.path)   # the "recording" of the test

plugin.cuda_available = lambda: (%r, "gpu_memory: no CUDA device (fake)")
plugin.start_recording = Fake
'''


def write(pytester, sample, cuda=True, body=""):
    pytester.makeconftest(CONFTEST % (sample, cuda))
    pytester.makepyfile(test_gpu=body)


def test_within_limits_passes(pytester, sample):
    write(pytester, sample, body='''
import pytest
@pytest.mark.gpu_memory(max_peak="2 GiB", max_peak_requested=1 << 30)
def test_step():
    pass
''')
    r = pytester.runpytest_subprocess("-q")
    r.assert_outcomes(passed=1)


def test_over_a_limit_fails_with_the_line_and_a_report(pytester, sample, tmp_path):
    write(pytester, sample, body='''
import pytest
@pytest.mark.gpu_memory(max_peak="100 MiB")
def test_peak():
    pass
@pytest.mark.gpu_memory(fail_on="high")
def test_finding():
    pass
def test_unmarked():
    pass
''')
    reports = tmp_path / "reports"
    r = pytester.runpytest_subprocess("-q", f"--gpu-memory-report={reports}")
    r.assert_outcomes(passed=1, failed=2)
    out = r.stdout.str()
    assert "GPU memory limits exceeded" in out
    assert "peak_reserved 610.00 MiB > limit 100.00 MiB" in out
    assert "line: train.py:116 main < train.py:148 <module>" in out
    assert "finding oom_verdict (high)" in out and "line: model.py:37 forward" in out
    pages = sorted(p.name.rsplit("-", 1)[0] for p in reports.iterdir())
    assert pages == ["test_gpu.py_test_finding", "test_gpu.py_test_peak"], pages


def test_a_test_that_fails_by_itself_keeps_its_own_error(pytester, sample):
    write(pytester, sample, body='''
import pytest
@pytest.mark.gpu_memory(max_peak="1 MiB")
def test_broken():
    assert 1 == 2, "own failure"
''')
    r = pytester.runpytest_subprocess("-q")
    r.assert_outcomes(failed=1)
    assert "own failure" in r.stdout.str() and "GPU memory limits" not in r.stdout.str()


def test_without_cuda_marked_tests_are_skipped_with_the_reason(pytester, sample):
    write(pytester, sample, cuda=False, body='''
import pytest
@pytest.mark.gpu_memory(max_peak="1 MiB")
def test_step():
    pass
def test_cpu():
    pass
''')
    r = pytester.runpytest_subprocess("-q", "-rs")
    r.assert_outcomes(passed=1, skipped=1)
    assert "gpu_memory: no CUDA device (fake)" in r.stdout.str()


def test_bad_arguments_are_a_usage_error(pytester, sample):
    write(pytester, sample, body='''
import pytest
@pytest.mark.gpu_memory(max_peek="1 GiB")
def test_step():
    pass
''')
    r = pytester.runpytest_subprocess("-q")
    assert "UsageError: gpu_memory: unknown argument(s) ['max_peek']" in r.stdout.str() + r.stderr.str()
    assert r.ret != 0


def test_no_limit_means_fail_on_high_and_output_is_captured(pytester, sample, tmp_path):
    write(pytester, sample, body='''
import logging, pytest
@pytest.mark.gpu_memory
def test_a():
    print("printed by test_a")
    logging.getLogger().warning("logged by test_a")
def test_b():
    pass
''')
    keep = tmp_path / "keep"
    r = pytester.runpytest_subprocess("-q", f"--gpu-memory-keep={keep}", "-p", "no:cacheprovider")
    r.assert_outcomes(passed=1, failed=1)
    out = r.stdout.str()
    assert "finding oom_verdict (high)" in out
    # pytest's own capture still works around the failure: the test's output is its call's
    assert "Captured stdout call" in out and "printed by test_a" in out
    assert "Captured log call" in out and "logged by test_a" in out
    kept = list(keep.iterdir())
    assert len(kept) == 1 and kept[0].name.startswith("test_gpu.py_test_a-")
    assert f"recording: {kept[0]}" in out


def test_a_fixture_does_not_run_where_the_test_is_skipped(pytester, sample):
    write(pytester, sample, cuda=False, body='''
import pytest
@pytest.fixture
def model():
    raise RuntimeError("fixture ran")
@pytest.mark.gpu_memory(max_peak="1 GiB")
def test_step(model):
    pass
''')
    r = pytester.runpytest_subprocess("-q", "-rs")
    r.assert_outcomes(skipped=1)
    assert "fixture ran" not in r.stdout.str()


def test_the_marker_is_registered(pytester):
    r = pytester.runpytest_subprocess("--markers")
    assert "@pytest.mark.gpu_memory(max_peak=None" in r.stdout.str()


def test_a_failure_after_the_test_keeps_the_verdict_and_the_capture(pytester, sample):
    write(pytester, sample, body='''
import pytest
@pytest.mark.gpu_memory(max_peak="100 MiB")
def test_a():
    print("printed by test_a")
def test_b():
    pass
''')
    (pytester.path / "notadir").write_text("a file where the keep directory should be")
    r = pytester.runpytest_subprocess("-q", "--gpu-memory-keep=notadir", "-p", "no:cacheprovider")
    r.assert_outcomes(passed=1, failed=1)
    out = r.stdout.str()
    assert "peak_reserved 610.00 MiB > limit 100.00 MiB" in out and "recording not kept" in out
    assert "Captured stdout call" in out and "Captured stdout teardown" not in out


def test_xfail_and_junit_see_the_verdict_as_the_tests_failure(pytester, sample):
    write(pytester, sample, body='''
import pytest
@pytest.mark.xfail(reason="known to be over")
@pytest.mark.gpu_memory(max_peak="100 MiB")
def test_over_known():
    pass
@pytest.mark.gpu_memory(max_peak="100 MiB")
def test_over():
    pass
''')
    r = pytester.runpytest_subprocess("-q", "--junitxml=j.xml", "-p", "no:cacheprovider")
    r.assert_outcomes(xfailed=1, failed=1)
    assert r.ret == 1
    xml = (pytester.path / "j.xml").read_text()
    assert xml.count("<failure") == 1 and "GPU memory limits exceeded" in xml
    assert "FAILED test_gpu.py::test_over" in r.stdout.str()


def test_a_recording_that_cannot_start_fails_the_test_alone(pytester, sample):
    pytester.makeconftest(
        "import memforensics.pytest_plugin as plugin\n"
        "plugin.cuda_available = lambda: (True, None)\n"
        "def boom(path):\n    raise RuntimeError('cannot record here')\n"
        "plugin.start_recording = boom\n")
    pytester.makepyfile(test_gpu='''
import pytest
@pytest.mark.gpu_memory(max_peak="1 GiB")
def test_a():
    print("never")
def test_b():
    print("printed by test_b")
    assert False
''')
    r = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    r.assert_outcomes(failed=2)
    out = r.stdout.str()
    assert "cannot record here" in out and "never" not in out and "printed by test_b" in out


def test_the_real_check_skips_without_pytorch(pytester):
    try:
        import torch  # noqa: F401
        pytest.skip("PyTorch is importable here")
    except ImportError:
        pass
    pytester.makepyfile(test_gpu='''
import pytest
@pytest.mark.gpu_memory(max_peak="1 GiB")
def test_step():
    pass
''')
    r = pytester.runpytest_subprocess("-q", "-rs")
    r.assert_outcomes(skipped=1)
    assert "gpu_memory: record() needs PyTorch, which cannot be imported" in r.stdout.str()


def test_unittest_cases_keep_their_own_traceback_and_are_judged(pytester, sample):
    write(pytester, sample, body='''
import unittest
import pytest

class TestCaseStyle(unittest.TestCase):
    @pytest.mark.gpu_memory(max_peak="100 MiB")
    def test_fails_itself(self):
        self.assertEqual(1, 2, "own failure detail")

    @pytest.mark.gpu_memory(max_peak="100 MiB")
    def test_over(self):
        pass
''')
    r = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    r.assert_outcomes(failed=2)
    out = r.stdout.str()
    assert 'self.assertEqual(1, 2, "own failure detail")' in out  # the traceback's source line
    assert out.count("GPU memory limits exceeded") == 1  # only test_over's verdict
    assert "peak_reserved 610.00 MiB > limit 100.00 MiB" in out


def test_marked_tests_are_skipped_while_the_whole_process_is_recorded(pytester, sample):
    pytester.makeconftest(
        "import types\nimport memforensics._record as record\nimport memforensics.pytest_plugin as plugin\n"
        "plugin.cuda_available = lambda: (True, None)\n"
        "record._active = types.SimpleNamespace(path='/tmp/all.bin')  # as under memforensics run\n")
    pytester.makepyfile(test_gpu='''
import pytest
@pytest.mark.gpu_memory(max_peak="1 GiB")
def test_a():
    pass
def test_b():
    pass
''')
    r = pytester.runpytest_subprocess("-q", "-rs", "-p", "no:cacheprovider")
    r.assert_outcomes(passed=1, skipped=1)
    assert "the whole process is being recorded (/tmp/all.bin)" in r.stdout.str()


def test_dash_p_with_the_module_name_loads_the_plugin_once(pytester, sample, monkeypatch):
    write(pytester, sample, body='''
import pytest
@pytest.mark.gpu_memory(max_peak="100 MiB")
def test_peak():
    pass
''')
    r = pytester.runpytest_subprocess("-q", "-p", "memforensics.pytest_plugin")  # and autoloaded
    r.assert_outcomes(failed=1)
    assert "GPU memory limits exceeded" in r.stdout.str()
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # as many CI setups run pytest
    r = pytester.runpytest_subprocess("-q", "-p", "memforensics.pytest_plugin")
    r.assert_outcomes(failed=1)
    assert "GPU memory limits exceeded" in r.stdout.str()
