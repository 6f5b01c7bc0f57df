// oracle_trace/cutlass/sm90_epilogue.hpp -- CUTLASS's SM90 TMA epilogue with tap nodes in its
// visitor tree.
//
//   using CollectiveEpilogue = oracle_trace::cutlass_sm90::TracedEpilogue<BuiltEpilogue>;
//
// Without ORACLE_TRACE the alias IS BuiltEpilogue. With it, BuiltEpilogue (CUTLASS's
// CollectiveEpilogue<Sm90TmaWarpSpecialized<...>, ...> from the epilogue CollectiveBuilder) is
// re-instantiated with the same parameters except its fusion callbacks, replaced by a traced tree.
//
// TapNode<stage, T>: an EVT node with one child that returns the child's value unchanged and taps it
// (one Elements record per fragment, at tile coordinates), so it can sit anywhere in a tree.
//
// Traced trees (TracedCallbacks<Callbacks>):
//   LinearCombination (D = alpha * acc + beta * C), CUTLASS's tree with the final convert split out:
//     TapNode<epilogue_cast, D>( convert<D>( TapNode<epilogue_alpha_beta, fp32>( beta * C + alpha * acc ) ) )
//   so the fp32 value before the cast is observable. CUTLASS's node computes the same FMA in the
//   compute type and converts with the same rounding, so the values are unchanged. The callbacks'
//   Arguments are CUTLASS's (alpha, beta, alpha_ptr, beta_ptr, dAlpha, dBeta).
//   Any other fusion: static_assert (not traced in this version).
//
// Constraints: taps carry tile (m, n) from the epilogue's own tile coordinate and the group (batch
// entry) when L > 1; elements past M or N are tapped as the registers hold them (the oracle excludes
// padding). Each fragment is one record: a traced tile costs about 60 bytes per element per stage.

#ifndef ORACLE_TRACE_CUTLASS_SM90_EPILOGUE_HPP_
#define ORACLE_TRACE_CUTLASS_SM90_EPILOGUE_HPP_

#include "cute/tensor.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/callbacks.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "oracle_trace/cutlass/types.hpp"
#include "oracle_trace/cutlass/version.hpp"
#include "oracle_trace/trace.cuh"

namespace oracle_trace::cutlass_sm90 {

template <class T>
struct Pass {
  CUTLASS_HOST_DEVICE T operator()(T const& x) const { return x; }
};

// An EVT node: out = in, and `in` tapped as `stage` (values of type T).
template <Stage S, class T>
struct TapNode : cutlass::epilogue::fusion::Sm90Compute<Pass, T, T, cutlass::FloatRoundStyle::round_to_nearest> {
  using Base = cutlass::epilogue::fusion::Sm90Compute<Pass, T, T, cutlass::FloatRoundStyle::round_to_nearest>;
  using Base::Base;

  template <class CoordTensor>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CoordTensor tCcD;  // (CPY, CPY_M, CPY_N, EPI_M, EPI_N): coordinates relative to (row0, col0)
    int row0, col0;    // tile coordinate of tCcD's origin
    int tile_m, tile_n, group, bm, bn;

