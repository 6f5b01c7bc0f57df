"""The binary trace of `oracle_trace/trace.cuh`, one job a module: the format's numbers and errors
(format), one record's encoding (records), the sink header (header), the strict parser (parser)
and its bulk reader of well-formed sinks (bulk), the pure-Python writer (writer), and what a run's
trace covered (account).

Data path: the host builds the sink with `sink_init_bytes` (header with the selection of stages,
tiles and k-blocks, then a zeroed record area), points the kernel's `oracle_trace_sink` symbol at
it, launches, copies it back and calls `parse_trace`, which returns `harness.taps.Tap` and
`DescriptorRecord` objects. `TraceWriter` produces the same bytes in pure Python, so the parser
and everything downstream can be tested without a GPU.

Constraints: little-endian; format version 3 is written, versions 1, 2 and 3 are read (version 1 has
40-byte record heads without partial and group, and no per-stage drop counts; versions 1 and 2 have
a 512-byte header, 16 drop counts in version 2, and only GEMM stage codes; version 3 a 576-byte
header with 32 drop counts, and attention's stage codes 16..25); tiles up to
65535 x 65535 elements; the k-block selection is a 1024-wide window. Every malformed input raises a
`TraceFormatError` subclass whose message names the field, the value and the byte offset. The format
itself is specified in docs/trace-format.md; tests/cpu/test_trace_constants.py checks that the numbers
here agree with the header. Every name is importable from `harness.trace_format` itself.
"""

from harness.trace_format.format import (  # noqa: F401
    ALL_STAGES_MASK, BLOCK_BODY, BYTES_BODY, COMMIT_TAG, DESCRIPTOR_BODY, DESCRIPTOR_BODY_OFFSETS,
    DTYPE_CODES, DTYPE_NAMES, DTYPE_SIZE, DTYPE_TORCH, ELEMENTS_BODY, FLAG_ALL_K_BLOCKS, HEADER_BYTES,
    HEADER_BYTES_OF_VERSION, MAX_STAGE_CODE_OF_VERSION, STAGE_COUNTERS_OF_VERSION, STAGES_MASK_OF_VERSION,
    HEADER_FIXED, HEADER_OFFSETS, HEAD_BYTES_OF_VERSION, INT32_MAX, KBLOCK_WINDOW, KNOWN_FLAGS, MAGIC,
    MAX_GROUPS, MAX_TILES, MAX_TILE_DIM, NONE, OOB_FILL_CODES, OPERAND_CODES, READABLE_VERSIONS, RECORD_ALIGN,
    RECORD_HEAD, RECORD_HEAD_BYTES, RECORD_HEAD_OFFSETS, RECORD_HEAD_V1, RecordKind, STAGE_CODES,
    STAGE_COUNTERS, STAGE_NAMES, STRUCT_SIZES, SWIZZLE_BYTES, TILE_SELECTOR, TraceCodeError,
    TraceConflictError, TraceCoordinateError, TraceFormatError, TraceHeaderError, TraceLimitError,
    TraceRecordError, TraceTruncatedError, VERSION, _round_up)
from harness.trace_format.records import (  # noqa: F401
    ValuesLike, encode_descriptor, encode_record)
from harness.trace_format.header import (  # noqa: F401
    SinkHeader, TraceSelection, parse_header, sink_init_bytes, sink_prefix, trace_extent)
from harness.trace_format.parser import (  # noqa: F401
    MAX_WARNINGS_PER_KIND, TAP_DENSE_FLOOR_BYTES, TAP_SPARSE_RATIO, WARN_CTAS, WARN_SLOT, WARN_TORN,
    WARN_UNSELECTED, WARNING_KINDS, TraceResult, parse_trace)
from harness.trace_format.writer import (  # noqa: F401
    TraceWriter)
from harness.trace_format.account import (  # noqa: F401
    TraceAccount, account_of)
