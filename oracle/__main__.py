import sys

from oracle.cli import main

sys.exit(main())
