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
//   TensorScaledLinearCombination (below: D = alpha * (scale_a * scale_b * acc) + beta * C, per-tensor
//   scales read from device pointers, the scale its own step as the oracle's default epilogue has it):
//     TapNode<epilogue_cast, D>( convert<D>( TapNode<epilogue_alpha_beta, fp32>( beta * C + alpha *
//       TapNode<epilogue_scale, fp32>( (scale_a * scale_b) * acc ) ) ) )
//   Any other fusion (bias, activation, row / column / block scales, auxiliary outputs): static_assert
//   naming what is traced.
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
                "oracle_trace::cutlass_sm90: this epilogue fusion has no traced tree. Traced: "
                "cutlass::epilogue::fusion::LinearCombination (alpha, beta, C) and "
                "oracle_trace::cutlass_sm90::TensorScaledLinearCombination (per-tensor scale_a, scale_b); "
                "no bias, activation, row/column/block scales or auxiliary outputs");
};

// D = alpha * (scale_a * scale_b * acc) + beta * C: fp8's per-tensor scales (one fp32 each, read
// from device memory), applied as their own step before alpha. CUTLASS's ScaledLinComb* fusions fold
// the scales into alpha (one scalar, one multiply); this one keeps the oracle's default epilogue
// order (scale, alpha_beta, cast), so each step is a stage. Built from CUTLASS's EVT nodes.
template <class ElementOutput_, class ElementCompute_, class ElementSource_ = ElementOutput_,
          class ElementScalar_ = ElementCompute_,
          cutlass::FloatRoundStyle RoundStyle_ = cutlass::FloatRoundStyle::round_to_nearest>
struct TensorScaledLinearCombination
    : cutlass::epilogue::fusion::LinearCombination<ElementOutput_, ElementCompute_, ElementSource_, ElementScalar_,
                                                   RoundStyle_> {};

template <class Operation>
constexpr bool is_tensor_scaled = false;
template <class Out, class Compute, class Source, class Scalar, cutlass::FloatRoundStyle Round>
constexpr bool is_tensor_scaled<TensorScaledLinearCombination<Out, Compute, Source, Scalar, Round>> = true;

using ScalarStride = cute::Stride<cute::_0, cute::_0, int64_t>;

// (scale_a * scale_b) * acc: CUTLASS's scalar broadcast multiplies its two pointers' values.
template <class Compute, class Scalar, cutlass::FloatRoundStyle Round>
using ScaledAcc = cutlass::epilogue::fusion::Sm90EVT<
    cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, Compute, Compute, Round>,
    cutlass::epilogue::fusion::Sm90ScalarBroadcast<Scalar, ScalarStride, 2>, cutlass::epilogue::fusion::Sm90AccFetch>;

// beta * C + alpha * x, x the scaled accumulator (through `Tap`, an identity node or a TapNode).
template <class Out, class Compute, class Source, class Scalar, cutlass::FloatRoundStyle Round, class X>
using ScaledLinearCombinationTree = cutlass::epilogue::fusion::Sm90EVT<
    cutlass::epilogue::fusion::Sm90Compute<cutlass::homogeneous_multiply_add, Out, Compute, Round>,
    cutlass::epilogue::fusion::Sm90ScalarBroadcast<Scalar, ScalarStride>, cutlass::epilogue::fusion::Sm90SrcFetch<Source>,
    cutlass::epilogue::fusion::Sm90EVT<cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, Compute, Compute, Round>,
                                       cutlass::epilogue::fusion::Sm90ScalarBroadcast<Scalar, ScalarStride>, X>>;

// The fusion's arguments: CUTLASS's LinearCombination ones plus the two scales.
template <class Scalar>
struct TensorScaledArguments {
  Scalar alpha = Scalar(1);
  Scalar beta = Scalar(0);
  Scalar const* alpha_ptr = nullptr;
  Scalar const* beta_ptr = nullptr;
  Scalar scale_a = Scalar(1);  // used where scale_a_ptr is null
  Scalar scale_b = Scalar(1);
  Scalar const* scale_a_ptr = nullptr;
  Scalar const* scale_b_ptr = nullptr;
  ScalarStride dAlpha = {cute::_0{}, cute::_0{}, 0};
  ScalarStride dBeta = {cute::_0{}, cute::_0{}, 0};
  ScalarStride dScale = {cute::_0{}, cute::_0{}, 0};

