// oracle_trace/attention.cuh -- taps of an attention (FlashAttention-style) kernel.
//
// Built on trace.cuh (included here) and gated the same way: nothing is compiled in unless the
// translation unit defines ORACLE_TRACE, and then only for AttentionTracer<true>; wrap taps in
// `if constexpr (At::enabled)` so that not even their arguments are evaluated. Without the macro
// this header declares types only and the kernel's code is that of a build without it
// (tests/cpu/test_attention_trace.py compares the cubins).
//
// Where a tap belongs (docs/trace-format.md, "Attention sites"): AttnSite{batch, head, q_block,
// kv_block, split} becomes Site{tile_m = q_block, tile_n = head (the query head), k_block =
// kv_block, partial = split, group = batch}. Unset members are kNone; every tap below sets the
// members its stage does not have (load_q and normalize: no KV block; combine: no KV block and no
// split) to kNone itself.
//
// Tap shapes, with BQ query rows, BKV keys a block, D the head dim of Q and K, DV that of V:
//   tap_q / tap_k / tap_v          [BQ, D] / [BKV, D] / [BKV, DV] tiles, one row per query / key
//   tap_scores(S | Mask | P, ...)  [BQ, BKV] register fragments (S, Mask fp32; P in its MMA type)
//   tap_softmax_state              [BQ, 3] fp32: m (running max), rescale (exp(m_old - m_new)), l
//   tap_o                          [BQ, DV] fp32: the O accumulator after the KV block
//   tap_out / tap_lse              Normalize or Combine: O in columns 0..DV-1, LSE in column DV
//
//   template <bool Trace> __global__ void fa_fwd(...) {
//     using At = oracle_trace::AttentionTracer<Trace>;
//     const oracle_trace::AttnSite at{batch, head, q_block, kv_block, split};
//     if constexpr (At::enabled) At::tap_k(at, smem_k, kBlockKV, kHeadDim, oracle_trace::Strided{kHeadDim, 1});
//     ...
//     if constexpr (At::enabled)
//       At::tap_softmax_state(at, kBlockQ, kRowsPerThread, [&](int i) {
//         return oracle_trace::RowState{row_of(i), m[i], rescale[i], l[i]};
//       });
//   }

#ifndef ORACLE_TRACE_ATTENTION_CUH_
#define ORACLE_TRACE_ATTENTION_CUH_

#include "oracle_trace/trace.cuh"

#if defined(__CUDACC__)
#define ORACLE_TRACE_ATTN_HD __host__ __device__ __forceinline__
#define ORACLE_TRACE_ATTN_DEVICE __device__ __forceinline__
#else
#define ORACLE_TRACE_ATTN_HD inline
#define ORACLE_TRACE_ATTN_DEVICE inline
#endif

namespace oracle_trace {

constexpr int kSoftmaxStateColumns = 3;  // m, rescale, l

// Where an attention tap belongs, in the problem's own terms.
struct AttnSite {
  int batch;
  int head;  // the query head (a GQA kernel names it, whichever KV head it read)
  int q_block;
  int kv_block = kNone;
  int split = kNone;  // the split-KV index; kNone when the problem is not split
  int slot = kNone;   // pipeline slot of a K / V tile, if the kernel has one
  ORACLE_TRACE_ATTN_HD constexpr Site site() const { return Site{q_block, head, kv_block, slot, split, batch}; }
  ORACLE_TRACE_ATTN_HD constexpr Site without_kv_block() const { return Site{q_block, head, kNone, kNone, split, batch}; }
  ORACLE_TRACE_ATTN_HD constexpr Site merged() const { return Site{q_block, head, kNone, kNone, kNone, batch}; }
};

// One query row's softmax state after a KV block, as a thread holds it.
struct RowState {
  int row;  // inside the query block
  float m;  // the running max, in the scaled domain of the Mask stage
  float rescale;  // the factor applied to the old O and l at this block (1 at the first block)
  float l;  // the row sum after the block
};

// One value a thread holds for one query row (an LSE).
struct RowValue {
  int row;
  float value;
};

// The gate: AttentionTracer<Trace> taps only when Tracer<Trace> does (Trace and ORACLE_TRACE).
template <bool Trace>
struct AttentionTracer {
  using Tr = Tracer<Trace>;
  static constexpr bool enabled = Tr::enabled;

  ORACLE_TRACE_ATTN_DEVICE static bool selected(Stage stage, const AttnSite& at) {
    if constexpr (enabled) return Tr::selected(stage, at.site());
    return false;
  }

