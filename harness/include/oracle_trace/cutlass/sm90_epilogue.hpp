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
//   LinCombEltAct (D = act(alpha * acc + beta * C)): CUTLASS's LinearCombination subtree in fp32 tapped as
//     epilogue_alpha_beta, the activation in fp32 (epilogue_activation), the cast (epilogue_cast).
//   LinCombPerRowBias / LinCombPerColBias[EltAct] (D = [act](alpha * acc + bias + beta * C)), CUTLASS's tree
//   with its two FMAs kept as they are: alpha * acc + bias (epilogue_bias; alpha * acc computed beside it
//   from the same accumulator and alpha by a ProbeNode, tapped as epilogue_alpha), beta * C + x
//   (epilogue_beta_c; its tap off where beta is 0 and no beta pointer is given), [the activation,] the
//   cast. Arguments: CUTLASS's own for the operation (alpha, beta, bias_ptr, dBias, activation, ...).
//   Activations: ReLu (relu), GELU (gelu_erf), GELU_taylor (gelu_tanh), SiLu (silu); another (Clamp, ...)
//   has no oracle counterpart: static_assert.
//   Any other fusion (row / column / block scales, auxiliary outputs): static_assert naming what is traced.
//
// A user's own tree (an Sm90EVT given to the epilogue builder as its fusion) is taken as written:
// Tap<stage, Node> and Fused<stage, Node> (below) mark its steps.
//
// The order: StepsOf<Tree>::type lists a tree's steps in the order the visitor computes them (its
// TapNodes, ProbeNodes, Taps and Fused marks; children left to right, then the node), OrderText
// spells them as a case's `epilogue` tokens; the entry macros keep that text in the traced library,
// where the oracle reads it (oracle/run/library_epilogue.py).
//
// Constraints: taps carry tile (m, n) from the epilogue's own tile coordinate (counted from the batch
// entry's first row) and the group (the batch entry l) when L > 1; a grouped GEMM's pointer-array
// epilogue (Sm90PtrArrayTmaWarpSpecialized) gets its LinearCombination traced by cutlass/sm90_grouped.hpp,
// whose taps name the group; elements past M or N are tapped as the registers hold them (the oracle excludes
// padding). Each fragment is one record: a traced tile costs about 60 bytes per element per stage.

#ifndef ORACLE_TRACE_CUTLASS_SM90_EPILOGUE_HPP_
#define ORACLE_TRACE_CUTLASS_SM90_EPILOGUE_HPP_

#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/callbacks.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/epilogue/thread/activation.h"
#include "oracle_trace/cutlass/checks.hpp"
#include "oracle_trace/cutlass/types.hpp"
#include "oracle_trace/cutlass/version.hpp"
#include "oracle_trace/trace.cuh"

namespace oracle_trace::cutlass_sm90 {

template <class T>
struct Pass {
  CUTLASS_HOST_DEVICE T operator()(T const& x) const { return x; }
};

// A tap's compute function: the identity, with one argument (Sm90Compute takes a function's Arguments
// as the node's): `off`, the step does nothing in this launch (beta * C with beta == 0), so it is not
// a declared step and nothing is tapped.
template <class T>
struct TapPass : Pass<T> {
  struct Arguments {
    bool off = false;
  };
};

// An EVT node: out = in, and `in` tapped as `stage` (values of type T).
template <Stage S, class T>
struct TapNode : cutlass::epilogue::fusion::Sm90Compute<TapPass, T, T, cutlass::FloatRoundStyle::round_to_nearest> {
  using Base = cutlass::epilogue::fusion::Sm90Compute<TapPass, T, T, cutlass::FloatRoundStyle::round_to_nearest>;
  using Base::Base;

  template <class CoordTensor>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CoordTensor tCcD;  // (CPY, CPY_M, CPY_N, EPI_M, EPI_N): coordinates relative to (row0, col0)
    int row0, col0;    // tile coordinate of tCcD's origin
    int tile_m, tile_n, group, bm, bn;
    bool off;

