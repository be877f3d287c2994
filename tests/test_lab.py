"""`make lab` serves JupyterLab: start it headless on a free port, fetch /lab, stop it."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from course_utils.paths import ROOT

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_jupyterlab_starts_and_serves_lab(tmp_path):
    port = free_port()
    lab_args = "--no-browser --ip=127.0.0.1 --ServerApp.token= --ServerApp.password= --LabApp.news_url=None --LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"
    in_make_venv = Path(sys.prefix).resolve() == (ROOT / ".venv").resolve()
    if in_make_venv:  # exactly what the README's `make lab` runs
        cmd = ["make", "lab", f"PORT={port}", f"LAB_ARGS={lab_args}"]
    else:
        cmd = [sys.executable, "-m", "jupyter", "lab", "--notebook-dir=notebooks", f"--port={port}", *lab_args.split()]
        if os.geteuid() == 0:
            cmd.append("--allow-root")
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline, body, status = time.monotonic() + 90, "", None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab", timeout=5) as response:
                    status, body = response.status, response.read().decode("utf-8", "replace")
                    break
            except OSError:
                time.sleep(0.5)
        assert proc.poll() is None, f"the server exited early:\n{proc.stdout.read().decode()[-2000:]}"
        assert status == 200 and "JupyterLab" in body
    finally:
        stop(proc)


def stop(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=20)
            return
        except subprocess.TimeoutExpired:
            continue
