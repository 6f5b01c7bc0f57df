"""The small arithmetic a case may write for sizes, grids and literals: numbers, names, + - * //,
unary minus, min, max and cdiv over the problem's sizes and num_sms.

Constraints: nothing else is evaluated; every value stays finite and within MAX_VALUE; any failure
is a CaseError naming where the expression stands.
"""

from __future__ import annotations

import ast
import math
from typing import Mapping, Union

from harness.fields import shown
from oracle.run.case_types import CaseError

MAX_EXPRESSION_CHARS = 512
MAX_VALUE = 2**64  # an expression's integers stay within this magnitude (a launch argument has 64 bits)


def device_sms() -> int:
    """The GPU's multiprocessor count (`num_sms` in expressions); 132, an H200's, without a GPU."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).multi_processor_count
    return 132


def _cdiv(a, b):
    return -(-a // b)


_FUNCS = {"min": (min, 2, None), "max": (max, 2, None), "cdiv": (_cdiv, 2, 2)}  # name: (function, least, most args)
_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
        ast.FloorDiv: lambda a, b: a // b}


def evaluate(expr: Union[str, int, float], names: Mapping[str, int], where: str) -> Union[int, float]:
    """Evaluate a small arithmetic expression over known names; nothing else is allowed.

    Numbers, names, + - * //, unary minus, min(a, b, ...), max(a, b, ...) and cdiv(a, b); at most
    MAX_EXPRESSION_CHARS characters; every value finite, every integer within MAX_VALUE in
    magnitude; a division by zero is named. Any failure is a CaseError naming `where` and the expression."""
    if isinstance(expr, (int, float)) and not isinstance(expr, bool):
        return _checked(expr, expr, where)
    if not isinstance(expr, str):
        raise CaseError(f"{where}: {shown(expr)} is not a number or an expression")
    if len(expr) > MAX_EXPRESSION_CHARS:
        raise CaseError(f"{where}: the expression {shown(expr)} has {len(expr)} characters; at most "
                        f"{MAX_EXPRESSION_CHARS} are allowed")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CaseError(f"{where}: {shown(expr)} is not a valid expression") from None

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return _checked(node.value, expr, where)
        if isinstance(node, ast.Name):
            if node.id not in names:
                raise CaseError(f"{where}: unknown name {node.id!r} in {shown(expr)}; known: {', '.join(sorted(names))}")
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.FloorDiv) and b == 0:
                raise CaseError(f"{where}: {shown(expr)} divides by zero")
            return _checked(_OPS[type(node.op)](a, b), expr, where)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS \
                and not node.keywords:
            fn, least, most = _FUNCS[node.func.id]
            if len(node.args) < least or most is not None and len(node.args) > most \
                    or any(isinstance(x, ast.Starred) for x in node.args):
                count = f"{least}" if least == most else f"at least {least}"
                raise CaseError(f"{where}: {node.func.id}() in {shown(expr)} takes {count} arguments, got "
                                f"{len(node.args)}")
            args = [ev(x) for x in node.args]
            if fn is _cdiv and args[1] == 0:
                raise CaseError(f"{where}: {shown(expr)} divides by zero")
            return _checked(fn(*args), expr, where)
        raise CaseError(f"{where}: {shown(expr)} uses something other than numbers, names, + - * //, min, max, cdiv")

    try:
        return ev(tree)
    except RecursionError:
        raise CaseError(f"{where}: {shown(expr)} nests deeper than an expression may") from None


def _checked(v: Union[int, float], expr, where: str) -> Union[int, float]:
    if isinstance(v, float) and not math.isfinite(v):
        raise CaseError(f"{where}: {shown(expr)} reaches {v}: an expression's values must be finite")
    if isinstance(v, int) and abs(v) > MAX_VALUE:
        raise CaseError(f"{where}: {shown(expr)} reaches {shown(v)}, past the 2^64 an integer may take here")
    return v


def evaluate_int(expr: Union[str, int, float], names: Mapping[str, int], where: str, lo: int = 0,
                 hi: int = MAX_VALUE) -> int:
    """An expression that must give an integer in lo..hi (a float with no fraction counts as one)."""
    v = evaluate(expr, names, where)
    said = shown(v) if isinstance(expr, (int, float)) else f"{shown(expr)} = {shown(v)}"
    if isinstance(v, float):
        if v != int(v):
            raise CaseError(f"{where}: {said} is not an integer")
        v = int(v)
    if not lo <= v <= hi:
        raise CaseError(f"{where}: {said} is outside {lo}..{hi}")
    return v
