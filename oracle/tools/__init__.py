"""The tools on top of the library: the Python API (api), the command line (cli) and its warm server
(server), benchmark-and-verify runs (verify, bench, workers, perf, timing), the pytest plugin, the
environment report and the embedded demo. Nothing below imports these."""
