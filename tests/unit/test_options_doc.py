"""README's option table is the one generated from cluster.config.OPTIONS."""

from __future__ import annotations

import os

from brokerd.cluster.config import OPTIONS, build_parser, env_name
from brokerd.cluster.options_doc import END, README, START, main, render, replace_section, section

REGENERATE = ".venv/bin/python -m brokerd.cluster.options_doc --write"


def test_readme_table_is_the_generated_one():
    with open(README, encoding="utf-8") as f:
        text = f.read()
    assert START in text and END in text, f"README.md lost its {START} / {END} markers"
    assert section(text) == render(), (
        f"README.md's option table differs from cluster/config.py's OPTIONS; regenerate it with: {REGENERATE}")


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
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n\n{START}\n| stale |\n{END}\n\nafter\n")
    assert main(["--write", "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("# x\n\nbefore\n\n" + START + "\n| option |")
    assert text.endswith(f"{END}\n\nafter\n") and "| stale |" not in text
    assert replace_section(text, render()) == text  # idempotent