    CUTLASS_DEVICE ConsumerStoreCallbacks(CoordTensor c, int r0, int c0, int tm, int tn, int g, int m, int n, bool o)
        : tCcD(c), row0(r0), col0(c0), tile_m(tm), tile_n(tn), group(g), bm(m), bn(n), off(o) {}

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<ElementInput, FragmentSize> visit(
        cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int epi_m, int epi_n,
        cutlass::Array<ElementInput, FragmentSize> const& in) {
      using Tr = Tracer<true>;
      if constexpr (Tr::enabled) {
        if (off) return in;
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
    return make_callbacks<ConsumerStoreCallbacks>(args);
  }

  template <template <class> class Callbacks, class... Args>
  CUTLASS_DEVICE auto make_callbacks(cutlass::epilogue::fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    auto [M, N, K, L] = args.problem_shape_mnkl;
    auto [m, n, k, l] = args.tile_coord_mnkl;
    const int bm = int(cute::size<0>(args.tile_shape_mnk)), bn = int(cute::size<1>(args.tile_shape_mnk));
    // residue_tCcD = (M, N) - (absolute coordinate of tCcD's origin)
    const int row0 = int(M) - int(cute::get<0>(args.residue_tCcD)) - int(m) * bm;
    const int col0 = int(N) - int(cute::get<1>(args.residue_tCcD)) - int(n) * bn;
    const int group = int(L) > 1 ? int(l) : kNone;
    return Callbacks<decltype(args.tCcD)>(args.tCcD, row0, col0, int(m), int(n), group, bm, bn, this->params.off);
  }
};

// An EVT node of two children: taps the first's value as stage S and returns the second's unchanged.
// The first is computed for the tap alone: CUTLASS's FMA alpha * acc + bias never holds alpha * acc, so
// the adapter's trees compute it beside the FMA from the same accumulator and alpha, and the step
// before the bias is the kernel's own value, not a reference stand-in.
template <Stage S, class T>
struct ProbeNode : TapNode<S, T> {
  using TapNode<S, T>::TapNode;

  template <class CoordTensor>
  struct ProbeCallbacks : TapNode<S, T>::template ConsumerStoreCallbacks<CoordTensor> {
    using Tapped = typename TapNode<S, T>::template ConsumerStoreCallbacks<CoordTensor>;
    using Tapped::Tapped;

    template <class ElementAccumulator, class ElementProbe, class ElementValue, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<ElementValue, FragmentSize> visit(
        cutlass::Array<ElementAccumulator, FragmentSize> const& acc, int epi_v, int epi_m, int epi_n,
        cutlass::Array<ElementProbe, FragmentSize> const& probe, cutlass::Array<ElementValue, FragmentSize> const& value) {
      Tapped::visit(acc, epi_v, epi_m, epi_n, probe);
      return value;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(
      cutlass::epilogue::fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    return this->template make_callbacks<ProbeCallbacks>(args);
  }
};

// ---- The steps a tree declares: its tap nodes in the order the tree computes them ----

// A step of the epilogue computed inside Node and not tapped on its own (CUTLASS's alpha in the FMA
// alpha * acc + bias): declared before Node's own steps. Node itself, with a name the order reads.
template <Stage S, class Node>
struct FusedNode : Node {
  using Node::Node;
};

// Node with its result tapped as stage S, in type T (the node's compute type: float, or the output
// type at the cast), as the adapter's own trees write it: its arguments are {Node's, the tap's}.
template <Stage S, class Node, class T = float>
using TapTree = cutlass::epilogue::fusion::Sm90EVT<TapNode<S, T>, Node>;

// The same for a user's tree, with Node's own arguments (so that the user's argument braces are the
// same with and without ORACLE_TRACE).
template <Stage S, class Node, class T = float>
struct TappedNode : TapTree<S, Node, T> {
  using Tree = TapTree<S, Node, T>;
  using Arguments = typename Node::Arguments;
  using Params = typename Tree::Params;
  using Tree::Tree;

