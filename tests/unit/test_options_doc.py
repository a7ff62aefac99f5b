"""docs/configuration.md's option table is the one generated from cluster.config.OPTIONS, and README's
short table of the options operators touch most agrees with it."""

from __future__ import annotations

import os
import re

from brokerd.cluster.config import OPTIONS, build_parser, env_name
from brokerd.cluster.options_doc import DOC, END, START, main, render, replace_section, section, shown_default

REGENERATE = ".venv/bin/python -m brokerd.cluster.options_doc --write"
README = os.path.join(os.path.dirname(DOC), os.pardir, "README.md")


def test_the_configuration_page_table_is_the_generated_one():
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    assert START in text and END in text, f"docs/configuration.md lost its {START} / {END} markers"
    assert section(text) == render(), (
        f"docs/configuration.md's option table differs from cluster/config.py's OPTIONS; regenerate it with: "
        f"{REGENERATE}")


def _readme_rows() -> list[list[str]]:
    """README's short table under *Configuration*: its rows' cells, header and rule left out."""
    with open(README, encoding="utf-8") as f:
        block = f.read().split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in block.splitlines() if line.startswith("| `--")]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in lines]


def test_readmes_short_table_names_real_options_with_their_defaults():
    """A row per option or pair of options; each flag is one of ``OPTIONS`` (or ``--config``), and the
    default README shows is the generated table's, so the short table cannot drift from the code."""
    by_flag = {opt.flag: opt for opt in OPTIONS}
    rows = _readme_rows()
    assert len(rows) >= 15, "README's Configuration section lost its short option table"
    for cells in rows:
        flags = re.findall(r"`(--[a-z-]+)", cells[0])
        assert flags, cells
        for flag in flags:
            if flag == "--config":
                assert cells[1] == "—"
                continue
            assert flag in by_flag, f"README's option table names {flag}, which is no option"
            assert cells[1] == shown_default(by_flag[flag]).replace("|", "\\|"), (
                f"README says {flag} defaults to {cells[1]!r}; the code: {shown_default(by_flag[flag])!r}")


def test_every_option_and_cli_only_flag_has_a_row():
    table = render()
    for opt in OPTIONS:
        assert f"`{opt.flag}" in table and f"`{opt.name}`" in table and f"`{env_name(opt.name)}`" in table
    for action in build_parser()._actions:  # --config and --port live only in build_parser
        for flag in action.option_strings:
            if flag.startswith("--") and flag not in ("--help", "--version"):
                assert f"`{flag}" in table, flag


def test_defaults_do_not_depend_on_the_machine():
    table = render()
    assert "| CPUs it may use |" in table and "| host name |" in table
    assert str(os.cpu_count()) + " |" not in table.split("`BROKERD_WORKERS`")[1].split("\n")[0]
    assert "| 64M |" in table and "| mqtt://127.0.0.1:1883 |" in table


def test_write_rewrites_only_the_section(tmp_path):
    doc = tmp_path / "configuration.md"
    doc.write_text(f"# x\n\nbefore\n\n{START}\n| stale |\n{END}\n\nafter\n")
    assert main(["--write", "--doc", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("# x\n\nbefore\n\n" + START + "\n| option |")
    assert text.endswith(f"{END}\n\nafter\n") and "| stale |" not in text
    assert replace_section(text, render()) == text  # idempotent
