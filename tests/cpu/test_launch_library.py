"""The launch library (ABI "oracle/1") without a GPU: the C++ LaunchArgs against its ctypes mirror
(a host program built with g++ prints every offsetof), the case grammar of [kernel] library and
[launch] abi, the library build with nvcc (its exported symbols read with nm -D), and the real child
calling a host-only library through the real runner with the driver emulated in host memory."""

import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from harness import launch_abi as L
from harness.build import HARNESS_INCLUDE_DIR, build_slot
from harness.runner import RunnerError, RunStatus, SinkRequest, run_library
from kernels_ref.dtypes import ELEMENT_TYPES
from kernels_ref.epilogue import ACTIVATIONS
from oracle.run.case import load_case
from oracle.run.case_types import CaseError
from emulated_driver import DRIVER_IN_HOST_MEMORY  # tests/ is on sys.path
from host_programs import host_from, shared_host_programs  # tests/ is on sys.path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "harness" / "examples" / "simple_gemm_lib.toml"


def cuda_include() -> Path:
    """The CUDA runtime headers (launch.hpp needs cuda_runtime_api.h for cudaStream_t)."""
    candidates = [Path(os.environ[v]) / "include" for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(Path(nvcc).resolve().parents[1] / "include")
    candidates.append(Path("/usr/local/cuda/include"))
    for c in candidates:
        if (c / "cuda_runtime_api.h").is_file():
            return c
    pytest.skip("These tests compile launch.hpp, which needs the CUDA runtime headers (cuda_runtime_api.h); "
                "none were found (set CUDA_HOME).")


def gxx() -> str:
    path = shutil.which("g++")
    if path is None:
        pytest.skip("These tests compile host C++ with g++, which is not installed here.")
    return path


def compile_host(tmp_path: Path, name: str, text: str, *flags: str) -> Path:
    src = tmp_path / f"{name}.cpp"
    src.write_text(text)
    out = tmp_path / name
    cmd = [gxx(), "-std=c++17", "-O1", f"-I{HARNESS_INCLUDE_DIR}", f"-I{cuda_include()}", *flags, "-o", str(out),
           str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out


# ------------------------------------------------------------------------------------ layout


NAMED_CODES = max(d.launch_code for d in ELEMENT_TYPES.values()) + 2  # 0 (no tensor), the table, one past it


def _layout_program() -> str:
    lines = ['#include "oracle_trace/launch.hpp"', "#include <cstdio>", "#include <cstddef>",
             "using namespace oracle_trace;", "int main() {"]
    for struct, fields in (("LaunchArgs", L.LAUNCH_ARGS_FIELDS), ("TensorRef", L.TENSOR_REF_FIELDS),
                           ("WorkspaceRef", L.WORKSPACE_REF_FIELDS)):
        lines.append(f'  std::printf("sizeof {struct} %zu\\n", sizeof({struct}));')
        for name, _ in fields:
            lines.append(f'  std::printf("{struct}.{name} %zu %zu\\n", offsetof({struct}, {name}), '
                         f'sizeof((({struct}*)nullptr)->{name}));')
    consts = {"kLaunchAbiVersion": "kLaunchAbiVersion", "kMaxRank": "kMaxRank", "kTensorSlots": "kTensorSlots",
              "kWorkspaceSlots": "kWorkspaceSlots", "kWorkspaceNameBytes": "kWorkspaceNameBytes",
              "slot.a": "kSlotA", "slot.b": "kSlotB", "slot.c": "kSlotC", "slot.d": "kSlotD", "slot.bias": "kSlotBias",
              "slot.scale_a": "kSlotScaleA", "slot.scale_b": "kSlotScaleB",
              "dtype.fp32": "ElementType::F32", "dtype.fp16": "ElementType::F16", "dtype.bf16": "ElementType::BF16",
              "dtype.e4m3": "ElementType::E4M3", "dtype.e5m2": "ElementType::E5M2", "dtype.int8": "ElementType::I8",
              "dtype.int32": "ElementType::I32", "dtype.uint8": "ElementType::U8",
              "act.none": "Activation::None", "act.relu": "Activation::Relu", "act.gelu_erf": "Activation::GeluErf",
              "act.gelu_tanh": "Activation::GeluTanh", "act.silu": "Activation::Silu",
              "bias.none": "BiasKind::None", "bias.row": "BiasKind::Row", "bias.col": "BiasKind::Col",
              "scale.none": "ScaleKind::None", "scale.tensor": "ScaleKind::Tensor", "scale.row": "ScaleKind::Row",
              "scale.col": "ScaleKind::Col", "scale.block": "ScaleKind::Block"}
    for key, expr in consts.items():
        lines.append(f'  std::printf("const {key} %llu\\n", (unsigned long long)({expr}));')
    lines.append('  std::printf("abi %llu\\n", (unsigned long long)oracle_launch_abi());')
    for code in range(NAMED_CODES):  # the names messages give element types, past the table too
        lines.append(f'  std::printf("name {code} %s\\n", element_type_name(uint32_t({code})));')
    for code in range(len(L.SCALE_KINDS) + 1):  # the names messages give scale kinds, one past the table
        lines.append(f'  std::printf("scale_name {code} %s\\n", scale_kind_name(uint32_t({code})));')
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def header_facts(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("layout")
    exe = compile_host(tmp, "layout", _layout_program())
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60, check=True).stdout
    facts = {}
    for line in out.splitlines():
        key, *vals = line.split()
        if key in ("sizeof", "const"):
            facts[f"{key} {vals[0]}"] = int(vals[1])
        elif key == "abi":
            facts["abi"] = int(vals[0])
        elif key in ("name", "scale_name"):
            facts[f"{key} {vals[0]}"] = vals[1]
        else:
            facts[key] = (int(vals[0]), int(vals[1]))
    return facts


def test_the_ctypes_mirror_has_the_headers_layout(header_facts):
    for struct, cls, fields in (("LaunchArgs", L.LaunchArgs, L.LAUNCH_ARGS_FIELDS),
                                ("TensorRef", L.TensorRef, L.TENSOR_REF_FIELDS),
                                ("WorkspaceRef", L.WorkspaceRef, L.WORKSPACE_REF_FIELDS)):
        assert header_facts[f"sizeof {struct}"] == ctypes.sizeof(cls), struct
        for name, _ in fields:
            got = header_facts[f"{struct}.{name}"]
            want = (getattr(cls, name).offset, getattr(cls, name).size)
            assert got == want, f"{struct}.{name}: header (offset, size) {got}, ctypes {want}"
    assert header_facts["abi"] == L.abi_word()


def test_the_headers_codes_are_the_tables(header_facts):
    f = header_facts
    assert f["const kLaunchAbiVersion"] == L.ABI_VERSION
    assert (f["const kMaxRank"], f["const kTensorSlots"], f["const kWorkspaceSlots"],
            f["const kWorkspaceNameBytes"]) == (L.MAX_RANK, L.TENSOR_SLOTS, L.WORKSPACE_SLOTS, L.WORKSPACE_NAME_BYTES)
    assert {k: f[f"const slot.{k}"] for k in L.SLOTS} == L.SLOTS
    assert {k: f[f"const dtype.{k}"] for k in ELEMENT_TYPES} == {k: d.launch_code for k, d in ELEMENT_TYPES.items()}
    assert [f[f"const act.{a}"] for a in ACTIVATIONS] == list(range(len(ACTIVATIONS)))
    assert [f[f"const bias.{b}"] for b in L.BIAS_KINDS] == list(range(len(L.BIAS_KINDS)))
    assert [f[f"const scale.{s}"] for s in L.SCALE_KINDS] == list(range(len(L.SCALE_KINDS)))
    codes = [d.launch_code for d in ELEMENT_TYPES.values()]
    assert 0 not in codes and len(set(codes)) == len(codes)  # 0 is "no tensor"


def test_the_header_names_element_types_as_the_table_does(header_facts):
    names = {d.launch_code: name for name, d in ELEMENT_TYPES.items()}
    want = {code: names.get(code, "none" if code == 0 else "unknown") for code in range(NAMED_CODES)}
    assert {code: header_facts[f"name {code}"] for code in range(NAMED_CODES)} == want
    assert set(names) < set(range(NAMED_CODES))  # every row is asked for, and one code past them


def test_the_header_names_scale_kinds_as_a_case_spells_them(header_facts):
    got = [header_facts[f"scale_name {code}"] for code in range(len(L.SCALE_KINDS) + 1)]
    assert got == [*L.SCALE_KINDS, "unknown"]


def test_fill_places_every_operand_in_its_slot():
    call = L.LibraryCall(m=3, n=5, k=7, tile=(64, 64, 16), alpha=2.0, beta=0.5, activation=2, bias_kind="col",
                         tensors=(L.TensorSlotArg("a", "a", "bf16", (3, 7), (1, 3)),
                                  L.TensorSlotArg("d", "d", "fp32", (3, 5), (5, 1), "out")),
                         workspaces=(("partials", "ws_partials"),))
    filled = L.fill(call, {"a": 0x1000, "d": 0x2000, "ws_partials": 0x3000}, {"ws_partials": 96}, sink=0x4000,
                    stream=0x5000)
    a = filled.args
    assert (a.abi_version, a.struct_bytes, a.m, a.n, a.k) == (1, ctypes.sizeof(L.LaunchArgs), 3, 5, 7)
    assert (a.alpha, a.beta, a.activation, a.bias_kind) == (2.0, 0.5, 2, 2)
    ta, td = a.tensors[0], a.tensors[3]
    assert (ta.data, ta.dtype, ta.rank, list(ta.shape), list(ta.stride)) == (0x1000, 3, 2, [3, 7, 1, 1], [1, 3, 0, 0])
    assert (td.data, td.dtype) == (0x2000, 1)
    assert a.tensors[1].data is None and a.tensors[1].rank == 0  # B absent in this call
    assert (a.n_workspaces, a.workspaces[0].data, a.workspaces[0].bytes, a.workspaces[0].name) == \
        (1, 0x3000, 96, b"partials")
    assert (a.trace_sink, a.stream, a.message_bytes) == (0x4000, 0x5000, L.MESSAGE_BYTES)
    assert L.LibraryCall.from_dict(call.to_dict()) == call


def test_a_call_outside_the_abi_is_refused():
    with pytest.raises(L.AbiError, match="abi 'oracle/2'"):
        L.LibraryCall(m=1, n=1, k=1, tile=(1, 1, 1), tensors=(), abi="oracle/2")
    with pytest.raises(L.AbiError, match="rank, 1 to 4"):
        L.TensorSlotArg("a", "a", "fp32", (1, 2, 3, 4, 5), (1, 1, 1, 1, 1))
    with pytest.raises(L.AbiError, match="at most 31"):
        L.LibraryCall(m=1, n=1, k=1, tile=(1, 1, 1), tensors=(), workspaces=(("w" * 32, "ws"),))


# ------------------------------------------------------------------------------------ case grammar

PROBLEM = """[problem]
m = 64
n = 64
k = 16
a_dtype = "fp32"
b_dtype = "fp32"
out_dtype = "fp32"
tile = [64, 64, 16]
"""


def _case(tmp_path: Path, kernel: str, launch: str) -> Path:
    (tmp_path / "lib.cu").write_text("// a library\n")
    p = tmp_path / "case.toml"
    p.write_text(PROBLEM + "\n[kernel]\n" + kernel + "\n[launch]\n" + launch + "\n")
    return p


@pytest.mark.parametrize("kernel, launch, message", [
    ('library = "lib.cu"', 'grid = [1]\nblock = [1]\nargs = []', r"\[kernel\] library = 'lib.cu' needs \[launch\] abi"),
    ('source = "lib.cu"\nentry = "k"', 'abi = "oracle/1"', r"\[launch\] abi = 'oracle/1' is for a launch library"),
    ('library = "lib.cu"', 'abi = "oracle/9"', r"\[launch\] abi = 'oracle/9' is not allowed: one of 'oracle/1'"),
    ('library = "lib.cu"', 'abi = 1', r"\[launch\] abi = 1 is not allowed"),
    ('library = "lib.cu"\nentry = "k"', 'abi = "oracle/1"', r"\[kernel\] entry = 'k' is not allowed beside"),
    ('library = "lib.cu"\nsource = "lib.cu"', 'abi = "oracle/1"', r"\[kernel\] source = .* is not allowed beside"),
    ('library = "lib.cu"\ncubin = "x.cubin"', 'abi = "oracle/1"', r"\[kernel\] cubin = .* is not allowed beside"),
    ('library = "lib.cu"\ntime_entry = "k"', 'abi = "oracle/1"', r"\[kernel\] time_entry = 'k' is not allowed"),
    ('library = "lib.cu"', 'abi = "oracle/1"\ngrid = [1]', r"\[launch\] grid = \[1\] is not allowed with abi"),
    ('library = "lib.cu"', 'abi = "oracle/1"\nargs = ["a"]', r"\[launch\] args = \['a'\] is not allowed with abi"),
    ('library = 7', 'abi = "oracle/1"', r"\[kernel\] library = 7 must be the path of a file"),
    ('library = "lib$(id).cu"', 'abi = "oracle/1"', r"\[kernel\] library = .* is not allowed: a path whose file name"),
    ('library = "lib.cu"\ndefines = { "A B" = 1 }', 'abi = "oracle/1"', r"\[kernel\] defines: name = 'A B'"),
    ('library = "lib.cu"\ndefines = { X = "a;b" }', 'abi = "oracle/1"', r"\[kernel\] defines.X = 'a;b'"),
])
def test_library_cases_are_held_to_the_grammar(tmp_path, kernel, launch, message):
    with pytest.raises(CaseError, match=message):
        load_case(str(_case(tmp_path, kernel, launch)))


def test_the_command_line_cannot_give_a_library_an_entry_point(tmp_path, capsys):
    from oracle.tools import cli

    path = _case(tmp_path, 'library = "lib.cu"', 'abi = "oracle/1"')
    with pytest.raises(CaseError, match=r"--entry 'k' is not allowed for a launch library"):
        load_case(str(path), entry="k")
    assert load_case(str(path), source=str(tmp_path / "other.cu"), allow_library=True).kernel.library == str(tmp_path / "other.cu")
    assert cli.main(["compare", "--problem", str(path), "--untraced-entry", "k", "--allow-library"]) == 2
    assert "--untraced-entry names a cubin's entry point" in capsys.readouterr().err


def test_a_next_launch_cannot_name_an_abi(tmp_path):
    path = _case(tmp_path, 'source = "lib.cu"\nentry = "k"', 'grid = [1]\nblock = [1]\nargs = []\n'
                 '[[launch.next]]\nentry = "k2"\nabi = "oracle/1"')
    with pytest.raises(CaseError, match=r"\[\[launch.next\]\] #0 abi = 'oracle/1': only \[launch\] itself"):
        load_case(str(path))


def test_the_example_case_reads_and_passes_its_checks():
    from oracle.run import launch, sink

    case = load_case(str(EXAMPLE), allow_library=True)
    assert case.kernel.library.endswith("simple_gemm_lib.cu") and case.kernel.entry == "oracle_launch"
    assert case.launch.abi == "oracle/1"
    sink.check_case(case)
    call, _ = launch.library_call(case, None)
    assert [t.slot for t in call.tensors] == ["a", "b", "d", "bias"]
    assert call.tensors[1].strides == (136, 1) and call.activation == ACTIVATIONS.index("gelu_erf")
    with pytest.raises(CaseError, match="use library_call"):
        launch.launch_sequence(case, None)


def test_the_library_call_has_each_operands_layout(tmp_path):
    from oracle.run import launch

    text = PROBLEM.replace('a_dtype = "fp32"', 'a_dtype = "fp32"\na_major = "col"\nbeta = 0.5\nc_dtype = "fp32"\nbias = "row"\n'
                           'batch = 2') + '\n[kernel]\nlibrary = "lib.cu"\n[launch]\nabi = "oracle/1"\n' \
        '[workspace.flags]\nbytes = "4 * tiles"\ninit = "zero"\n'
    (tmp_path / "lib.cu").write_text("//\n")
    (tmp_path / "c.toml").write_text(text)
    case = load_case(str(tmp_path / "c.toml"), allow_library=True)
    call, _ = launch.library_call(case, None)
    by = {t.slot: t for t in call.tensors}
    assert by["a"].shape == (128, 16) and by["a"].strides == (1, 128)  # col-major A of 2 x 64 rows
    assert by["b"].shape == (2, 16, 64) and by["b"].strides == (1024, 1, 16)  # a stack of col-major B
    assert by["c"].shape == (128, 64) and by["c"].strides == (64, 1)
    assert (call.batch, call.groups, call.group_offsets, call.bias_kind) == (2, 0, "group_offsets", "row")
    assert call.workspaces == (("flags", "ws_flags"),)


# ------------------------------------------------------------------------------------ build


@pytest.mark.nvcc
@pytest.mark.parametrize("example, traced", [("simple_gemm_lib.toml", True), ("simple_gemm_lib.toml", False),
                                             ("fault_trap_lib.toml", True)])
def test_the_examples_build_as_libraries_that_export_oracle_launch(tmp_path, example, traced):
    from harness.build import build_library

    case = load_case(str(EXAMPLE.parent / example), allow_library=True)
    defines = {**case.kernel.defines, "ORACLE_TRACE": "1"} if traced else dict(case.kernel.defines)
    res = build_library(case.kernel.library, arch=case.kernel.arch, defines=defines, cache_dir=tmp_path / "cache")
    assert res.cubin_path.suffix == ".so" and res.cubin_path.read_bytes()[:4] == b"\x7fELF"
    assert "-shared" in res.command and "static" in res.command
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed: the exported symbols cannot be listed.")
    out = subprocess.run([nm, "-D", "--defined-only", str(res.cubin_path)], capture_output=True, text=True,
                         check=True).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.strip()}
    assert {"oracle_launch", "oracle_launch_abi"} <= exported
    needed = subprocess.run(["readelf", "-d", str(res.cubin_path)], capture_output=True, text=True).stdout
    assert "libcudart" not in needed, "the CUDA runtime is linked statically"
    again = build_library(case.kernel.library, arch=case.kernel.arch, defines=defines, cache_dir=tmp_path / "cache")
    assert again.cached and again.cubin_path == res.cubin_path


# ------------------------------------------------------------------------------------ the child

EMULATED_CHILD = DRIVER_IN_HOST_MEMORY + r'''
cu.host_register_mapped = lambda addr, n: cu.HostMapped(addr, addr, n, True)
cu.stream_create = lambda: 0x5EA
cu.stream_synchronize = lambda s: None
cu.synchronize = lambda: None
cu.event_create, cu.event_destroy = object, lambda e: None
cu.event_record = lambda e, stream=0: None
cu.event_elapsed_ms = lambda a, b: 0.5
_child.main(sys.argv[1:])
'''
CHILD = [sys.executable, "-c", EMULATED_CHILD]

# A host-only library: "device" memory is host memory under the emulated driver.
HOST_LIBRARY = r'''
#include "oracle_trace/launch.hpp"
using namespace oracle_trace;
extern "C" int oracle_launch(const LaunchArgs* args) {
  if (const int bad = check_args(args)) return bad;
  if (args->stream != reinterpret_cast<cudaStream_t>(0x5EA)) return fail_launch(args, 7, "not the child's stream");
  if (args->trace_sink != nullptr) {  // one "tap": a marker and M
    unsigned* s = static_cast<unsigned*>(args->trace_sink);
    s[0] = 0xC0FFEE09u;
    s[1] = unsigned(args->m);
  }
  if (args->m == 13) return fail_launch(args, 42, "M = %lld is not supported here", (long long)args->m);
  const TensorRef &A = tensor(args, kSlotA), &B = tensor(args, kSlotB), &D = tensor(args, kSlotD);
  const float* a = static_cast<const float*>(A.data);
  const float* b = static_cast<const float*>(B.data);
  float* d = static_cast<float*>(D.data);
  for (int64_t i = 0; i < args->m; ++i)
    for (int64_t j = 0; j < args->n; ++j) {
      float acc = 0.f;
      for (int64_t k = 0; k < args->k; ++k) acc += a[i * A.stride[0] + k * A.stride[1]] * b[k * B.stride[0] + j * B.stride[1]];
      d[i * D.stride[0] + j * D.stride[1]] = args->alpha * acc;
    }
  if (args->n_workspaces == 1) {
    unsigned long long* w = static_cast<unsigned long long*>(args->workspaces[0].data);
    w[0] = args->workspaces[0].bytes;
    w[1] = args->workspaces[0].name[0];
  }
  return 0;
}
'''

OTHER_ABI = r'''
#include <stdint.h>
extern "C" uint64_t oracle_launch_abi(void) { return (2ull << 32) | 64ull; }
extern "C" int oracle_launch(const void*) { return 0; }
'''


@pytest.fixture(scope="module")
def host_library(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostlib")
    return compile_host(tmp, "libhost.so", HOST_LIBRARY, "-shared", "-fPIC")


def _gemm_call(m: int, ws: bool = False):
    n, k = 5, 3
    a = torch.arange(m * k, dtype=torch.float32).reshape(m, k)
    b = torch.arange(k * n, dtype=torch.float32).reshape(n, k).t()  # stored col-major: [N, K] in memory
    tensors = {"a": a, "b": b.t().contiguous(), "d": torch.zeros(m, n)}
    call_ws = ()
    if ws:
        tensors["ws_flags"] = torch.zeros(16, dtype=torch.uint8)
        call_ws = (("flags", "ws_flags"),)
    call = L.LibraryCall(m=m, n=n, k=k, tile=(64, 64, 16), alpha=2.0, workspaces=call_ws,
                         tensors=(L.TensorSlotArg("a", "a", "fp32", (m, k), (k, 1)),
                                  L.TensorSlotArg("b", "b", "fp32", (k, n), (1, k)),
                                  L.TensorSlotArg("d", "d", "fp32", (m, n), (n, 1), "out")))
    return call, tensors, 2.0 * a @ b


def test_the_child_calls_oracle_launch_with_the_buffers_and_the_sink(host_library):
    call, tensors, want = _gemm_call(4, ws=True)
    run = run_library(host_library, call, tensors, sink=SinkRequest(bytes(32)), child_cmd=CHILD, timeout_s=60)
    assert run.ok, run.describe() + run.stderr_tail
    assert torch.equal(run.outputs["d"], want)
    assert run.launch_return == 0
    assert run.sink[:8] == (0xC0FFEE09).to_bytes(4, "little") + (4).to_bytes(4, "little")
    flags = run.outputs["ws_flags"]
    assert int.from_bytes(bytes(flags[:8].tolist()), "little") == 16 and flags[8] == ord("f")


def test_a_timed_call_runs_the_library_again_with_a_null_sink_and_checks_the_output(host_library):
    call, tensors, want = _gemm_call(4)
    timing = {"min_reps": 3, "max_reps": 3, "warmup_ms": 0, "max_ms": 1000}
    run = run_library(host_library, call, tensors, sink=SinkRequest(bytes(32)), child_cmd=CHILD, timeout_s=60,
                      timing=timing)
    assert run.ok, run.describe() + run.stderr_tail
    assert run.timing["reps"] == 3 and run.timing["median_ms"] == 0.5 and run.timing["verified_after"] is True
    assert torch.equal(run.outputs["d"], want)


def test_a_non_zero_return_is_a_kernel_fault_with_the_librarys_words_and_the_taps(host_library):
    call, tensors, _ = _gemm_call(13)
    run = run_library(host_library, call, tensors, sink=SinkRequest(bytes(32)), child_cmd=CHILD, timeout_s=60)
    assert run.status is RunStatus.LIBRARY_ERROR and run.kernel_fault
    assert run.launch_return == 42 and run.launch_message == "M = 13 is not supported here"
    assert "oracle_launch returned 42 (M = 13 is not supported here)" in run.describe()
    assert run.sink[:4] == (0xC0FFEE09).to_bytes(4, "little")  # the tap before the refusal came back
    assert run.outputs == {}


def test_a_library_of_another_abi_is_refused_before_it_is_called(tmp_path):
    other = compile_host(tmp_path, "libother.so", OTHER_ABI, "-shared", "-fPIC")
    call, tensors, _ = _gemm_call(4)
    run = run_library(other, call, tensors, child_cmd=CHILD, timeout_s=60)
    assert run.status is RunStatus.LOAD_ERROR
    assert "built against ABI version 2, LaunchArgs of 64 bytes" in run.message
    assert f"this harness speaks ABI version 1, LaunchArgs of {ctypes.sizeof(L.LaunchArgs)} bytes" in run.message


def test_a_library_without_the_entry_is_a_load_error(tmp_path):
    lib = compile_host(tmp_path, "libnone.so", "extern \"C\" int something(void) { return 0; }\n", "-shared", "-fPIC")
    call, tensors, _ = _gemm_call(4)
    run = run_library(lib, call, tensors, child_cmd=CHILD, timeout_s=60)
    assert run.status is RunStatus.LOAD_ERROR and "exports no oracle_launch_abi()" in run.message


def test_run_library_refuses_a_malformed_request(tmp_path, host_library):
    call, tensors, _ = _gemm_call(4)
    with pytest.raises(RunnerError, match="not a shared object"):
        (tmp_path / "x.so").write_bytes(b"text")
        run_library(tmp_path / "x.so", call, tensors, child_cmd=CHILD)
    with pytest.raises(RunnerError, match=r"names buffers \['d'\]"):
        run_library(host_library, call, {k: v for k, v in tensors.items() if k != "d"}, child_cmd=CHILD)
    with pytest.raises(RunnerError, match="is torch.float16, the call says fp32"):
        run_library(host_library, call, {**tensors, "a": tensors["a"].half()}, child_cmd=CHILD)
    with pytest.raises(RunnerError, match="reaches element"):
        run_library(host_library, call, {**tensors, "a": tensors["a"][:2]}, child_cmd=CHILD)


# ------------------------------------------------------------------------------------ the reproducer


def _library_repro(out: Path):
    from oracle.repro.generate import write_repro
    from oracle.run.inputs import Provenance, make_operands

    case = load_case(str(EXAMPLE), allow_library=True)
    ops = make_operands(case.spec, "ones", 0)
    return case, ops, write_repro(case, ops, Provenance("ones", None), out)


def _lines(d: Path, key: str) -> list[list[str]]:
    return [line.split("#")[0].split()[1:] for line in (d / "launch.txt").read_text().splitlines()
            if line.split() and line.split()[0] == key]


def test_a_library_reproducer_writes_its_call_and_builds_the_library(tmp_path):
    from oracle.run import launch

    d = tmp_path / "lib"
    case, _, written = _library_repro(d)
    call, _ = launch.library_call(case, None)
    assert (written.cubin_traced, written.cubin_plain, written.entry_traced) == \
        ("libkernel_traced.so", "libkernel.so", "oracle_launch")
    assert {"kernel/src/simple_gemm_lib.cu", "kernel/src/simple_gemm.cu",
            "kernel/include/oracle_trace/launch.hpp", "host/library.cuh", "manifest.json"} <= set(written.files)
    assert _lines(d, "library_traced") == [["libkernel_traced.so"]] and _lines(d, "abi") == [["oracle/1"]]
    assert not _lines(d, "launch") and not _lines(d, "arg") and not _lines(d, "cubin_traced")
    (fields,) = _lines(d, "call")
    kv = dict(f.split("=", 1) for f in fields)
    assert (kv["m"], kv["n"], kv["k"], kv["activation"], kv["bias_kind"], kv["tile"]) == \
        ("200", "136", "72", "2", "2", "64,64,16")
    assert int(kv["alpha"], 16) == 0x3F800000 and kv["group_offsets"] == "-"
    tensors = [dict(f.split("=", 1) for f in line) for line in _lines(d, "call_tensor")]
    assert [(t["slot"], t["buffer"], t["dtype"], t["shape"], t["strides"]) for t in tensors] == [
        ("0", "a", "3", "200,72", "72,1"), ("1", "b", "3", "72,136", "136,1"), ("3", "d", "3", "200,136", "136,1"),
        ("4", "bias", "3", "136", "1")]
    make = (d / "Makefile").read_text()
    assert re.search(r"^KERNEL_FLAGS := -shared -Xcompiler -fPIC -cudart static -gencode=arch=compute_90a,code=sm_90a",
                     make, re.M)
    assert re.search(r"^libkernel_traced.so: \$\(KERNEL_FILES\)$", make, re.M)
    assert re.search(r"^libkernel.so: \$\(KERNEL_FILES\)$", make, re.M)
    assert re.search(r"^TRACED_DEFINES := -DORACLE_TRACE=1$", make, re.M)
    assert re.search(r"^PLAIN_DEFINES := $", make, re.M)
    doc = json.loads((d / "repro.json").read_text())
    assert doc["library"]["call"] == call.to_dict() and doc["launches"] == [] and doc["tensormaps"] == []
    assert "launch library simple_gemm_lib.cu (ABI oracle/1)" in (d / "README.txt").read_text()
    # a later repro into the same folder, after a build, replaces only the oracle's own files
    (d / "libkernel_traced.so").write_bytes(b"\x7fELF built")
    _library_repro(d)
    assert not (d / "libkernel_traced.so").exists()


def test_a_library_reproducers_run_reads_back_with_its_descriptor_note(tmp_path):
    from oracle.repro.readback import load_repro_run

    d = tmp_path / "lib"
    _library_repro(d)
    exp = torch.from_numpy(np.fromfile(d / "expected.bin", dtype=np.float32).reshape(200, 136).copy())
    (d / "d.bin").write_bytes(exp.to(torch.bfloat16).view(torch.uint8).numpy().tobytes())
    (d / "result.txt").write_text("status ok\nentry oracle_launch\ntraced 0\n")
    rec = load_repro_run(d)
    assert rec.kernel == "oracle_launch" and rec.output is not None
    assert any("not tapped, so unobserved: descriptor_a, descriptor_b" in n for n in rec.notes), rec.notes


@pytest.mark.nvcc
def test_a_library_reproducer_builds_with_make_and_checks_the_librarys_abi(tmp_path, tmp_path_factory):
    """make TRACE=1 (the traced library; repro_traced is the session's one build of the host program,
    tests/host_programs.py, copied in) and a dry run, which loads the library, checks its ABI and
    prints the LaunchArgs without a CUDA call."""
    d = tmp_path / "lib"
    _library_repro(d)
    host_from(shared_host_programs(tmp_path_factory), d, "repro_traced")
    with build_slot():
        proc = subprocess.run(["make", "-C", str(d), "TRACE=1"], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    dry = subprocess.run([str(d / "repro_traced"), "--dry-run"], capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert f"dry run: {d}/libkernel_traced.so exports oracle_launch (ABI version 1, LaunchArgs of " \
           f"{ctypes.sizeof(L.LaunchArgs)} bytes)" in dry.stdout
    assert "tensor slot 1: b, element type 3, shape [72,136], strides [136,1]" in dry.stdout
    assert "activation 2, bias kind 2" in dry.stdout
    # a library of another ABI, given with --cubin, is refused before anything runs
    other = compile_host(tmp_path, "libother.so", OTHER_ABI, "-shared", "-fPIC")
    bad = subprocess.run([str(d / "repro_traced"), "--dry-run", "--cubin", str(other)], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "was built against ABI version 2, LaunchArgs of 64 bytes" in bad.stderr
    # launch.txt of another ABI is refused by name
    copy = tmp_path / "copy"
    shutil.copytree(d, copy, ignore=shutil.ignore_patterns("*.so", "repro_traced", "kernel"))
    text = (copy / "launch.txt").read_text().replace("abi oracle/1", "abi oracle/2")
    (copy / "launch.txt").write_text(text)
    bad = subprocess.run([str(d / "repro_traced"), "--dry-run", "--dir", str(copy)], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "abi 'oracle/2' is not one this program speaks" in bad.stderr