    CUTLASS_DEVICE ConsumerStoreCallbacks(CoordTensor c, int r0, int c0, int tm, int tn, int g, int m, int n)
        : tCcD(c), row0(r0), col0(c0), tile_m(tm), tile_n(tn), group(g), bm(m), bn(n) {}

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<ElementInput, FragmentSize> visit(
        cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int epi_m, int epi_n,
        cutlass::Array<ElementInput, FragmentSize> const& in) {
      using Tr = Tracer<true>;
      if constexpr (Tr::enabled) {
        using V = trace_value_t<ElementInput>;
        auto coords = tCcD(cute::_, cute::_, cute::_, epi_m, epi_n);
        Tr::tap_elements(S, Site{tile_m, tile_n, kNone, kNone, kNone, group}, bm, bn, FragmentSize, [&](int i) {
          auto c = coords(epi_v * FragmentSize + i);
          return Element<V>{row0 + int(cute::get<0>(c)), col0 + int(cute::get<1>(c)), to_trace(ElementInput(in[i]))};
        });
      }
      return in;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(
      cutlass::epilogue::fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    auto [M, N, K, L] = args.problem_shape_mnkl;
    auto [m, n, k, l] = args.tile_coord_mnkl;
    const int bm = int(cute::size<0>(args.tile_shape_mnk)), bn = int(cute::size<1>(args.tile_shape_mnk));
    // residue_tCcD = (M, N) - (absolute coordinate of tCcD's origin)
    const int row0 = int(M) - int(cute::get<0>(args.residue_tCcD)) - int(m) * bm;
    const int col0 = int(N) - int(cute::get<1>(args.residue_tCcD)) - int(n) * bn;
    const int group = int(L) > 1 ? int(l) : kNone;
    return ConsumerStoreCallbacks<decltype(args.tCcD)>(args.tCcD, row0, col0, int(m), int(n), group, bm, bn);
  }
};

template <class Policy, class Operation, class CtaTile, class EpilogueTile>
struct TracedFusion {
  static_assert(cutlass::detail::dependent_false<Operation>,
                "oracle_trace::cutlass_sm90: this epilogue fusion has no traced tree (LinearCombination has)");
};

// LinearCombination's traced tree: CUTLASS's tree computing in Compute, the convert to Out split out.
template <class Out, class Compute, class Source, class Scalar, cutlass::FloatRoundStyle Round>
using TracedLinearCombinationTree = cutlass::epilogue::fusion::Sm90EVT<
    TapNode<Stage::EpilogueCast, Out>,
    cutlass::epilogue::fusion::Sm90EVT<
        cutlass::epilogue::fusion::Sm90Compute<Pass, Out, Compute, Round>,
        cutlass::epilogue::fusion::Sm90EVT<
            TapNode<Stage::EpilogueAlphaBeta, Compute>,
            cutlass::epilogue::fusion::Sm90LinearCombination<Compute, Compute, Source, Scalar, Round>>>>;

template <int StagesC, int StagesD, int FragmentSize, bool ReuseSmemC, bool DelayTmaStore, class ElementOutput,
          class ElementCompute, class ElementSource, class ElementScalar, cutlass::FloatRoundStyle RoundStyle,
          class CtaTile, class EpilogueTile>
struct TracedFusion<
    cutlass::epilogue::Sm90TmaWarpSpecialized<StagesC, StagesD, FragmentSize, ReuseSmemC, DelayTmaStore>,
    cutlass::epilogue::fusion::LinearCombination<ElementOutput, ElementCompute, ElementSource, ElementScalar,
                                                 RoundStyle>,
    CtaTile, EpilogueTile>
    : TracedLinearCombinationTree<typename cutlass::detail::get_unpacked_element_type<ElementOutput>::type,
                                  ElementCompute, ElementSource, ElementScalar, RoundStyle> {
  using Impl = TracedLinearCombinationTree<typename cutlass::detail::get_unpacked_element_type<ElementOutput>::type,
                                           ElementCompute, ElementSource, ElementScalar, RoundStyle>;
  using Policy = cutlass::epilogue::Sm90TmaWarpSpecialized<StagesC, StagesD, FragmentSize, ReuseSmemC, DelayTmaStore>;
  using Operation = cutlass::epilogue::fusion::LinearCombination<ElementOutput, ElementCompute, ElementSource,
                                                                 ElementScalar, RoundStyle>;
  // CUTLASS's own callbacks for the same combination producing ElementCompute: the FMA subtree.
  using Fma = cutlass::epilogue::fusion::FusionCallbacks<
      Policy, cutlass::epilogue::fusion::LinearCombination<ElementCompute, ElementCompute, ElementSource, ElementScalar,
                                                           RoundStyle>,
      CtaTile, EpilogueTile>;
  static_assert(cute::is_same_v<typename Fma::Impl,
                                cutlass::epilogue::fusion::Sm90LinearCombination<ElementCompute, ElementCompute,
                                                                                 ElementSource, ElementScalar,
                                                                                 RoundStyle>>,
                "the FMA subtree is CUTLASS's LinearCombination tree");
  // CUTLASS's arguments (alpha, beta, alpha_ptr, beta_ptr, dAlpha, dBeta), handed to the FMA subtree.
  struct Arguments : Fma::Arguments {
    operator typename Impl::Arguments() const {
      typename Impl::Arguments a{};
      a.op_0.op_0.op_0 = static_cast<typename Fma::Impl::Arguments>(static_cast<typename Fma::Arguments const&>(*this));
      return a;
    }
  };

  using Impl::Impl;
};

template <class Callbacks>
struct TracedCallbacks {
  static_assert(cutlass::detail::dependent_false<Callbacks>,
                "oracle_trace::cutlass_sm90: the epilogue's callbacks are not CUTLASS's FusionCallbacks");
};
template <class Policy, class Operation, class CtaTile, class EpilogueTile>
struct TracedCallbacks<cutlass::epilogue::fusion::FusionCallbacks<Policy, Operation, CtaTile, EpilogueTile>> {
  using type = TracedFusion<Policy, Operation, CtaTile, EpilogueTile>;
};

template <class Epilogue>
struct TracedEpilogueOf {
  static_assert(cutlass::detail::dependent_false<Epilogue>,
                "oracle_trace::cutlass_sm90: TracedEpilogue takes CUTLASS's Sm90TmaWarpSpecialized collective epilogue");
};

template <int StagesC, int StagesD, int FragmentSize, bool ReuseSmemC, bool DelayTmaStore, class CtaTile,
          class EpilogueTile, class ElementC, class StrideC, class ElementD, class StrideD, class Callbacks,
          class... Rest>
struct TracedEpilogueOf<cutlass::epilogue::collective::CollectiveEpilogue<
    cutlass::epilogue::Sm90TmaWarpSpecialized<StagesC, StagesD, FragmentSize, ReuseSmemC, DelayTmaStore>, CtaTile,
    EpilogueTile, ElementC, StrideC, ElementD, StrideD, Callbacks, Rest...>> {
  using type = cutlass::epilogue::collective::CollectiveEpilogue<
      cutlass::epilogue::Sm90TmaWarpSpecialized<StagesC, StagesD, FragmentSize, ReuseSmemC, DelayTmaStore>, CtaTile,
      EpilogueTile, ElementC, StrideC, ElementD, StrideD, typename TracedCallbacks<Callbacks>::type, Rest...>;
};

#if defined(ORACLE_TRACE)
template <class Epilogue>
using TracedEpilogue = typename TracedEpilogueOf<Epilogue>::type;
#else
template <class Epilogue>
using TracedEpilogue = Epilogue;
#endif

}  // namespace oracle_trace::cutlass_sm90

namespace cutlass::epilogue::fusion {
// The collective epilogue asks its callbacks' traits for the operation and the compute type.
template <class Policy, class Operation_, class CtaTile, class EpilogueTile>
struct FusionCallbacksTraits<oracle_trace::cutlass_sm90::TracedFusion<Policy, Operation_, CtaTile, EpilogueTile>> {
  using DispatchPolicy = Policy;
  using Callbacks = oracle_trace::cutlass_sm90::TracedFusion<Policy, Operation_, CtaTile, EpilogueTile>;
  using Operation = Operation_;
  using CtaTile_MNK = CtaTile;
  using EpilogueTile_MN = EpilogueTile;
  using ElementCompute = typename Operation_::ElementCompute;
};
}  // namespace cutlass::epilogue::fusion

#endif  // ORACLE_TRACE_CUTLASS_SM90_EPILOGUE_HPP_
