"""The option table of ``docs/configuration.md``, generated from ``cluster.config.OPTIONS``.

Every option is declared once, in ``OPTIONS``; this renders the markdown table docs/configuration.md
shows between ``<!-- options:start -->`` and ``<!-- options:end -->`` (flag, TOML key, environment
variable, default, meaning), and ``tests/unit/test_options_doc.py`` fails when that copy
differs. README keeps a short table of the options operators touch most, whose defaults the same
test holds to these. After changing an option::

    .venv/bin/python -m brokerd.cluster.options_doc --write      # rewrites docs/configuration.md's table in place
    .venv/bin/python -m brokerd.cluster.options_doc              # prints the table

Defaults that depend on the machine are shown as words (``MACHINE_DEFAULTS``), so the table is
the same wherever it is generated: change the words there when such a default changes meaning.
"""

from __future__ import annotations

import argparse
import os
import sys

from .config import OPTIONS, Option, env_name
from .option_values import host_port, on_off, size

START = "<!-- options:start -->"
END = "<!-- options:end -->"
DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "docs", "configuration.md")

MACHINE_DEFAULTS = {"workers": "CPUs it may use", "node_id": "host name"}

# Options of the command line that are not in OPTIONS (cluster.config.build_parser adds them).
_EXTRA_ROWS = (
    ("`--config FILE`", "—", "`BROKERD_CONFIG`", "—", "read options from a TOML file"),
    ("`--port P`", "`port`", "`BROKERD_PORT`", "—", "short for `--listen 127.0.0.1:P` (loopback)"),
)


def _size_text(n: int) -> str:
    for suffix, unit in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= unit and n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


def shown_default(opt: Option) -> str:
    """An option's default as the docs show it (a dash when there is none)."""
    if opt.name in MACHINE_DEFAULTS:
        return MACHINE_DEFAULTS[opt.name]
    d = opt.default
    if d is None or d == ():
        return "—"
    if opt.name == "listen":
        return ", ".join(x.url for x in d)
    if opt.type is host_port:
        return f"{d[0]}:{d[1]}"
    if opt.type is on_off:
        return "on" if d else "off"
    if opt.type is size:
        return _size_text(d)
    if isinstance(d, float):
        return f"{d:g}"
    return str(d)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    """The markdown table of every option, one row each, in OPTIONS' order."""
    rows = ["| option | TOML key | environment | default | meaning |", "| --- | --- | --- | --- | --- |"]
    for row in _EXTRA_ROWS:
        rows.append("| " + " | ".join(row) + " |")
    for opt in OPTIONS:
        flag = f"{opt.flag} {opt.metavar}" if opt.metavar and not opt.choices else opt.flag
        meaning = opt.help
        if opt.choices:
            meaning += f": {', '.join(opt.choices)}"
        if opt.repeat:
            meaning += "; in the environment a comma-separated list, in TOML a list"
        rows.append(f"| `{_cell(flag)}` | `{opt.name}` | `{env_name(opt.name)}` | {_cell(shown_default(opt))} "
                    f"| {_cell(meaning)} |")
    return "\n".join(rows) + "\n"


def replace_section(text: str, table: str) -> str:
    """``text`` with what lies between the markers replaced by ``table``."""
    start = text.index(START) + len(START)
    end = text.index(END, start)
    return text[:start] + "\n" + table + text[end:]


def section(text: str) -> str:
    """What lies between the markers (the table as the page has it)."""
    start = text.index(START) + len(START)
    return text[start:text.index(END, start)].strip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m brokerd.cluster.options_doc", description=__doc__.split("\n")[0])
    p.add_argument("--write", action="store_true", help="rewrite the table in docs/configuration.md between the markers")
    p.add_argument("--doc", default=DOC, help="the page to rewrite (default: this checkout's docs/configuration.md)")
    args = p.parse_args(argv)
    table = render()
    if not args.write:
        sys.stdout.write(table)
        return 0
    with open(args.doc, encoding="utf-8") as f:
        text = f.read()
    new = replace_section(text, table)
    if new != text:
        with open(args.doc, "w", encoding="utf-8") as f:
            f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