  // Whole warps (the CTA, or a group as in tap_smem_tile): a Q, K or V tile in shared memory,
  // one row per query / key, layout(r, c) -> element offset. Q carries no KV block.
  template <class T, class Layout>
  ORACLE_TRACE_ATTN_DEVICE static void tap_q(const AttnSite& at, const T* smem, int block_q, int head_dim, Layout layout,
                                         int group_thread = -1, int group_size = -1) {
    if constexpr (enabled)
      Tr::tap_smem_tile(Stage::LoadQ, at.without_kv_block(), smem, block_q, head_dim, layout, group_thread, group_size);
  }
  template <class T, class Layout>
  ORACLE_TRACE_ATTN_DEVICE static void tap_k(const AttnSite& at, const T* smem, int block_kv, int head_dim, Layout layout,
                                         int group_thread = -1, int group_size = -1) {
    if constexpr (enabled) Tr::tap_smem_tile(Stage::LoadK, at.site(), smem, block_kv, head_dim, layout, group_thread, group_size);
  }
  template <class T, class Layout>
  ORACLE_TRACE_ATTN_DEVICE static void tap_v(const AttnSite& at, const T* smem, int block_kv, int head_dim_v, Layout layout,
                                         int group_thread = -1, int group_size = -1) {
    if constexpr (enabled)
      Tr::tap_smem_tile(Stage::LoadV, at.site(), smem, block_kv, head_dim_v, layout, group_thread, group_size);
  }

  // One thread: the S, Mask or P elements it holds of the [block_q, block_kv] block;
  // element(i) -> Element<T>{q_row, kv_col, value} for i < count (T: float for S and Mask, the
  // second MMA's operand type for P).
  template <class F>
  ORACLE_TRACE_ATTN_DEVICE static void tap_scores(Stage stage, const AttnSite& at, int block_q, int block_kv, int count,
                                              F&& element) {
    if constexpr (enabled) Tr::tap_elements(stage, at.site(), block_q, block_kv, count, static_cast<F&&>(element));
  }

  // One thread: the softmax state of the `rows` query rows it holds; state(i) -> RowState.
  template <class F>
  ORACLE_TRACE_ATTN_DEVICE static void tap_softmax_state(const AttnSite& at, int block_q, int rows, F&& state) {
    if constexpr (enabled) {
      Tr::tap_elements(Stage::SoftmaxState, at.site(), block_q, kSoftmaxStateColumns, rows * kSoftmaxStateColumns,
                       [&](int i) {
                         const RowState s = state(i / kSoftmaxStateColumns);
                         const int c = i % kSoftmaxStateColumns;
                         return Element<float>{s.row, c, c == 0 ? s.m : c == 1 ? s.rescale : s.l};
                       });
    }
  }

  // One thread: the O accumulator elements it holds after the KV block; element(i) -> Element<float>.
  template <class F>
  ORACLE_TRACE_ATTN_DEVICE static void tap_o(const AttnSite& at, int block_q, int head_dim_v, int count, F&& element) {
    if constexpr (enabled) Tr::tap_elements(Stage::O, at.site(), block_q, head_dim_v, count, static_cast<F&&>(element));
  }

  // One thread, stage Normalize (O / l of a split, or of the whole row) or Combine (the splits
  // merged): the output elements it holds, element(i) -> Element<float>{q_row, d, value}, d < head_dim_v.
  template <class F>
  ORACLE_TRACE_ATTN_DEVICE static void tap_out(Stage stage, const AttnSite& at, int block_q, int head_dim_v, int count,
                                           F&& element) {
    if constexpr (enabled)
      Tr::tap_elements(stage, out_site(stage, at), block_q, head_dim_v + 1, count, static_cast<F&&>(element));
  }

  // One thread, stage Normalize or Combine: the LSE (natural log) of the `rows` query rows it
  // holds, lse(i) -> RowValue{q_row, lse}; recorded in column head_dim_v of the same tap.
  template <class F>
  ORACLE_TRACE_ATTN_DEVICE static void tap_lse(Stage stage, const AttnSite& at, int block_q, int head_dim_v, int rows,
                                           F&& lse) {
    if constexpr (enabled) {
      Tr::tap_elements(stage, out_site(stage, at), block_q, head_dim_v + 1, rows, [&](int i) {
        const RowValue v = lse(i);
        return Element<float>{v.row, head_dim_v, v.value};
      });
    }
  }

 private:
  ORACLE_TRACE_ATTN_HD static constexpr Site out_site(Stage stage, const AttnSite& at) {
    return stage == Stage::Combine ? at.merged() : at.without_kv_block();
  }
};

}  // namespace oracle_trace

#undef ORACLE_TRACE_ATTN_HD
#undef ORACLE_TRACE_ATTN_DEVICE

#endif  // ORACLE_TRACE_ATTENTION_CUH_
