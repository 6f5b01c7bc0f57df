"""How a reproducer's programs are built: the build plan (the kernel's traced and untraced builds,
their defines and entry points) and the Makefile that carries it out with nvcc alone.

Every word the Makefile is given is proven free of what make, a shell or nvcc's option parser
would interpret before it is written (make_words); a value outside that grammar is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from harness.build import DEFAULT_FLAGS, LIBRARY_FLAGS, arch_flags, cutlass_include_dirs, define_flags
from oracle.repro.errors import ReproError
from oracle.run.case_types import Case

TEMPLATE = Path(__file__).resolve().parent / "files" / "repro.cu"
# the host program's parts: its headers (host/*.cuh) and the build's kind (host/kind.cpp, linked twice)
TEMPLATE_PARTS = tuple(sorted(p for p in (TEMPLATE.parent / "host").iterdir() if p.suffix in (".cuh", ".cpp")))
LIBRARY_TRACED, LIBRARY_PLAIN = "libkernel_traced.so", "libkernel.so"  # a launch library's two builds
# Files a run of the reproducer writes (make clean removes them with the builds).
RUN_OUTPUTS = ("d.bin", "sink.bin", "result.txt")
# Every word the Makefile is given: no character make, a shell or nvcc's option parser would read.
MAKE_WORD = re.compile(r"[A-Za-z0-9_.+\-/=,]*\Z")


class FirstEntries:
    """The first launch's entry points of a class with `entries_traced` and `entries_plain`."""

    entries_traced: tuple[str, ...]
    entries_plain: tuple[str, ...]

    @property
    def entry_traced(self) -> str:
        return self.entries_traced[0]

    @property
    def entry_plain(self) -> str:
        return self.entries_plain[0]


@dataclass(frozen=True)
class BuildPlan(FirstEntries):
    """How the two cubins are made: the kernel source (None for a prebuilt cubin), defines, and
    the entry point of every launch in each build."""

    source: Optional[Path]
    prebuilt: Optional[Path]
    arch: str
    traced_defines: dict
    plain_defines: dict
    entries_traced: tuple[str, ...]
    entries_plain: tuple[str, ...]
    time_entry_unused: bool = False  # a time_entry the untraced build cannot use (later launches)
    library: bool = False  # a launch library: two shared objects, entered through oracle_launch

    @property
    def shared(self) -> bool:
        """The untraced run uses the traced cubin (same defines, or a prebuilt cubin)."""
        return self.prebuilt is not None or self.plain_defines == self.traced_defines

    @property
    def cubin_traced(self) -> str:
        return LIBRARY_TRACED if self.library else "kernel_traced.cubin"

    @property
    def cubin_plain(self) -> str:
        if self.library:
            return LIBRARY_TRACED if self.shared else LIBRARY_PLAIN
        return "kernel_traced.cubin" if self.shared else "kernel.cubin"


def build_plan(case: Case) -> BuildPlan:
    k = case.kernel
    traced = {"ORACLE_TRACE": "1", **dict(k.defines)}
    if k.library:  # the untraced library is the same source without ORACLE_TRACE
        plain = {n: v for n, v in dict(k.defines).items() if n != "ORACLE_TRACE"}
        return BuildPlan(Path(k.library), None, k.arch, traced, plain, (k.entry,), (k.entry,), library=True)
    entries = (k.entry,) + tuple(plan.entry for plan in case.launch.next)
    if k.time_entry and len(entries) == 1:
        plain = {n: v for n, v in dict(k.defines).items() if n != "ORACLE_TRACE"}
        entries_plain = (k.time_entry,)
    else:  # the traced entries only exist with ORACLE_TRACE: the same build, with a null sink
        plain, entries_plain = traced, entries
    return BuildPlan(Path(k.source) if k.source else None, Path(k.cubin) if k.cubin else None, k.arch, traced, plain,
                  entries, entries_plain, time_entry_unused=bool(k.time_entry) and len(entries) > 1)


def make_words(field: str, words) -> str:
    """`words` joined by spaces, each proven free of anything make, a shell or nvcc would interpret
    ($, quotes, ;, #, whitespace, newline...): a value outside that grammar is refused, never written."""
    words = [str(w) for w in words]
    for w in words:
        if not MAKE_WORD.match(w):
            raise ReproError(f"the Makefile's {field} would hold {w!r}: only letters, digits and _ . + - / = , "
                             f"may reach it")
    return " ".join(words)


