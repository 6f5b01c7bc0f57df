"""The epilogue order a traced launch library declares, and the case judged in it.

Data path: the built library's bytes (the oracle's own build, BuildResult.read()) -> declared_order():
the tokens of the text the CUTLASS adapter's entry macro keeps in a traced library
(`oracle_trace:epilogue_order=alpha,bias,beta_c,activation,cast`: its epilogue tree's steps in the
order the tree computes them, harness/include/oracle_trace/cutlass/entry.hpp) -> with_library_order():
a case that declares no `epilogue` gets the tree's order; one that declares another is refused,
naming both.

Constraints: read before the library runs, never loaded here. A step that does nothing in this
problem is left out of the tree's order as its tap is (beta_c where beta is 0: the adapter's trees
turn that tap off). A library without the text (no adapter, an untraced build) declares nothing.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from harness.fields import shown
from kernels_ref import epilogue_graph
from oracle.problem.spec import ProblemSpec, SpecError
from oracle.run.case_types import Case, CaseError

MARKER = b"oracle_trace:epilogue_order="
MAX_ORDER_BYTES = 256  # the text after the marker, to its NUL


def declared_order(library: bytes) -> Optional[tuple[str, ...]]:
    """The epilogue order the library's tree declares, or None where it declares none. CaseError for
    text that is not one order of epilogue tokens (two different orders, no NUL, a bad token)."""
    orders, start = set(), 0
    while (at := library.find(MARKER, start)) >= 0:
        begin = at + len(MARKER)
        end = library.find(b"\0", begin, begin + MAX_ORDER_BYTES)
        if end < 0:
            raise CaseError(f"the library's epilogue order at byte {at} does not end within {MAX_ORDER_BYTES} bytes")
        if end > begin:
            orders.add(library[begin:end])
        start = begin
    if not orders:
        return None
    if len(orders) > 1:
        said = " and ".join(sorted(o.decode("ascii", "replace") for o in orders))
        raise CaseError(f"the library declares {len(orders)} epilogue orders ({said}): one GEMM entry per library")
    text = orders.pop().decode("ascii", "replace")
    tokens = tuple(text.split(","))
    try:
        epilogue_graph.parse(tokens)
    except epilogue_graph.GraphError as e:
        raise CaseError(f"the library's epilogue tree declares {shown(text)}, not an epilogue order: {e}") from None
    return tokens


def tree_order(spec: ProblemSpec, order: tuple[str, ...]) -> tuple[str, ...]:
    """The tree's order as it runs on `spec`: beta_c left out where beta is 0 (the step adds nothing
    and its tap is off)."""
    return tuple(t for t in order if not (t == "beta_c" and spec.beta == 0.0))


def _plain(token: str) -> str:
    return token[:-len(":fp32")] if token.endswith(":fp32") else token


def with_library_order(case: Case, order: Optional[tuple[str, ...]]) -> tuple[Case, Optional[str]]:
    """`case` judged in the order its library's tree declares, and a note saying so (None: the library
    declares none, the case is unchanged). CaseError where the case declares another order, or where
    the problem cannot take the tree's (a bias the problem lacks, say)."""
    if order is None:
        return case, None
    spec = case.spec
    ours = tree_order(spec, order)
    if spec.epilogue is not None:
        if tuple(_plain(t) for t in spec.epilogue) != ours:
            raise CaseError(f"[problem] epilogue = {shown(list(spec.epilogue))} is not the order the library's "
                            f"epilogue tree computes, {shown(list(ours))}: remove epilogue (the tree's order is then "
                            f"used) or declare the tree's")
        return case, f"epilogue order {' > '.join(ours)}: declared by the case and by the library's tree"
    try:
        resolved = replace(spec, epilogue=ours)
    except SpecError as e:
        raise CaseError(f"the library's epilogue tree computes {shown(list(ours))}, which this problem cannot "
                        f"take: {e}") from None
    return replace(case, spec=resolved), f"epilogue order {' > '.join(ours)}: the library's tree's (the case declares none)"
