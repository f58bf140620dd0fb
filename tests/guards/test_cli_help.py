"""`conveyor --help` and each command's --help read as help for users: what
the command does, examples, and options with their defaults; no reST
markup, no notes on how the code is tested, paragraphs kept apart."""

from __future__ import annotations

import pytest

from conveyor import cli

#: Words that belong in the source, not in a user's help.
DEVELOPER_WORDS = ("``", ":data:", ":func:", ":class:", "FROM_SYSTEM", "tests ", "docstring")

#: Commands whose help this file checks line by line (tune and pack have their own tests).
COMMANDS = ["demo", "doctor"]


def help_text(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 0
    return capsys.readouterr().out


def test_the_top_level_help_lists_the_commands_and_says_where_to_look_next(capsys):
    text = help_text(["--help"], capsys)
    for name in cli.COMMANDS:
        assert f"\n    {name} " in text, text
    assert "conveyor COMMAND --help" in text


@pytest.mark.parametrize("command", COMMANDS)
def test_a_command_s_help_is_written_for_users(command, capsys):
    text = help_text([command, "--help"], capsys)
    assert not [word for word in DEVELOPER_WORDS if word in text], text
    assert "\n\n" in text.split("options:")[0].split("\n\n", 1)[1], "paragraphs run together"
    assert f"examples:\n  conveyor {command}" in text
    assert all(len(line) <= 80 for line in text.splitlines()), [line for line in text.splitlines() if len(line) > 80]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_says_what_it_is(command):
    _, parsers = cli.build_parser()
    unexplained = [action.dest for action in parsers[command]._actions if not action.help]
    assert not unexplained, f"conveyor {command}: options without help: {unexplained}"
