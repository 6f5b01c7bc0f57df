"""The standalone reproducer (Track B): writing a reproducer folder from a case (generate), its host
program's C++ (files/), and a reproducer's run read back as a recording (readback). May import `oracle.judging`
and below; never `oracle.tools`."""
