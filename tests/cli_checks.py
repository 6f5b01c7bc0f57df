"""Checks of how the command line fails, shared by the CLI tests."""

from oracle.tools import cli


def one_error_line(capsys, argv) -> str:
    """Run the CLI with `argv`; it must exit 2 with one `error: ...` line on stderr and no traceback.
    Returns that line."""
    code = cli.main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]