  static typename Tree::Arguments tree_arguments(Arguments const& a) { return {a, {}}; }
  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const& shape, Arguments const& a, void* workspace) {
    return Tree::to_underlying_arguments(shape, tree_arguments(a), workspace);
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const& shape, Arguments const& a) {
    return Tree::can_implement(shape, tree_arguments(a));
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const& shape, Arguments const& a) {
    return Tree::get_workspace_size(shape, tree_arguments(a));
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const& shape, Arguments const& a, void* workspace,
                                              cudaStream_t stream, cutlass::CudaHostAdapter* adapter = nullptr) {
    return Tree::initialize_workspace(shape, tree_arguments(a), workspace, stream, adapter);
  }
};

// A user's own tree (an Sm90EVT written by hand, given to the epilogue CollectiveBuilder as its
// fusion): Tap<stage, Node> around each node whose result is a step of the epilogue, in the type it
// computes (float; the last, Tap<Stage::EpilogueCast, Node, ElementD>, in the output type), and
// Fused<stage, Node> where a step happens inside Node untapped (alpha in CUTLASS's FMA alpha * acc +
// bias). The tree's order is its Tap and Fused nodes in the order the visitor computes them (children
// left to right, then the node; a Fused step before Node's own): the traced library keeps it as text,
// and the oracle reads it from the built file before running it (a case without `epilogue` is judged
// in that order; one that declares another is refused, naming both). The arguments are Node's, so
// the code filling them is the same in both builds; without ORACLE_TRACE both are Node itself, so the
// production tree is the user's, type for type.
#if defined(ORACLE_TRACE)
template <Stage S, class Node, class T = float>
using Tap = TappedNode<S, Node, T>;
template <Stage S, class Node>
using Fused = FusedNode<S, Node>;
#else
template <Stage S, class Node, class T = float>
using Tap = Node;
template <Stage S, class Node>
using Fused = Node;
#endif

template <Stage... S>
struct Steps {
  static constexpr int size = sizeof...(S);
};

template <class... Lists>
struct JoinSteps {
  using type = Steps<>;
};
template <Stage... A>
struct JoinSteps<Steps<A...>> {
  using type = Steps<A...>;
};
template <Stage... A, Stage... B, class... Rest>
struct JoinSteps<Steps<A...>, Steps<B...>, Rest...> {
  using type = typename JoinSteps<Steps<A..., B...>, Rest...>::type;
};

// StepsOf<Tree>::type: the tree's steps in the order its visitor computes them (children left to
// right, then the node; a topological visitor's ops in their order). A node the walk does not know
// declares none.
template <class Node>
struct StepsOf {
  using type = Steps<>;
};
template <Stage S, class T>
struct StepsOf<TapNode<S, T>> {
  using type = Steps<S>;
};
template <Stage S, class Node, class T>
struct StepsOf<TappedNode<S, Node, T>> {
  using type = typename JoinSteps<typename StepsOf<Node>::type, Steps<S>>::type;
};
template <Stage S, class Node>
struct StepsOf<FusedNode<S, Node>> {
  using type = typename JoinSteps<Steps<S>, typename StepsOf<Node>::type>::type;
};
template <class NodeOp, class... Children>
struct StepsOf<cutlass::epilogue::fusion::Sm90TreeVisitor<NodeOp, Children...>> {
  using type = typename JoinSteps<typename StepsOf<Children>::type..., typename StepsOf<NodeOp>::type>::type;
};
template <Stage S, class T, class Probe, class Value>
struct StepsOf<cutlass::epilogue::fusion::Sm90TreeVisitor<ProbeNode<S, T>, Probe, Value>> {  // the probe's step first
  using type = typename JoinSteps<typename StepsOf<Probe>::type, Steps<S>, typename StepsOf<Value>::type>::type;
};
template <class Compute, class Edges, class... Ops>
struct StepsOf<cutlass::epilogue::fusion::Sm90TopologicalVisitor<Compute, Edges, Ops...>> {
  using type = typename JoinSteps<typename StepsOf<Ops>::type...>::type;
};

// A step's token as a case's `epilogue` spells it (docs/epilogue.md); nullptr: not an epilogue step.
constexpr const char* step_token(Stage s) {
  switch (s) {
    case Stage::EpilogueScale: return "scale";
    case Stage::EpilogueAlphaBeta: return "alpha_beta";
    case Stage::EpilogueAlpha: return "alpha";
    case Stage::EpilogueBetaC: return "beta_c";
    case Stage::EpilogueBias: return "bias";
    case Stage::EpilogueActivation: return "activation";
    case Stage::EpilogueCast: return "cast";
    default: return nullptr;
  }
}

constexpr int text_length(const char* s) {
  int n = 0;
  while (s != nullptr && s[n] != '\0') ++n;
  return n;
}

// The order as text the oracle reads from the built library: kOrderPrefix, then the tokens joined
// by commas, NUL-terminated (oracle/run/adapters.py library_epilogue).
inline constexpr char kOrderPrefix[] = "oracle_trace:epilogue_order=";

template <class List>
struct OrderText;
template <Stage... S>
struct OrderText<Steps<S...>> {
  static constexpr bool all_steps = ((step_token(S) != nullptr) && ... && true);
  static constexpr int bytes = text_length(kOrderPrefix) + (0 + ... + (text_length(step_token(S)) + 1)) + 1;
  struct Text {
    char c[bytes];
  };
  static constexpr Text make() {
    Text t{};
    int n = 0;
    for (int i = 0; kOrderPrefix[i] != '\0'; ++i) t.c[n++] = kOrderPrefix[i];
    const Stage order[] = {S..., Stage::EpilogueCast};  // one more: never empty
    for (int j = 0; j < int(sizeof...(S)); ++j) {
      if (j > 0) t.c[n++] = ',';
      for (const char* p = step_token(order[j]); p != nullptr && *p != '\0'; ++p) t.c[n++] = *p;
    }
    t.c[n] = '\0';
    return t;
  }
  static constexpr Text value = make();
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

// ---- CUTLASS's bias and activation fusions (operations.hpp), their trees re-instantiated with taps ----

// The oracle's activation of a CUTLASS activation functor (launch.hpp's Activation codes); Clamp and
// the others have none: -1.
template <template <class> class Act>
constexpr int activation_code() {
  namespace th = cutlass::epilogue::thread;
  if constexpr (cute::is_same_v<Act<float>, th::Identity<float>>) return int(Activation::None);
  else if constexpr (cute::is_same_v<Act<float>, th::ReLu<float>>) return int(Activation::Relu);
  else if constexpr (cute::is_same_v<Act<float>, th::GELU<float>>) return int(Activation::GeluErf);
  else if constexpr (cute::is_same_v<Act<float>, th::GELU_taylor<float>>) return int(Activation::GeluTanh);
  else if constexpr (cute::is_same_v<Act<float>, th::SiLu<float>>) return int(Activation::Silu);
  else return -1;
}

template <template <class> class Act>
struct ActivationCheck {
  static_assert(activation_code<Act>() >= 0,
                "oracle_trace::cutlass_sm90: the fusion's activation has no counterpart among the oracle's "
                "(cutlass::epilogue::thread::ReLu: relu, GELU: gelu_erf, GELU_taylor: gelu_tanh, SiLu: silu); "
                "Clamp and the others are not judged");
  static constexpr bool ok = true;
};

namespace fusion = cutlass::epilogue::fusion;
using ScalarArgs = ScalarStride;

// What a traced fusion adds to alpha, beta and C: its bias (launch.hpp's BiasKind) and activation.
// A user's own tree (any callbacks that are not FusionCallbacks): unknown, -1 each.
template <class Operation>
struct FusionFacts {
  static constexpr bool traced = false;
  static constexpr int bias = -1, activation = -1;
};
template <class Out, class Compute, class Source, class Scalar, cutlass::FloatRoundStyle Round>
struct FusionFacts<fusion::LinearCombination<Out, Compute, Source, Scalar, Round>> {
  static constexpr bool traced = true;
  static constexpr int bias = int(BiasKind::None), activation = int(Activation::None);
};
template <class Out, class Compute, class Source, class Scalar, cutlass::FloatRoundStyle Round>
struct FusionFacts<TensorScaledLinearCombination<Out, Compute, Source, Scalar, Round>>
    : FusionFacts<fusion::LinearCombination<Out, Compute, Source, Scalar, Round>> {};
template <template <class> class Act, class Out, class Compute, class Source, class Scalar, cutlass::FloatRoundStyle Round>
struct FusionFacts<fusion::LinCombEltAct<Act, Out, Compute, Source, Scalar, Round>> {
  static constexpr bool traced = true;
  static constexpr int bias = int(BiasKind::None), activation = activation_code<Act>();
};
template <class Out, class Compute, class Bias, class Source, class Scalar, int Align, cutlass::FloatRoundStyle Round>
struct FusionFacts<fusion::LinCombPerRowBias<Out, Compute, Bias, Source, Scalar, Align, Round>> {
  static constexpr bool traced = true;
  static constexpr int bias = int(BiasKind::Row), activation = int(Activation::None);
};
template <class Out, class Compute, class Bias, class Source, class Scalar, int Align, cutlass::FloatRoundStyle Round>
struct FusionFacts<fusion::LinCombPerColBias<Out, Compute, Bias, Source, Scalar, Align, Round>> {
  static constexpr bool traced = true;
  static constexpr int bias = int(BiasKind::Col), activation = int(Activation::None);
};
template <template <class> class Act, class Out, class Compute, class Bias, class Source, class Scalar, int Align,
          cutlass::FloatRoundStyle Round>
struct FusionFacts<fusion::LinCombPerRowBiasEltAct<Act, Out, Compute, Bias, Source, Scalar, Align, Round>> {
  static constexpr bool traced = true;
  static constexpr int bias = int(BiasKind::Row), activation = activation_code<Act>();
};
template <template <class> class Act, class Out, class Compute, class Bias, class Source, class Scalar, int Align,
          cutlass::FloatRoundStyle Round>
struct FusionFacts<fusion::LinCombPerColBiasEltAct<Act, Out, Compute, Bias, Source, Scalar, Align, Round>> {
  static constexpr bool traced = true;
  static constexpr int bias = int(BiasKind::Col), activation = activation_code<Act>();
};

// x, then the activation in Compute, tapped.
template <class X, template <class> class Act, class Compute, cutlass::FloatRoundStyle Round>
struct Activated {
  using type = TapTree<Stage::EpilogueActivation, fusion::Sm90EVT<fusion::Sm90Compute<Act, Compute, Compute, Round>, X>,
                       Compute>;
};

// The cast to Out, split out of CUTLASS's last node (which computes in Compute and converts to Out
// with the same rounding) and tapped.
template <class X, class Out, class Compute, cutlass::FloatRoundStyle Round>
using CastTree =
    TapTree<Stage::EpilogueCast, fusion::Sm90EVT<fusion::Sm90Compute<Pass, Out, Compute, Round>, X>, Out>;

// CUTLASS's Sm90LinCombPerRowBias / PerColBias subtree in Compute, tapped: alpha * acc + bias as one
// FMA (bias tapped; alpha * acc computed beside it for the alpha tap), then beta * C + x as one FMA
// (beta_c tapped).
template <class Compute, class Scalar, cutlass::FloatRoundStyle Round>
using AlphaProbe = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, Compute, Compute, Round>,
                                   fusion::Sm90ScalarBroadcast<Scalar, ScalarStride>, fusion::Sm90AccFetch>;
template <class Compute, class Source, class Scalar, cutlass::FloatRoundStyle Round, class BiasLeaf>
using BiasTree = TapTree<
    Stage::EpilogueBetaC,
    fusion::Sm90EVT<fusion::Sm90Compute<cutlass::homogeneous_multiply_add, Compute, Compute, Round>,
                    fusion::Sm90ScalarBroadcast<Scalar, ScalarStride>, fusion::Sm90SrcFetch<Source>,
                    fusion::Sm90EVT<ProbeNode<Stage::EpilogueAlpha, Compute>, AlphaProbe<Compute, Scalar, Round>,
                                    TapTree<Stage::EpilogueBias,
                                            fusion::Sm90EVT<fusion::Sm90Compute<cutlass::homogeneous_multiply_add,
                                                                                Compute, Compute, Round>,
                                                            fusion::Sm90ScalarBroadcast<Scalar, ScalarStride>,
                                                            fusion::Sm90AccFetch, BiasLeaf>,
                                            Compute>>>,
    Compute>;

// The bias leaves CUTLASS's trees use: per row (one per m: CUTLASS's ColBroadcast), per column.
template <class CtaTile, class Bias, class Compute, int Align>
using RowBiasLeaf = fusion::Sm90ColBroadcast<0, CtaTile, Bias, Compute, cute::Stride<cute::_1, cute::_0, int64_t>, Align>;
template <int StagesC, class CtaTile, class EpilogueTile, class Bias, class Compute, int Align>
using ColBiasLeaf = fusion::Sm90RowBroadcast<0, CtaTile, Bias, Compute, cute::Stride<cute::_0, cute::_1, int64_t>, Align>;

// The arguments of the traced bias trees, from CUTLASS's own (the same fields: alpha, beta, their
// pointers and strides, bias_ptr, dBias, activation). The beta_c tap is off where beta is 0 (no C).
template <class Tree, class CutlassArguments, bool kActivation>
typename Tree::Arguments bias_tree_arguments(CutlassArguments const& a) {
  typename Tree::Arguments t{};
  auto& cast_in = t.op_0.op_0;  // CastTree: tap(convert(x)): x's arguments
  auto fill = [&](auto& beta_tree) {
    auto& fma = beta_tree.op_0;
    fma.op_0 = {{a.beta}, {a.beta_ptr}, {a.dBeta}};
    auto& probe = fma.op_2;            // probe(alpha * acc, tap(alpha * acc + bias))
    probe.op_0.op_0 = {{a.alpha}, {a.alpha_ptr}, {a.dAlpha}};
    auto& alpha_bias = probe.op_1.op_0;
    alpha_bias.op_0 = {{a.alpha}, {a.alpha_ptr}, {a.dAlpha}};
    using Bias = std::remove_cv_t<std::remove_pointer_t<decltype(a.bias_ptr)>>;
    alpha_bias.op_2 = {a.bias_ptr, Bias(0), a.dBias};
    beta_tree.op_1.off = a.beta == decltype(a.beta)(0) && a.beta_ptr == nullptr;
  };
  if constexpr (kActivation) {
    auto& act = cast_in;  // tap(activation(y))
    fill(act.op_0.op_0);
    act.op_0.op_1 = a.activation;
  } else {
    fill(cast_in);
  }
  return t;
}

template <class Policy, class Operation, class CtaTile, class EpilogueTile, class Tree, bool kActivation>
struct TracedBiasFusion : Tree {
  using Impl = Tree;
  using BiasFusion = TracedBiasFusion;
  // CUTLASS's own Arguments for this operation, so that the user's code fills the same fields.
  struct Arguments : fusion::FusionCallbacks<Policy, Operation, CtaTile, EpilogueTile>::Arguments {
    operator typename Impl::Arguments() const { return bias_tree_arguments<Impl, Arguments, kActivation>(*this); }
  };
  using Impl::Impl;
};

#define ORACLE_SM90_POLICY \
  cutlass::epilogue::Sm90TmaWarpSpecialized<StagesC, StagesD, FragmentSize, ReuseSmemC, DelayTmaStore>
#define ORACLE_SM90_POLICY_PARAMS int StagesC, int StagesD, int FragmentSize, bool ReuseSmemC, bool DelayTmaStore

template <ORACLE_SM90_POLICY_PARAMS, class Out, class Compute, class Bias, class Source, class Scalar, int Align,
          cutlass::FloatRoundStyle Round, class CtaTile, class EpilogueTile>
struct TracedFusion<ORACLE_SM90_POLICY, fusion::LinCombPerRowBias<Out, Compute, Bias, Source, Scalar, Align, Round>,
                    CtaTile, EpilogueTile>
    : TracedBiasFusion<ORACLE_SM90_POLICY, fusion::LinCombPerRowBias<Out, Compute, Bias, Source, Scalar, Align, Round>,
                       CtaTile, EpilogueTile,
                       CastTree<BiasTree<Compute, Source, Scalar, Round, RowBiasLeaf<CtaTile, Bias, Compute, Align>>,
                                typename cutlass::detail::get_unpacked_element_type<Out>::type, Compute, Round>,
                       false> {
  using Operation = fusion::LinCombPerRowBias<Out, Compute, Bias, Source, Scalar, Align, Round>;
  using Inherited = typename TracedFusion::BiasFusion;
  using Inherited::Inherited;
};

template <ORACLE_SM90_POLICY_PARAMS, class Out, class Compute, class Bias, class Source, class Scalar, int Align,
          cutlass::FloatRoundStyle Round, class CtaTile, class EpilogueTile>
struct TracedFusion<ORACLE_SM90_POLICY, fusion::LinCombPerColBias<Out, Compute, Bias, Source, Scalar, Align, Round>,
                    CtaTile, EpilogueTile>
    : TracedBiasFusion<
          ORACLE_SM90_POLICY, fusion::LinCombPerColBias<Out, Compute, Bias, Source, Scalar, Align, Round>, CtaTile,
          EpilogueTile,
          CastTree<BiasTree<Compute, Source, Scalar, Round, ColBiasLeaf<StagesC, CtaTile, EpilogueTile, Bias, Compute, Align>>,
                   typename cutlass::detail::get_unpacked_element_type<Out>::type, Compute, Round>,
          false> {
  using Operation = fusion::LinCombPerColBias<Out, Compute, Bias, Source, Scalar, Align, Round>;
  using Inherited = typename TracedFusion::BiasFusion;
  using Inherited::Inherited;
};

template <ORACLE_SM90_POLICY_PARAMS, template <class> class Act, class Out, class Compute, class Bias, class Source,
          class Scalar, int Align, cutlass::FloatRoundStyle Round, class CtaTile, class EpilogueTile>
struct TracedFusion<ORACLE_SM90_POLICY,
                    fusion::LinCombPerRowBiasEltAct<Act, Out, Compute, Bias, Source, Scalar, Align, Round>, CtaTile,
                    EpilogueTile>
    : TracedBiasFusion<
          ORACLE_SM90_POLICY, fusion::LinCombPerRowBiasEltAct<Act, Out, Compute, Bias, Source, Scalar, Align, Round>,
          CtaTile, EpilogueTile,
          CastTree<typename Activated<BiasTree<Compute, Source, Scalar, Round, RowBiasLeaf<CtaTile, Bias, Compute, Align>>,
                                      Act, Compute, Round>::type,
                   typename cutlass::detail::get_unpacked_element_type<Out>::type, Compute, Round>,
          true> {
  static_assert(ActivationCheck<Act>::ok, "");
  using Operation = fusion::LinCombPerRowBiasEltAct<Act, Out, Compute, Bias, Source, Scalar, Align, Round>;
  using Inherited = typename TracedFusion::BiasFusion;
  using Inherited::Inherited;
};

template <ORACLE_SM90_POLICY_PARAMS, template <class> class Act, class Out, class Compute, class Bias, class Source,
          class Scalar, int Align, cutlass::FloatRoundStyle Round, class CtaTile, class EpilogueTile>
struct TracedFusion<ORACLE_SM90_POLICY,
                    fusion::LinCombPerColBiasEltAct<Act, Out, Compute, Bias, Source, Scalar, Align, Round>, CtaTile,
                    EpilogueTile>
    : TracedBiasFusion<
          ORACLE_SM90_POLICY, fusion::LinCombPerColBiasEltAct<Act, Out, Compute, Bias, Source, Scalar, Align, Round>,
          CtaTile, EpilogueTile,
          CastTree<typename Activated<BiasTree<Compute, Source, Scalar, Round,
                                               ColBiasLeaf<StagesC, CtaTile, EpilogueTile, Bias, Compute, Align>>,
                                      Act, Compute, Round>::type,
                   typename cutlass::detail::get_unpacked_element_type<Out>::type, Compute, Round>,
          true> {
  static_assert(ActivationCheck<Act>::ok, "");
  using Operation = fusion::LinCombPerColBiasEltAct<Act, Out, Compute, Bias, Source, Scalar, Align, Round>;
  using Inherited = typename TracedFusion::BiasFusion;
  using Inherited::Inherited;
};

// LinCombEltAct: activation(beta * C + alpha * acc): CUTLASS's LinearCombination subtree in Compute
// (tapped as alpha_beta), the activation (tapped), the cast (tapped).
template <ORACLE_SM90_POLICY_PARAMS, template <class> class Act, class Out, class Compute, class Source, class Scalar,
          cutlass::FloatRoundStyle Round, class CtaTile, class EpilogueTile>
struct TracedFusion<ORACLE_SM90_POLICY, fusion::LinCombEltAct<Act, Out, Compute, Source, Scalar, Round>, CtaTile,
                    EpilogueTile>
    : CastTree<typename Activated<TapTree<Stage::EpilogueAlphaBeta,
                                          fusion::Sm90LinearCombination<Compute, Compute, Source, Scalar, Round>,
                                          Compute>,
                                  Act, Compute, Round>::type,
               typename cutlass::detail::get_unpacked_element_type<Out>::type, Compute, Round> {
  static_assert(ActivationCheck<Act>::ok, "");
  using Impl = CastTree<typename Activated<TapTree<Stage::EpilogueAlphaBeta,
                                                   fusion::Sm90LinearCombination<Compute, Compute, Source, Scalar, Round>,
                                                   Compute>,
                                           Act, Compute, Round>::type,
                        typename cutlass::detail::get_unpacked_element_type<Out>::type, Compute, Round>;
  using Operation = fusion::LinCombEltAct<Act, Out, Compute, Source, Scalar, Round>;
  using Cutlass = fusion::FusionCallbacks<ORACLE_SM90_POLICY, Operation, CtaTile, EpilogueTile>;
  struct Arguments : Cutlass::Arguments {
    operator typename Impl::Arguments() const {
      typename Impl::Arguments t{};
      auto& act = t.op_0.op_0;                // tap(activation(tap(lincomb)))
      auto& lincomb = act.op_0.op_0.op_0;     // CUTLASS's LinearCombination tree
      lincomb.op_0 = {{this->beta}, {this->beta_ptr}, {this->dBeta}};
      lincomb.op_2.op_0 = {{this->alpha}, {this->alpha_ptr}, {this->dAlpha}};
      act.op_0.op_1 = this->activation;
      return t;
    }
  };
  using Impl::Impl;
};

#undef ORACLE_SM90_POLICY
#undef ORACLE_SM90_POLICY_PARAMS

// The order a traced fusion's tree declares.
template <class Policy, class Operation, class CtaTile, class EpilogueTile>
struct StepsOf<TracedFusion<Policy, Operation, CtaTile, EpilogueTile>> {
  using type = typename StepsOf<typename TracedFusion<Policy, Operation, CtaTile, EpilogueTile>::Impl>::type;
};

// A user's own tree (the builder's FusionOpOrCallbacks an Sm90EVT): taken as written, with the Tap
// nodes the user put in it.
template <class Callbacks>
struct TracedCallbacks {
  using type = Callbacks;
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

// A grouped GEMM's pointer-array epilogue: its callbacks traced (the pointer-array LinearCombination's
// tree: cutlass/sm90_grouped.hpp).
template <int StagesC, int StagesD, int FragmentSize, bool ReuseSmemC, bool DelayTmaStore, int WarpGroups,
          class CtaTile, class EpilogueTile, class ElementC, class StrideC, class ElementD, class StrideD,
          class Callbacks, class... Rest>
struct TracedEpilogueOf<cutlass::epilogue::collective::CollectiveEpilogue<
    cutlass::epilogue::Sm90PtrArrayTmaWarpSpecialized<StagesC, StagesD, FragmentSize, ReuseSmemC, DelayTmaStore,
                                                      WarpGroups>,
    CtaTile, EpilogueTile, ElementC, StrideC, ElementD, StrideD, Callbacks, Rest...>> {
  using type = cutlass::epilogue::collective::CollectiveEpilogue<
      cutlass::epilogue::Sm90PtrArrayTmaWarpSpecialized<StagesC, StagesD, FragmentSize, ReuseSmemC, DelayTmaStore,
                                                        WarpGroups>,
      CtaTile, EpilogueTile, ElementC, StrideC, ElementD, StrideD, typename TracedCallbacks<Callbacks>::type, Rest...>;
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