def makefile_text(build: BuildPlan, kernel_main: Optional[str], kernel_names: list[str],
                  outputs: tuple[str, ...] = RUN_OUTPUTS) -> str:
    """The Makefile; `make clean` removes the builds and `outputs`, the files a run writes."""
    cutlass = [str(d) for d in cutlass_include_dirs()]
    cutlass = [d if MAKE_WORD.match(d) else "" for d in cutlass]  # a machine path make cannot take: left to the user
    cutlass_inc = cutlass[0] if cutlass else ""
    cutlass_util = cutlass[1] if len(cutlass) > 1 else ""
    output = LIBRARY_FLAGS if build.library else ("-cubin",)
    kernel_flags = make_words("KERNEL_FLAGS", output + arch_flags(build.arch) + DEFAULT_FLAGS)
    out = [
        "# Makefile of a standalone reproducer written by `python -m oracle repro`; nvcc is all it needs.",
        "#   make             the untraced cubin and ./repro (the production entry point, no sink)",
        "#   make TRACE=1     the traced cubin and ./repro_traced (the traced entry point; writes sink.bin)",
        "#   make host        only the host programs (repro --check-only needs no cubin and no GPU)",
        "# Variables: NVCC (another compiler, to bisect nvcc versions), CUTLASS_INCLUDE and",
        "# CUTLASS_UTIL_INCLUDE (the CUTLASS/CuTe headers), KERNEL_CUBIN_FROM and KERNEL_TRACED_CUBIN_FROM",
        "# (copy a cubin built from the same source with the same flags, e.g. another reproducer's, instead",
        "# of compiling), HOST_FLAGS.",
        "NVCC ?= nvcc",
        f"CUTLASS_INCLUDE ?= {cutlass_inc}",
        f"CUTLASS_UTIL_INCLUDE ?= {cutlass_util}",
        "KERNEL_CUBIN_FROM ?=",
        "KERNEL_TRACED_CUBIN_FROM ?=",
        "TRACE ?= 0",
        "# the oracle's own build (harness/build.py): arch, flags, then the trace header and CUTLASS",
        f"KERNEL_FLAGS := {kernel_flags}",
        f"TRACED_DEFINES := {make_words('TRACED_DEFINES', define_flags(build.traced_defines))}",
        f"PLAIN_DEFINES := {make_words('PLAIN_DEFINES', define_flags(build.plain_defines))}",
        "INCLUDES := -Ikernel/include $(if $(CUTLASS_INCLUDE),-I$(CUTLASS_INCLUDE)) "
        "$(if $(CUTLASS_UTIL_INCLUDE),-I$(CUTLASS_UTIL_INCLUDE))",
        f"KERNEL_SOURCE := {make_words('KERNEL_SOURCE', [kernel_main] if kernel_main else [])}",
        f"KERNEL_FILES := {make_words('KERNEL_FILES', kernel_names)}",
        "HOST_FLAGS ?= -std=c++17 -O2 -g",
        f"PLAIN_CUBIN := {build.cubin_plain}",
        "",
        "ifeq ($(TRACE),1)",
        "all: repro_traced",
        "else",
        "all: repro",
        "endif",
        "",
        "# repro needs its cubin at run time only: an order-only prerequisite; `make host` skips it",
        "REPRO_NEEDS ?= $(PLAIN_CUBIN)",
        f"TRACED_NEEDS ?= {build.cubin_traced}",
        "host:",
        "\t$(MAKE) repro repro_traced REPRO_NEEDS= TRACED_NEEDS=",
        ".PHONY: all host run run_traced sanitize clean",
        "",
    ]
    if build.prebuilt is None:
        out += [f"{build.cubin_traced}: $(KERNEL_FILES)",
                "ifneq ($(KERNEL_TRACED_CUBIN_FROM),)",
                "\tcp $(KERNEL_TRACED_CUBIN_FROM) $@",
                "else",
                "\t$(NVCC) $(KERNEL_FLAGS) $(TRACED_DEFINES) $(INCLUDES) -o $@ $(KERNEL_SOURCE)",
                "endif", ""]
        if not build.shared:
            out += [f"{build.cubin_plain}: $(KERNEL_FILES)",
                    "ifneq ($(KERNEL_CUBIN_FROM),)",
                    "\tcp $(KERNEL_CUBIN_FROM) $@",
                    "else",
                    "\t$(NVCC) $(KERNEL_FLAGS) $(PLAIN_DEFINES) $(INCLUDES) -o $@ $(KERNEL_SOURCE)",
                    "endif", ""]
    out += [
        "# the host programs: repro.cu and its headers (host/), no kernel code (it loads the cubin at run time),",
        "# compiled once and linked twice with host/kind.cpp, which says which entry points the program launches",
        "HOST_SOURCES := repro.cu " + " ".join(f"host/{p.name}" for p in TEMPLATE_PARTS),
        "repro.o: $(HOST_SOURCES)",
        "\t$(NVCC) $(HOST_FLAGS) -Ikernel/include -DORACLE_REPRO_KIND_LINKED -c -o $@ repro.cu",
        "# a program newer than its sources is up to date without the object (copied in, or the object removed)",
        ".SECONDARY: repro.o",
        "repro: repro.o host/kind.cpp | $(REPRO_NEEDS)",
        "\t$(NVCC) $(HOST_FLAGS) -DORACLE_REPRO_TRACED=0 -o $@ repro.o host/kind.cpp -ldl",
        "repro_traced: repro.o host/kind.cpp | $(TRACED_NEEDS)",
        "\t$(NVCC) $(HOST_FLAGS) -DORACLE_REPRO_TRACED=1 -o $@ repro.o host/kind.cpp -ldl",
        "",
        "run: repro",
        "\t./repro",
        "run_traced: repro_traced",
        "\t./repro_traced",
        "sanitize: repro",
        "\tcompute-sanitizer --tool memcheck --error-exitcode 99 ./repro --timeout 600",
        "clean:",
        "\trm -f repro repro_traced repro.o"
        + ("" if build.prebuilt else f" {LIBRARY_PLAIN} {LIBRARY_TRACED}" if build.library
           else " kernel.cubin kernel_traced.cubin")
        + " " + " ".join(outputs),
    ]
    return "\n".join(out) + "\n"
