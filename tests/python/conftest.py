"""Shared fixtures of the Python package's tests (tests/python/run.sh installs the package into a
fresh venv and runs them against the installed copy)."""
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "snapshots" / "sample_training.pickle"


def pytest_addoption(parser):
    parser.addoption("--real-snapshots", default=str(ROOT.parent / "shared" / "snapshots-real"))
    parser.addoption("--real-traces", default=str(ROOT.parent / "shared" / "traces-real"))


def _real(config, option):
    d = Path(config.getoption(option))
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if p.is_file() and not p.name.startswith(("LICENSE", "README", "SHA256")))


def pytest_generate_tests(metafunc):
    if "real_file" in metafunc.fixturenames:
        files = _real(metafunc.config, "--real-snapshots") + _real(metafunc.config, "--real-traces")
        if files:
            metafunc.parametrize("real_file", files, ids=[p.name for p in files])
        else:
            metafunc.parametrize("real_file", [pytest.param(None, marks=pytest.mark.skip(
                reason="../shared/snapshots-real and traces-real not present"))])


@pytest.fixture
def sample():
    return str(SAMPLE)
