"""`python -m oracle` and the `oracle` command: forwarded to a warm server when ORACLE_SERVER names
one (oracle.tools.server), else run here (oracle.tools.cli)."""

import sys

from oracle.tools.server import forward


def entry() -> int:
    code = forward(sys.argv[1:])
    if code is None:
        from oracle.tools.cli import main

        code = main()
    return code


if __name__ == "__main__":
    sys.exit(entry())
