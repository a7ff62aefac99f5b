"""The wheel, installed in a fresh virtualenv outside the checkout: one import namespace (brokerd.*),
working brokerd and brokerd-pipeline commands, and a clear word when the pipeline extra is missing.

No network: the wheel is built without build isolation, and the fresh virtualenv takes brokerd's
dependencies from the test virtualenv's site-packages (a .pth line), not from an index.

The wheel is pure Python (``BROKERD_PURE=1``): what is tested here is the layout and the commands,
and compiling the hot path again took 100-200 s of a loaded CI box inside the suite (the suite
itself runs on the compiled build the install made). ``BROKERD_TEST_WHEEL=compiled`` builds it
compiled and checks that the installed broker runs the compiled path outside the checkout (a
wheel built once runs without a compiler): ``.ci/run`` does that once after the suite.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest

from brokerd.cluster import __version__
from tests.helpers import ROOT, Client, free_port

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="brokerd is Linux-only")


class Installed:
    def __init__(self, bin_dir: Path, wheel: Path) -> None:
        self.bin = bin_dir
        self.wheel = wheel

    def __truediv__(self, name: str) -> Path:
        return self.bin / name


COMPILED = os.environ.get("BROKERD_TEST_WHEEL", "pure") == "compiled"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    """A fresh virtualenv with the wheel installed (its bin directory, and the wheel)."""
    tmp = tmp_path_factory.mktemp("pkg")
    dist = tmp / "dist"
    build_env = {**os.environ, "BROKERD_PURE": "0" if COMPILED else "1"}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(dist), str(ROOT)], check=True, timeout=600, cwd=tmp, env=build_env)
    wheels = list(dist.glob("brokerd-*.whl"))
    assert len(wheels) == 1, wheels
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    purelib = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             check=True, capture_output=True, text=True, timeout=30).stdout.strip()
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", "--no-index", str(wheels[0])], check=True, timeout=300, env=_env())
    # Only now the dependencies (pip would otherwise see the test virtualenv's brokerd, installed).
    deps = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    Path(purelib, "zz_test_deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    return Installed(venv / "bin", wheels[0])


def _env() -> dict[str, str]:
    """The environment of a user's shell: no PYTHONPATH pointing into the checkout."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_the_wheel_installs_one_namespace_and_nothing_else(installed):
    names = zipfile.ZipFile(installed.wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"brokerd", f"brokerd-{__version__}.dist-info"}, tops
    assert "brokerd/cluster/cli.py" in names and "brokerd/pipeline/source.py" in names
    where = subprocess.run([str(installed / "python"), "-c", "import brokerd.cluster; print(brokerd.cluster.__file__)"],
                           capture_output=True, text=True, timeout=30, env=_env(), cwd="/").stdout
    assert where.startswith(str(installed.bin.parent)), f"imported from {where}, not from the virtualenv"


def test_the_installed_brokerd_serves(installed, tmp_path):
    out = subprocess.run([str(installed / "brokerd"), "--version"], capture_output=True, text=True, timeout=30,
                         env=_env(), cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == f"brokerd {__version__}"
    port = free_port()
    log = tmp_path / "brokerd.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([str(installed / "brokerd"), "--workers", "1", "--listen", f"127.0.0.1:{port}",
                                 "--log", "off", "--node-id", "pkg"], stdout=f, stderr=subprocess.STDOUT,
                                env=_env(), cwd=tmp_path)
    try:
        deadline = time.monotonic() + 30
        while b"brokerd ready" not in log.read_bytes():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "no ready line within 30 s"
            time.sleep(0.05)
        ready = next(line for line in log.read_text().splitlines() if "brokerd ready" in line)
        assert f"({'compiled' if COMPILED else 'pure Python'})" in ready, ready
        sub = Client(port, "pkg-sub").connect()
        sub.subscribe("pkg/t", 1)
        Client(port, "pkg-pub").connect().publish("pkg/t", b"from the wheel", qos=1)
        assert sub.wait_topic("pkg/t").payload == b"from the wheel"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0


def test_brokerd_pipeline_runs_and_names_the_missing_extra(installed, tmp_path):
    ok = subprocess.run([str(installed / "brokerd-pipeline"), "--help"], capture_output=True, text=True,
                        timeout=60, env=_env(), cwd=tmp_path)
    assert ok.returncode == 0 and "traffic" in ok.stdout
    # Without the extra: a pyarrow that is not there (a stub that fails to import, first on the path).
    stub = tmp_path / "stub" / "pyarrow"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'pyarrow'\", name='pyarrow')\n")
    missing = subprocess.run([str(installed / "brokerd-pipeline"), "traffic", "--data-dir", str(tmp_path)],
                             capture_output=True, text=True, timeout=60, cwd=tmp_path,
                             env={**_env(), "PYTHONPATH": str(tmp_path / "stub")})
    assert missing.returncode == 2, missing.stderr
    assert "pip install 'brokerd[pipeline]'" in missing.stderr and "Traceback" not in missing.stderr
