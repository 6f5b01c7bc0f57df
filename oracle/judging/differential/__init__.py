"""The differential: every stage's reference run on the kernel's own data, teacher-forced and
chained, and the first divergent stage with the evidence behind it.

- geometry, tap_index, device_operands: what the stages read, each built once and frozen (the
  tile geometry and partitions, the taps indexed, the tensors on the reference device); context
  bundles them;
- judge: how one comparison is judged, and the notes a stage returns (StageNotes);
- operands: descriptor_a/b and load_a/b; mma: the accumulator per k-block; epilogue: the
  sub-steps, the store and the reference pipeline over the whole output;
- cross_check: the Triton references against their float64 host specs;
- findings: the first divergence, VERDICT or DRAFT, confounds and what was not observed;
- analysis: `analyze(recording)` joins them.
"""

from oracle.judging.differential.analysis import Analysis, analyze, expected_output, reference_device
from oracle.judging.differential.context import StageResult
from oracle.judging.differential.findings import FirstDivergence

__all__ = ["Analysis", "FirstDivergence", "StageResult", "analyze", "expected_output", "reference_device"]
