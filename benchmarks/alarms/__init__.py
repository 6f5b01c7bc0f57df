"""The parts of benchmarks/false_alarms.py (the driver: its command line and the run), one job a
module; what the benchmark does is in the driver's docstring.

  engines    the cases and the engines that compute them (runners, constraints, shapes, make_cases)
  specs      each case's operands and the ProblemSpec that says what its engine does
  planting   the planted defects and how one is judged
  judging    one case run and judged (run_case, Result), and the zoo's live cases
  results    the tables, the JSON document, reading earlier runs back (merge, skip)
Imports run one way: engines <- specs <- judging <- results; planting reads none of them.
"""
