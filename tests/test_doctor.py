import subprocess
import sys

import gpulab


def test_doctor_names_runner_and_simulator():
    done = subprocess.run([sys.executable, "-m", "gpulab", "doctor"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    for expected in ("torch", "numba", "Runner", "collective backend", "mixed precision"):
        assert expected in out
    if gpulab.runner.name == "cpu":
        assert "runner              cpu" in out
        assert "simulator     on" in out
        assert "NVML                not available" in out


def test_doctor_reports_missing_packages_as_problems(monkeypatch):
    from gpulab import doctor

    real_import = __import__

    def no_numba(name, *args, **kwargs):
        if name == "numba":
            raise ImportError("simulated")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr("builtins.__import__", no_numba)
    text, healthy = doctor.report()
    assert not healthy
    assert "numba is missing" in text
