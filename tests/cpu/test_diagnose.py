"""The verdict logic is a pure function: table-driven tests."""

import pytest

from oracle.judging.compare import Status
from oracle.judging.diagnose import Diagnosis, Kind, StageOutcome, Verdict, evidence_kind, first_divergence

M, X, N, T = Status.MATCH, Status.MISMATCH, Status.NOT_RUN, Status.MISTRUSTED
NAMES = ["descriptor_a", "load_a", "mma", "epilogue_cast", "epilogue_store"]


def outcomes(*pairs):
    return [StageOutcome(n, tf, ch) for n, (tf, ch) in zip(NAMES, pairs)]


@pytest.mark.parametrize("pairs, verdict, stage, root", [
    # everything right
    ([(M, M), (M, M), (M, M), (M, M), (M, M)], Verdict.MATCH, None, False),
    # mma wrong on its own inputs; downstream only inherits
    ([(M, M), (M, M), (X, X), (M, X), (M, X)], Verdict.DIVERGED, "mma", True),
    # root cause at load even though later stages also fail teacher-forced
    ([(M, M), (X, X), (X, X), (M, X), (M, X)], Verdict.DIVERGED, "load_a", True),
    # a teacher-forced mismatch whose chained comparison passes is still the root cause
    ([(M, M), (M, M), (M, M), (X, M), (M, M)], Verdict.DIVERGED, "epilogue_cast", True),
    # no taps at all: only the output is compared, and it diverges -> located at the output, not root
    ([(N, N), (N, N), (N, N), (N, N), (N, X)], Verdict.DIVERGED, "epilogue_store", False),
    # right on its own inputs but inherits from an untapped upstream
    ([(N, N), (N, N), (M, X), (M, X), (M, X)], Verdict.DIVERGED, "mma", False),
    # nothing could be compared meaningfully
    ([(N, N), (N, N), (N, N), (N, N), (N, T)], Verdict.MISTRUSTED, None, False),
    ([(N, N), (N, N), (N, N), (N, N), (N, N)], Verdict.MISTRUSTED, None, False),
    # taps match, final output is trivially zero -> mistrusted, not passed
    ([(M, M), (M, M), (M, M), (N, N), (N, T)], Verdict.MISTRUSTED, None, False),
])
def test_first_divergence(pairs, verdict, stage, root):
    d = first_divergence(outcomes(*pairs))
    assert d.verdict is verdict
    assert d.stage == stage
    assert d.root_cause is root


def test_inherited_lists_downstream_chained_failures():
    d = first_divergence(outcomes((M, M), (M, M), (X, X), (M, X), (M, X)))
    assert d.inherited == ("epilogue_cast", "epilogue_store")


def test_kernel_error_and_untrusted_take_precedence():
    bad = outcomes((X, X), (M, M), (M, M), (M, M), (M, M))
    assert first_divergence(bad, kernel_error=True).verdict is Verdict.KERNEL_ERROR
    assert first_divergence(bad, references_trusted=False).verdict is Verdict.ORACLE_UNTRUSTED


@pytest.mark.parametrize("root, controlled, confounds, kind", [
    (True, True, [], Kind.VERDICT),
    (True, False, [], Kind.DRAFT),
    (True, True, ["runtime-gated taps"], Kind.DRAFT),
    (False, True, [], Kind.DRAFT),
])
def test_evidence_kind(root, controlled, confounds, kind):
    d = Diagnosis(Verdict.DIVERGED, "mma", root)
    assert evidence_kind(d, inputs_controlled=controlled, confounds=confounds) is kind
