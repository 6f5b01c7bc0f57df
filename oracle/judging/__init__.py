"""Judging: per-tile comparisons (compare, compare_fast), the bounds (tolerance), what fed each
comparison (evidence), the verdicts and the first divergence (diagnose), and the stage-by-stage
differential (differential). Makes every number a report prints. May import `oracle.problem`,
`oracle.run` and `kernels_ref`; never `oracle.report`, `oracle.repro` or `oracle.tools`."""
