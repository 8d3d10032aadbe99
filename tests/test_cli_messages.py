"""What the command line says besides its tables: a mistake points at the help of the command
it was made in, a change is told once, and what it prints about jobs is true of them."""

from __future__ import annotations

import argparse

import pytest
from command_line import Run

from synclane import cli


def _commands() -> list[str]:
    parser = cli.parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sorted(commands.choices)


# the options a command needs before it looks at the rest
REQUIRED = {
    "cancel": ["--owner", "globex", "--reason", "gone"],
    "pause": ["--reason", "maintenance"],
    "prune": ["--older-than-days", "30"],
}


@pytest.mark.parametrize("command", _commands())
def test_an_unknown_option_points_at_the_help_of_its_command(run: Run, command: str) -> None:
    code, out, err = run(command, *REQUIRED.get(command, []), "--bogus-flag")
    assert (code, out) == (2, "")
    assert err == (
        "synclane: error: unrecognized arguments: --bogus-flag "
        f"(`synclane {command} --help` helps)\n"
    )


def test_an_unknown_option_before_the_command_points_at_the_main_help(run: Run) -> None:
    code, _, err = run("--bogus-flag", app=False)
    assert code == 2 and err.endswith("(`synclane --help` helps)\n"), err


def test_pause_and_resume_tell_the_change_once(run: Run) -> None:
    """The result on stdout; no log line on stderr that repeats it (with -v it is a detail)."""
    code, out, err = run("pause", "--reason", "warehouse down")
    assert code == 0 and out.count("paused") == 1 and err == ""
    code, out, err = run("resume")
    assert (code, out.strip(), err) == (0, "queue shops resumed", "")
    run("pause", "--reason", "again")
    _, _, verbose = run("resume", "-v")
    assert "queue shops resumed" in verbose


def test_the_readme_lists_every_option_of_every_command() -> None:
    """The README's table of commands names each option `synclane COMMAND --help` shows (the
    options every command takes are said once, above the table)."""
    import re
    from pathlib import Path

    readme = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `synclane (\w+)([^|]*)\|", readme, re.M)
    listed: dict[str, set[str]] = {}
    for name, usage in rows:
        for command, words in re.findall(r"(?:^|synclane )(\w+)?([^·]*)", name + usage):
            listed.setdefault(command or name, set()).update(re.findall(r"--[\w-]+", words))
    parser = cli.parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    common = {o for a in parser._actions for o in a.option_strings}
    for name, command in commands.choices.items():
        options = {
            o for a in command._actions for o in a.option_strings if o.startswith("--")
        } - common
        assert name in listed, f"the README's table has no row for `synclane {name}`"
        assert options <= listed[name], (name, sorted(options - listed[name]))
