"""The commands an HTML report offers to re-run its judgement (oracle.report.html.Command), made
from the request where it is known: the compare that made it, the compare of a saved dump, and
the reproducer of a live case.

A live request keeps the command line that asked (RunRequest.command); its reproducer is the
same command with `repro` for `compare`, the flags repro takes (REPRO_FLAGS) kept and every other
one dropped. A dump or the demo has no kernel source: its reproducer needs the case file that
built the kernel (CASE.toml in the command, for the user to replace).
"""

from __future__ import annotations

import os
from typing import Optional

from oracle.report.html import Command

ORACLE = ("python", "-m", "oracle")
# compare's flags that repro takes too, with whether each takes a value
REPRO_FLAGS = {"--problem": True, "--set": True, "--kernel": True, "--entry": True, "--inputs": True,
               "--trace-tiles": True, "--trace-k-blocks": True, "--trace-groups": True, "--allow-library": False,
               "--allow-outside-case-dir": False}
# compare's flags repro does not take, with whether each takes a value (tests hold both tables to the parser)
COMPARE_ONLY_FLAGS = {"--dump": True, "--demo": False, "--repro-dir": True, "--sink": True, "--trace-stages": True,
                      "--time": False, "--timeout": True, "--repeat": True, "--untraced-entry": True,
                      "--smem-poison": True, "--sanitize": False, "--json": True, "--save-dump": True,
                      "--quiet": False, "--plots": True, "--html": True}
REPRO_OUT = "repro"


def repro_argv(compare_argv: tuple[str, ...]) -> Optional[tuple[str, ...]]:
    """`compare ...` words (after `python -m oracle`) -> the `repro ...` words of the same live case;
    None when they are not a live compare."""
    if not compare_argv or compare_argv[0] != "compare":
        return None
    out = ["repro"]
    words = list(compare_argv[1:])
    i = 0
    while i < len(words):
        w = words[i]
        flag, eq, value = w.partition("=")
        if flag in REPRO_FLAGS:
            takes = REPRO_FLAGS[flag]
            if takes and not eq:
                out.extend(words[i:i + 2])
                i += 2
                continue
            out.append(w)
        elif flag in COMPARE_ONLY_FLAGS:
            i += 2 if COMPARE_ONLY_FLAGS[flag] and not eq else 1
            continue
        elif w.startswith("-"):  # a flag this table does not know: not one repro is known to take
            pass
        else:  # the positional CASE.toml
            out.extend(["--problem", w])
        i += 1
    return tuple(out) + ("--out", REPRO_OUT)


def commands_for(request, *, dump: Optional[str] = None) -> tuple[Command, ...]:
    """The commands that re-run what `request` (oracle.run.request.RunRequest; None: not known)
    asked; `dump`: where the judged recording was saved (compare --save-dump, a failing check's
    dump)."""
    from oracle.tools.demo import DEMO_PATH

    if request is None:
        return (Command("judge the saved recording again", ORACLE + ("compare", "--dump", dump)),) if dump else ()
    cmds = []
    if request.case is not None:
        if request.command:
            words = tuple(request.command[3:]) if tuple(request.command[:3]) == ORACLE else tuple(request.command)
        elif request.case.path:
            words = ("compare", request.case.path, "--inputs", request.inputs)
        else:  # a Case object made in Python: no command line says it
            return (Command("judge the saved recording again", ORACLE + ("compare", "--dump", dump)),) if dump else ()
        cmds.append(Command("run, trace and judge the kernel again", ORACLE + words))
        saved = dump or "recording.safetensors.gz"
        if dump is None:
            cmds.append(Command("the same, saving the recording", ORACLE + words + ("--save-dump", saved)))
        cmds.append(Command("judge the saved recording again (no GPU needed)", ORACLE + ("compare", "--dump", saved)))
        repro = repro_argv(words)
        if repro is not None:
            cmds.append(Command("write a standalone reproducer (nvcc alone builds it)", ORACLE + repro))
        return tuple(cmds)
    demo = request.dump is not None and os.path.abspath(request.dump) == os.path.abspath(DEMO_PATH)
    if demo:
        cmds.append(Command("judge the embedded demo again", ORACLE + ("compare", "--demo")))
    elif request.dump is not None:
        cmds.append(Command("judge the recording again", ORACLE + ("compare", "--dump", request.dump)))
    elif request.source and os.path.isdir(request.source):  # a reproducer's run read back
        cmds.append(Command("judge the reproducer's run again", ORACLE + ("compare", "--repro-dir", request.source)))
    if dump is not None and dump != request.dump:
        cmds.append(Command("judge the saved recording again", ORACLE + ("compare", "--dump", dump)))
    path = dump or request.dump
    if path:
        cmds.append(Command("write a standalone reproducer: CASE.toml is the case file that built the kernel "
                            "(a recording holds no kernel source)",
                            ORACLE + ("repro", "--dump", path, "--problem", "CASE.toml", "--out", REPRO_OUT)))
    return tuple(cmds)
