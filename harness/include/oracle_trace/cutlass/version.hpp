// oracle_trace/cutlass/version.hpp -- the one CUTLASS version these adapters are written against.
//
// The adapters derive from CUTLASS's SM90 collectives and fill its device adapter's Arguments;
// both change between releases. They are pinned to the release the `nvidia-cutlass` wheel ships
// (4.2): another version stops the build here, not at run time.

#ifndef ORACLE_TRACE_CUTLASS_VERSION_HPP_
#define ORACLE_TRACE_CUTLASS_VERSION_HPP_

#include "cutlass/version.h"

#define ORACLE_CUTLASS_PINNED_MAJOR 4
#define ORACLE_CUTLASS_PINNED_MINOR 2

#if CUTLASS_MAJOR != ORACLE_CUTLASS_PINNED_MAJOR || CUTLASS_MINOR != ORACLE_CUTLASS_PINNED_MINOR
#error "oracle_trace/cutlass: these adapters are written against CUTLASS 4.2 (the nvidia-cutlass wheel); this build includes another CUTLASS version"
#endif

#endif  // ORACLE_TRACE_CUTLASS_VERSION_HPP_
