from click.testing import CliRunner

from relay.cli import main


def test_cli_help_lists_the_program() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    assert "kvcs-relay" in result.output
