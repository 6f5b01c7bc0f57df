// zoo/common/attention_defects.cuh -- the planted defects of the attention zoo kernels, as flags.
//
// ZOO_ATTN_DEFECT_FLAGS(ZOO_FA2) in a kernel's file declares one constexpr bool per defect, true when
// its ZOO_FA2_<DEFECT> define is given (-DZOO_FA2_<DEFECT> or =1, as the case files give it), and
// refuses more than one. The defects are oracle/run/attention_model.py's, by the same names.

#ifndef ZOO_COMMON_ATTENTION_DEFECTS_CUH_
#define ZOO_COMMON_ATTENTION_DEFECTS_CUH_

// ZOO_IS_SET(X): true when the macro X is defined as 1, else false (X left as its own name).
#define ZOO_IS_SET(x) ZOO_IS_SET_(x)
#define ZOO_IS_SET_(x) ZOO_IS_SET_PICK(ZOO_IS_SET_PLACEHOLDER_##x)
#define ZOO_IS_SET_PLACEHOLDER_1 0,
#define ZOO_IS_SET_PICK(arg) ZOO_IS_SET_SECOND(arg true, false, )
#define ZOO_IS_SET_SECOND(ignored, value, ...) value

#define ZOO_ATTN_DEFECT_FLAGS(P)                                                                            \
  constexpr bool kKvTailNotZeroed = ZOO_IS_SET(P##_KV_TAIL_NOT_ZEROED);                                    \
  constexpr bool kCausalOffByOne = ZOO_IS_SET(P##_CAUSAL_OFF_BY_ONE);                                      \
  constexpr bool kMaxNotUpdated = ZOO_IS_SET(P##_MAX_NOT_UPDATED_BEFORE_RESCALE);                          \
  constexpr bool kLBeforeRescale = ZOO_IS_SET(P##_L_SUMMED_BEFORE_RESCALE);                                \
  constexpr bool kPWrongType = ZOO_IS_SET(P##_P_WRONG_TYPE);                                               \
  constexpr bool kVKLayout = ZOO_IS_SET(P##_V_READ_WITH_K_LAYOUT);                                         \
  constexpr bool kMergeWithoutMax = ZOO_IS_SET(P##_SPLIT_MERGE_WITHOUT_MAX);                               \
  constexpr bool kEmptyRowNan = ZOO_IS_SET(P##_EMPTY_ROW_DIVIDED_BY_ZERO);                                 \
  constexpr bool kGqaModulo = ZOO_IS_SET(P##_GQA_HEAD_MODULO);                                             \
  constexpr bool kPageOffByOne = ZOO_IS_SET(P##_PAGE_TABLE_OFF_BY_ONE);                                    \
  static_assert(int(kKvTailNotZeroed) + kCausalOffByOne + kMaxNotUpdated + kLBeforeRescale + kPWrongType + \
                        kVKLayout + kMergeWithoutMax + kEmptyRowNan + kGqaModulo + kPageOffByOne <=         \
                    1,                                                                                      \
                "define at most one " #P "_<DEFECT>");

#endif  // ZOO_COMMON_ATTENTION_DEFECTS_CUH_
