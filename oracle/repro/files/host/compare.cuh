// host/compare.cuh -- the per-tile comparison of D with the reference and its bounds, and its report.
// Part of the reproducer's host program (repro.cu); nothing here depends on the case.
#pragma once

#include "reference.cuh"

namespace repro {

// The verdict line and its exit code: DIVERGED where any value is out of bounds, MISTRUSTED where
// no reference value could discriminate (all zero), else MATCH.
int verdict(long long bad, long long informative) {
  if (bad > 0) {
    std::printf("verdict: DIVERGED\n");
    return kDiverged;
  }
  if (informative == 0) {
    std::printf("verdict: MISTRUSTED (every reference value is zero: nothing could discriminate)\n");
    return kMistrusted;
  }
  std::printf("verdict: MATCH\n");
  return kMatch;
}

// ------------------------------------------------------------------------------ the comparison

struct TileStats {
  long long compared = 0, bad = 0, nan_r = 0, nan_e = 0, inf_r = 0, inf_e = 0, informative = 0, poison = 0;
  double max_ratio = 0, max_abs = 0;
  long long first_bad = -1;  // linear logical index of the tile's first bad element (row-major)
};

// D against the reference, per BM x BN tile, with the oracle's element rule: bit-exact (NaN
// matches NaN) when every bound is zero, else |received - expected| <= bound for finite pairs,
// NaN matching NaN and an infinity matching the same infinity. A grouped problem's tiles are
// counted from each group's first row (every group its own GEMM). Prints the evidence, returns
// the exit code.
int judge(const TensorFile& d, const Reference& ref, const Problem& p) {
  const long long tn = (p.n + p.bn - 1) / p.bn;
  const size_t n_groups = p.group_rows.size();
  std::vector<long long> tile_group, tile_tm, group_tile0(n_groups), group_tiles(n_groups);
  for (size_t g = 0; g < n_groups; ++g) {
    group_tile0[g] = (long long)tile_group.size();
    group_tiles[g] = (p.group_rows[g] + p.bm - 1) / p.bm * tn;
    for (long long t = 0; t < group_tiles[g]; ++t) {
      tile_group.push_back((long long)g);
      tile_tm.push_back(t / tn);
    }
  }
  const long long n_tiles = (long long)tile_group.size();
  std::vector<TileStats> tiles(static_cast<size_t>(n_tiles));
  const int es = dt_size(d.dtype);
  const long long ld = d.shape.back();
  for (size_t g = 0; g < n_groups; ++g) {
    const long long row0 = p.group_row0[g];
    for (long long r = 0; r < p.group_rows[g]; ++r) {
      const long long i = row0 + r;
      for (long long j = 0; j < p.n; ++j) {
        const long long li = i * p.n + j;
        const long long si = d.major == "col" ? j * ld + i : i * ld + j;
        const unsigned char* bits = d.data.data() + si * es;
        const double rv = decode(d.dtype, bits);
        const double e = ref.expected[size_t(li)];
        TileStats& t = tiles[size_t(group_tile0[g] + (r / p.bm) * tn + j / p.bn)];
        ++t.compared;
        t.poison += all_ones_bits(bits, es);
        const bool rn = std::isnan(rv), en = std::isnan(e), ri = std::isinf(rv), ei = std::isinf(e);
        t.nan_r += rn;
        t.nan_e += en;
        t.inf_r += ri;
        t.inf_e += ei;
        t.informative += std::fabs(e) > 1e-30;
        const bool finite = std::isfinite(rv) && std::isfinite(e);
        const double err = finite ? std::fabs(rv - e) : 0.0;
        bool ok;
        double ratio;
        if (ref.exact) {
          ok = std::memcmp(bits, ref.exact_bits.data() + li * es, size_t(es)) == 0 || (rn && en);
          ratio = ok ? 0.0 : INFINITY;
        } else {
          const double b = ref.bound[size_t(li)];
          const bool same_inf = ri && ei && std::signbit(rv) == std::signbit(e);
          ok = (rn && en) || same_inf || (finite && err <= b);
          ratio = (rn && en) || same_inf ? 0.0 : !finite ? INFINITY : err == 0 ? 0.0 : err / std::max(b, 1e-300);
        }
        t.max_abs = std::max(t.max_abs, err);
        t.max_ratio = std::max(t.max_ratio, ratio);
        if (!ok) {
          ++t.bad;
          if (t.first_bad < 0) t.first_bad = li;
        }
      }
    }
  }
  long long bad_tiles = 0, bad = 0, poison = 0, nan_r = 0, nan_e = 0, inf_r = 0, inf_e = 0, informative = 0;
  long long worst = 0, first = -1;
  std::vector<long long> group_bad(n_groups), group_bad_tiles(n_groups);
  auto worse = [&](const TileStats& a, const TileStats& b) {  // (failed, ratio, mismatches, max |err|)
    if ((a.bad > 0) != (b.bad > 0)) return a.bad > 0;
    if (a.max_ratio != b.max_ratio) return a.max_ratio > b.max_ratio;
    if (a.bad != b.bad) return a.bad > b.bad;
    return a.max_abs > b.max_abs;
  };
  for (long long t = 0; t < n_tiles; ++t) {
    const TileStats& s = tiles[size_t(t)];
    bad_tiles += s.bad > 0;
    bad += s.bad;
    group_bad[size_t(tile_group[size_t(t)])] += s.bad;
    group_bad_tiles[size_t(tile_group[size_t(t)])] += s.bad > 0;
    poison += s.poison;
    nan_r += s.nan_r;
    nan_e += s.nan_e;
    inf_r += s.inf_r;
    inf_e += s.inf_e;
    informative += s.informative;
    if (worse(s, tiles[size_t(worst)])) worst = t;
    if (s.bad > 0 && first < 0) first = t;
  }
  // "(tm, tn)", and " of group g" for a grouped problem
  auto tile_name = [&](long long t) {
    const long long g = tile_group[size_t(t)];
    std::string s = "(" + std::to_string(tile_tm[size_t(t)]) + ", " + std::to_string((t - group_tile0[size_t(g)]) % tn) +
                    ")";
    if (p.grouped) s += " of group " + std::to_string(g);
    return s;
  };
  const TileStats& w = tiles[size_t(worst)];
  std::printf("reference: %s\n", ref.source.c_str());
  if (p.grouped) {
    std::string sizes;
    for (size_t g = 0; g < n_groups; ++g) sizes += (g ? ", " : "") + std::to_string(p.group_rows[g]);
    std::printf("output D: %lld x %lld %s (%s-major) in %zu groups of %s rows, %lld tiles of %d x %d counted from each "
                "group's first row\n",
                p.total_m, p.n, dt_name(d.dtype), d.major.c_str(), n_groups, sizes.c_str(), n_tiles, p.bm, p.bn);
  } else {
    std::printf("output D: %lld x %lld %s (%s-major), %lld x %lld tiles of %d x %d\n", p.total_m, p.n, dt_name(d.dtype),
                d.major.c_str(), n_tiles / tn, tn, p.bm, p.bn);
  }
  char ratio[64];
  if (ref.exact && w.bad == 0) std::snprintf(ratio, sizeof ratio, "exact");
  else std::snprintf(ratio, sizeof ratio, "%.3g", w.max_ratio);
  std::printf("  worst tile %s: err/bound %s, max |err| %.6g, bad %lld/%lld, NaN r/e %lld/%lld, "
              "Inf r/e %lld/%lld, never written %lld\n",
              tile_name(worst).c_str(), ratio, w.max_abs, w.bad, w.compared, w.nan_r, w.nan_e, w.inf_r, w.inf_e,
              w.poison);
  std::printf("  all tiles: bad elements %lld in %lld of %lld tiles; NaN r/e %lld/%lld; Inf r/e %lld/%lld; "
              "never written (still the 0xFF poison) %lld\n",
              bad, bad_tiles, n_tiles, nan_r, nan_e, inf_r, inf_e, poison);
  if (p.grouped)
    for (size_t g = 0; g < n_groups; ++g) {
      if (p.group_rows[g] == 0) {
        std::printf("  group %zu (empty): nothing to compare\n", g);
        continue;
      }
      std::printf("  group %zu (rows %lld..%lld): bad elements %lld in %lld of %lld tiles\n", g, p.group_row0[g],
                  p.group_row0[g] + p.group_rows[g] - 1, group_bad[g], group_bad_tiles[g], group_tiles[g]);
    }
  if (first >= 0) {
    const long long li = tiles[size_t(first)].first_bad, i = li / p.n, j = li % p.n;
    const long long r = i - p.group_row0[size_t(tile_group[size_t(first)])];
    const long long si = d.major == "col" ? j * ld + i : i * ld + j;
    const unsigned char* bits = d.data.data() + si * es;
    const double b = ref.exact ? 0.0 : ref.bound[size_t(li)];
    const std::string in_group = p.grouped ? "; row " + std::to_string(r) + " of the group" : "";
    std::printf("  first bad element: (%lld, %lld) in tile %s [(%lld, %lld) in the tile%s]: received %.6g%s, "
                "expected %.6g, bound %.3g\n",
                i, j, tile_name(first).c_str(), r % p.bm, j % p.bn, in_group.c_str(), decode(d.dtype, bits),
                all_ones_bits(bits, es) ? " (never written: still the 0xFF poison)" : "", ref.expected[size_t(li)], b);
  }
  return verdict(bad, informative);
}

}  // namespace repro
