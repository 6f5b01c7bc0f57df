"""Old import path of the recording, kept for other projects: it lives in `oracle.run.recording`."""

from oracle.run.recording import *  # noqa: F401,F403
