"""Which checkout's code runs: the tests' and the scripts' (scripts/lib/pythonpath/README.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT


def test_this_checkouts_packages_are_the_ones_imported(tmp_path):
    """The tests and the scripts' brokerd import this checkout's ``brokerd.*`` (through
    scripts/lib/pythonpath), not whichever checkout a shared virtualenv's editable install
    points at: a benchmark from a second worktree measures that worktree's code."""
    import brokerd.cluster

    assert Path(brokerd.cluster.__file__).resolve().is_relative_to(ROOT)
    probe = "import brokerd.cluster, brokerd.router.log; print(brokerd.cluster.__file__); print(brokerd.router.log.__file__)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(["bash", "-c", f'. "{ROOT}/scripts/lib/venv.sh"; use_checkout "{ROOT}"; '
                          f'exec "{sys.executable}" -c "{probe}"'],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env, check=True)
    files = out.stdout.split()
    assert len(files) == 2 and all(f.startswith(str(ROOT / "scripts" / "lib" / "pythonpath")) for f in files), files
    assert all(Path(f).resolve().is_relative_to(ROOT) for f in files)
