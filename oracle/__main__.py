"""`python -m oracle` and the `oracle` command: forwarded to a warm server when ORACLE_SERVER names
one (oracle.server), else run here (oracle.cli)."""

import sys

from oracle.server import forward


def entry() -> int:
    code = forward(sys.argv[1:])
    if code is None:
        from oracle.cli import main

        code = main()
    return code


if __name__ == "__main__":
    sys.exit(entry())
