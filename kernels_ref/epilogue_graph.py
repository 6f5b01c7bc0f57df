"""The epilogue graph: which steps a kernel's epilogue takes, in which order, and where it rounds.

Data path: a list of tokens (a case's `[problem] epilogue`, `oracle.check(..., epilogue=[...])`)
-> a tuple of `Node`s, each one step and the type its result is held in before the next step.

A token is a step, optionally followed by `:` and a type the kernel rounds the step's result to:
    "scale"        x * row_scale * col_scale * tensor_scale (each factor the problem has)
    "alpha_beta"   fp32(alpha x) + fp32(beta c)  (alpha and beta * C in one step)
    "alpha"        fp32(alpha x)                  (alpha alone; beta * C is a step of its own)
    "beta_c"       x + fp32(beta c)
    "bias"         x + bias (per row or per column, as the problem says)
    "activation"   the problem's activation
    "cast"         round to the output type (last, no suffix)
    "bias:bf16"    the step, its result rounded (RNE) to bf16 and carried on as that value
Without a suffix a result stays in fp32 (fused). `DEFAULT` is the order every kernel was judged
in before a graph could be declared: scale, alpha_beta, bias, activation, cast.

Constraints (each broken one is a `GraphError` naming the token, the value and what is allowed):
known steps; no step twice; alpha_beta or (alpha and beta_c), not both; cast present, last and
unsuffixed; a suffix one of ROUND_DTYPES. Whether the problem has the step's operand (a bias, a C,
scales, an activation) is the problem's to check (oracle.problem.spec). Pure Python: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from kernels_ref._items import named_strings

STEPS = ("scale", "alpha_beta", "alpha", "beta_c", "bias", "activation", "cast")
DEFAULT = ("scale", "alpha_beta", "bias", "activation", "cast")
ROUND_DTYPES = ("fp32", "fp16", "bf16")  # what a kernel may hold an intermediate in
MAX_NODES = len(STEPS)


class GraphError(ValueError):
    """An epilogue graph that is not valid."""


@dataclass(frozen=True)
class Node:
    """One step of the epilogue and the type its result is rounded to (None: kept in fp32)."""

    step: str
    round: Optional[str] = None

    def __post_init__(self) -> None:
        if self.step not in STEPS:
            raise GraphError(f"epilogue step {self.step!r} is unknown; allowed: {', '.join(STEPS)}")
        if self.round is not None and self.round not in ROUND_DTYPES:
            raise GraphError(f"epilogue step {self.step!r}: rounding to {self.round!r} is not allowed; allowed: "
                             f"{', '.join(ROUND_DTYPES)}")

    @property
    def stage(self) -> str:
        """The tap stage that holds this node's result (harness.taps)."""
        return f"epilogue_{self.step}"

    @property
    def rounds(self) -> bool:
        """Does the kernel round this node's result to a narrower type than fp32?"""
        return self.round not in (None, "fp32")

    @property
    def token(self) -> str:
        return self.step if self.round is None else f"{self.step}:{self.round}"


def parse(tokens: Any, field: str = "epilogue") -> tuple[Node, ...]:
    """Tokens -> nodes, checking the rules that do not depend on the problem."""
    if isinstance(tokens, str) or not isinstance(tokens, (list, tuple)) or not tokens:
        raise GraphError(f"{field}={tokens!r} is not allowed: give a non-empty list of steps such as "
                         f"{list(DEFAULT)} (steps: {', '.join(STEPS)}; a step may end in ':fp16' or ':bf16')")
    if len(tokens) > MAX_NODES:
        raise GraphError(f"{field} has {len(tokens)} steps; at most {MAX_NODES} (each of {', '.join(STEPS)} once)")
    nodes = []
    for where, tok in named_strings(tokens, field, GraphError, f"a step name, one of {', '.join(STEPS)}"):
        step, sep, rnd = tok.strip().partition(":")
        step, rnd = step.strip(), rnd.strip()
        if step not in STEPS:
            raise GraphError(f"{where}: step {step!r} is unknown; allowed: {', '.join(STEPS)}")
        if sep and rnd not in ROUND_DTYPES:
            raise GraphError(f"{where}: rounding to {rnd!r} is not allowed; allowed: {', '.join(ROUND_DTYPES)} "
                             f"(no suffix: the result stays in fp32)")
        nodes.append(Node(step, rnd if sep else None))
    steps = [n.step for n in nodes]
    for i, s in enumerate(steps):
        if s in steps[:i]:
            raise GraphError(f"{field}[{i}]={tokens[i]!r}: step {s!r} is given twice; each step at most once")
    if "alpha_beta" in steps and ("alpha" in steps or "beta_c" in steps):
        other = "alpha" if "alpha" in steps else "beta_c"
        raise GraphError(f"{field}[{steps.index(other)}]={tokens[steps.index(other)]!r}: alpha_beta already applies "
                         f"alpha and beta * C; give either alpha_beta or alpha and beta_c")
    if "cast" not in steps:
        raise GraphError(f"{field}={list(tokens)!r} has no 'cast': the graph must end in cast (the rounding to "
                         f"out_dtype before the store)")
    if steps[-1] != "cast":
        i = steps.index("cast")
        raise GraphError(f"{field}[{i}]={tokens[i]!r}: cast must be the last step (the store follows it), but "
                         f"{', '.join(map(repr, steps[i + 1:]))} come(s) after it")
    if nodes[-1].round is not None:
        raise GraphError(f"{field}[{len(nodes) - 1}]={tokens[-1]!r}: cast rounds to out_dtype; it takes no suffix")
    return tuple(nodes)


DEFAULT_NODES = parse(DEFAULT)


def in_default_order(nodes: tuple[Node, ...]) -> bool:
    """Does this graph compute what DEFAULT computes, bit for bit, given that every step it leaves
    out does nothing? (No rounding between steps; alpha, beta_c or alpha then beta_c side by side
    stand for alpha_beta; the steps in DEFAULT's order.)"""
    if any(n.rounds for n in nodes[:-1]):
        return False
    steps = [n.step for n in nodes]
    if "alpha" in steps and "beta_c" in steps:
        if steps.index("beta_c") != steps.index("alpha") + 1:
            return False
        steps.remove("beta_c")
    steps = ["alpha_beta" if s in ("alpha", "beta_c") else s for s in steps]
    it = iter(DEFAULT)
    return all(s in it for s in steps)  # a subsequence of DEFAULT


def tokens(nodes: tuple[Node, ...]) -> tuple[str, ...]:
    return tuple(n.token for n in nodes)
