"""Old import path of the stage-by-stage differential, kept for other projects: it lives in
`oracle.judging.differential`."""

from oracle.judging.differential import *  # noqa: F401,F403
from oracle.judging.differential import __all__  # noqa: F401
