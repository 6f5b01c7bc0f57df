"""Reference stages of attention (FlashAttention-style forward and split-KV decode), one module each:

  geometry       layouts (dense, varlen, paged), the GQA head map, the mask rule, AttnParams
  scores         stage `s`: S = Q K^T for one KV block (fp32)
  mask           scale, softcap, causal / window / length mask (-inf)
  softmax_state  running max m, rescale alpha = exp(m_old - m_new), row sum l, per KV block
  p              P = exp(S - m) in the second MMA's operand type (p_scale for e4m3)
  o              the accumulator alpha * O + P V per KV block
  normalize      O / l and LSE = m + log l (a fully masked row: O = 0, LSE = -inf)
  combine        split-KV partials merged by their LSE
  forward        attention_forward: all of the above fused, block after block; the float64 spec
Every stage has a Triton launcher over tiles stacked along a first "unit" axis, a `*_host` float64
specification and `check_supported(...)` returning reasons. Depends on triton and torch only.
"""

from kernels_ref._lazy import lazy_exports

_NAMES = {
    "geometry": ("AttnParams", "allowed_host", "kv_head", "layout"),
    "scores": ("scores", "scores_host"),
    "mask": ("mask", "mask_host"),
    "softmax_state": ("softmax_state", "softmax_state_host", "trajectory_host"),
    "p": ("p_tile", "p_tile_host"),
    "o": ("o_step", "o_step_host"),
    "normalize": ("normalize", "normalize_host"),
    "combine": ("combine", "combine_host"),
    "forward": ("Stats", "attention_forward", "attention_forward_host"),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, tuple(_NAMES), _NAMES, globals())
