import sys

from oracle.server import entry

sys.exit(entry())
