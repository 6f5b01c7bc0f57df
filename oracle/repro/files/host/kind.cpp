// host/kind.cpp -- which build of the host program this is: repro launches the untraced entry points,
// repro_traced (-DORACLE_REPRO_TRACED=1) the traced ones with the sink. The Makefile compiles repro.cu
// once (repro.o, -DORACLE_REPRO_KIND_LINKED) and links it with this file twice; repro.cu built alone
// includes it.
#ifndef ORACLE_REPRO_TRACED
#define ORACLE_REPRO_TRACED 0
#endif

namespace repro {
extern const bool kTracedBuild = ORACLE_REPRO_TRACED != 0;
}
