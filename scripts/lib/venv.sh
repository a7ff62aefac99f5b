# Sourced by scripts/run, scripts/test and the benchmark scripts: make sure .venv exists and holds
# the project.
# Usage: ensure_venv [EXTRAS]   (EXTRAS like "test,pipeline"; empty for the broker alone)
# Installs only when pyproject.toml, setup.py or the extras asked for changed since the last install.
# A .venv that is a symbolic link (a worktree sharing another checkout's) is never installed into.
# use_checkout ROOT: processes started from here on import ROOT's brokerd.* packages, not those of
# whichever checkout a shared .venv's editable install points at (scripts/lib/pythonpath/README.md).

use_checkout() {
    export PYTHONPATH="$1/scripts/lib/pythonpath${PYTHONPATH:+:$PYTHONPATH}"
}

find_python() {
    for py in python3.13 python3.12 python3.11 python3; do
        if command -v "$py" >/dev/null 2>&1 &&
            "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            echo "$py"; return 0
        fi
    done
    echo "brokerd needs Python >= 3.11 (none found on PATH)" >&2
    return 1
}

ensure_venv() {
    local extras="${1:-}" py hash stamp=".venv/.brokerd-installed"
    if [ ! -x .venv/bin/python ]; then
        py="$(find_python)" || return 1
        echo "creating .venv with $py" >&2
        "$py" -m venv .venv
    fi
    # setup.py too: it says what is compiled (the hot path), and an install built it from that.
    hash="$(cat pyproject.toml setup.py 2>/dev/null | sha256sum | cut -c1-16)"
    # The broker alone is satisfied by any install of this pyproject; extras need their own line.
    if [ -f "$stamp" ] && { [ -z "$extras" ] && grep -q "^$hash " "$stamp" || grep -qx "$hash $extras" "$stamp"; }; then
        compiled_stale || return 0
        echo "the compiled hot path is older than its sources: rebuilding it" >&2
    fi
    if [ -L .venv ]; then
        # A .venv linked from another checkout (a worktree beside the main one) is that checkout's:
        # installing here would point its editable install at this worktree. Build in place instead.
        echo ".venv is a link to another checkout's: not installing; building the compiled path here" >&2
        .venv/bin/python setup.py -q build_ext --inplace >&2
        return
    fi
    echo "installing brokerd into .venv${extras:+ (with $extras)}" >&2
    .venv/bin/python -m pip install -q --disable-pip-version-check -e ".${extras:+[$extras]}" >&2
    grep -s "^$hash " "$stamp" > "$stamp.new" || true
    echo "$hash $extras" >> "$stamp.new"
    mv "$stamp.new" "$stamp"
}

# True when the checkout's compiled hot path (connection/__compiled__) was built from sources that
# have changed since: connection/_compiled.py would run pure Python and warn in every process, so
# ./scripts/run and ./scripts/test build it again instead (as the manifest's SHA-256s say).
compiled_stale() {
    [ -f connection/__compiled__/manifest.json ] || return 1
    BROKERD_PURE=1 PYTHONPATH="scripts/lib/pythonpath" .venv/bin/python - <<'PY' 2>/dev/null
import json, sys
from brokerd.connection import _compiled as c  # BROKERD_PURE: asked, not installed
m = json.load(open("connection/__compiled__/manifest.json"))
sys.exit(0 if c.changed_source(c._ROOT, m["modules"], m["suffix"]) else 1)
PY
}