  // Fill the tree's arguments; `scaled(x)` reaches the ScaledAcc subtree's arguments from x's.
  template <class TreeArgs, class Scaled>
  void fill(TreeArgs& t, Scaled&& scaled) const {
    t.op_0.scalars[0] = beta;
    t.op_0.scalar_ptrs[0] = beta_ptr;
    t.op_0.dScalar[0] = dBeta;
    t.op_2.op_0.scalars[0] = alpha;
    t.op_2.op_0.scalar_ptrs[0] = alpha_ptr;
    t.op_2.op_0.dScalar[0] = dAlpha;
    auto& s = scaled(t.op_2.op_1);
    s.op_0.scalars[0] = scale_a;
    s.op_0.scalars[1] = scale_b;
    s.op_0.scalar_ptrs[0] = scale_a_ptr;
    s.op_0.scalar_ptrs[1] = scale_b_ptr;
    s.op_0.dScalar[0] = dScale;
    s.op_0.dScalar[1] = dScale;
  }
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

// TensorScaledLinearCombination's traced tree: the scaled accumulator, the FMA and the cast tapped.
template <class Out, class Compute, class Source, class Scalar, cutlass::FloatRoundStyle Round>
using TracedTensorScaledTree = cutlass::epilogue::fusion::Sm90EVT<
    TapNode<Stage::EpilogueCast, Out>,
    cutlass::epilogue::fusion::Sm90EVT<
        cutlass::epilogue::fusion::Sm90Compute<Pass, Out, Compute, Round>,
        cutlass::epilogue::fusion::Sm90EVT<
            TapNode<Stage::EpilogueAlphaBeta, Compute>,
            ScaledLinearCombinationTree<Compute, Compute, Source, Scalar, Round,
                                        cutlass::epilogue::fusion::Sm90EVT<TapNode<Stage::EpilogueScale, Compute>,
                                                                           ScaledAcc<Compute, Scalar, Round>>>>>>;

template <int StagesC, int StagesD, int FragmentSize, bool ReuseSmemC, bool DelayTmaStore, class ElementOutput,
          class ElementCompute, class ElementSource, class ElementScalar, cutlass::FloatRoundStyle RoundStyle,
          class CtaTile, class EpilogueTile>
struct TracedFusion<
    cutlass::epilogue::Sm90TmaWarpSpecialized<StagesC, StagesD, FragmentSize, ReuseSmemC, DelayTmaStore>,
    TensorScaledLinearCombination<ElementOutput, ElementCompute, ElementSource, ElementScalar, RoundStyle>, CtaTile,
    EpilogueTile>
    : TracedTensorScaledTree<typename cutlass::detail::get_unpacked_element_type<ElementOutput>::type, ElementCompute,
                             ElementSource, ElementScalar, RoundStyle> {
  using Impl = TracedTensorScaledTree<typename cutlass::detail::get_unpacked_element_type<ElementOutput>::type,
                                      ElementCompute, ElementSource, ElementScalar, RoundStyle>;
  using Operation = TensorScaledLinearCombination<ElementOutput, ElementCompute, ElementSource, ElementScalar,
                                                  RoundStyle>;

  struct Arguments : TensorScaledArguments<ElementScalar> {
    operator typename Impl::Arguments() const {
      typename Impl::Arguments a{};
      this->fill(a.op_0.op_0.op_0, [](auto& tapped) -> auto& { return tapped.op_0; });
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
// TensorScaledLinearCombination in production: the same tree without the taps.
template <int StagesC, int StagesD, int FragmentSize, bool ReuseSmemC, bool DelayTmaStore, class ElementOutput,
          class ElementCompute, class ElementSource, class ElementScalar, FloatRoundStyle RoundStyle, class CtaTile,
          class EpilogueTile>
struct FusionCallbacks<
    epilogue::Sm90TmaWarpSpecialized<StagesC, StagesD, FragmentSize, ReuseSmemC, DelayTmaStore>,
    oracle_trace::cutlass_sm90::TensorScaledLinearCombination<ElementOutput, ElementCompute, ElementSource,
                                                              ElementScalar, RoundStyle>,
    CtaTile, EpilogueTile>
    : oracle_trace::cutlass_sm90::ScaledLinearCombinationTree<
          typename cutlass::detail::get_unpacked_element_type<ElementOutput>::type, ElementCompute, ElementSource,
          ElementScalar, RoundStyle, oracle_trace::cutlass_sm90::ScaledAcc<ElementCompute, ElementScalar, RoundStyle>> {
  using Impl = oracle_trace::cutlass_sm90::ScaledLinearCombinationTree<
      typename cutlass::detail::get_unpacked_element_type<ElementOutput>::type, ElementCompute, ElementSource,
      ElementScalar, RoundStyle, oracle_trace::cutlass_sm90::ScaledAcc<ElementCompute, ElementScalar, RoundStyle>>;
  using Operation = oracle_trace::cutlass_sm90::TensorScaledLinearCombination<ElementOutput, ElementCompute,
                                                                              ElementSource, ElementScalar, RoundStyle>;

  struct Arguments : oracle_trace::cutlass_sm90::TensorScaledArguments<ElementScalar> {
    operator typename Impl::Arguments() const {
      typename Impl::Arguments a{};
      this->fill(a, [](auto& scaled) -> auto& { return scaled; });
      return a;
    }
  };

  using Impl::Impl;
};

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
