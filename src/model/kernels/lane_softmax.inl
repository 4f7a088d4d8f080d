// src/model/kernels/lane_softmax.inl — the softmax both fused attentions share: e^x (Cephes)
// and the masked softmax of a chunk of query rows whose scores run along the vector lanes
// (attention_kernel.inl's lane_rows, and the vdpbf16ps attention of avx512_bf16.cpp). Included
// after the unit's `Vec`; internal linkage, no standard headers.

namespace {

// e^x for x <= 0 (or -inf): Cephes' single-precision range reduction and polynomial (within a
// few ulp of expf). Results below e^-87 (1.6e-38, under f32 resolution next to the row's maximum
// term of 1) are flushed to 0, which is also what a masked slot's -inf gives.
inline typename Vec::Reg exp_nonpositive(typename Vec::Reg x) {
  using R = typename Vec::Reg;
  const R limit = Vec::set1(-87.0f);
  const R xc = Vec::max(x, limit);
  const R n = Vec::round(Vec::mul(xc, Vec::set1(1.44269504088896341f)));
  R r = Vec::fma(n, Vec::set1(-0.693359375f), xc);
  r = Vec::fma(n, Vec::set1(2.12194440e-4f), r);
  R p = Vec::set1(1.9875691500e-4f);
  p = Vec::fma(p, r, Vec::set1(1.3981999507e-3f));
  p = Vec::fma(p, r, Vec::set1(8.3334519073e-3f));
  p = Vec::fma(p, r, Vec::set1(4.1665795894e-2f));
  p = Vec::fma(p, r, Vec::set1(1.6666665459e-1f));
  p = Vec::fma(p, r, Vec::set1(5.0000001201e-1f));
  p = Vec::fma(p, Vec::mul(r, r), Vec::add(r, Vec::set1(1.0f)));
  return Vec::zero_below(x, limit, Vec::scale2(p, n));
}

// The scores st[j][r] (row r0 + r of `a` in lane r, RV vectors of rows, ld = RV * kWidth apart)
// with `a`'s ALiBi added and masked as `a` says, then replaced by their softmax numerators
// e^(s - row max); scale[r] gets 1 / the row's sum, 0 for a row that sees no slot. Each lane's
// steps use only its own row.
template <int RV>
inline void lane_softmax(const promptcache::kernels::AttendArgs& a, Index r0, Index rows, float* st,
                         float* scale) {
  constexpr Index ld = RV * Vec::kWidth;
  constexpr float kNegInf = -__builtin_inff();
  const Index slots = a.slots;
  if (a.slopes != nullptr) {  // ALiBi: each row's slope times the key's distance from it
    // Each lane's slope and query position (padding lanes get slope 0: their scores stay).
    float slope[ld], query[ld];
    for (Index r = 0; r < ld; ++r) {
      slope[r] = r < rows ? a.slopes[(r0 + r) / a.tokens] : 0.0f;
      query[r] = r < rows ? a.query_pos[(r0 + r) % a.tokens] : 0.0f;
    }
    typename Vec::Reg sv[RV], qv[RV];
    for (int c = 0; c < RV; ++c) {
      sv[c] = Vec::load(slope + c * Vec::kWidth);
      qv[c] = Vec::load(query + c * Vec::kWidth);
    }
    for (Index j = 0; j < slots; ++j) {
      const typename Vec::Reg key = Vec::set1(a.key_pos[j]);
      for (int c = 0; c < RV; ++c) {
        float* at = st + j * ld + c * Vec::kWidth;
        Vec::store(at, Vec::fma(sv[c], Vec::sub(key, qv[c]), Vec::load(at)));
      }
    }
  }
  if (a.mask != nullptr) {
    for (Index j = a.open; j < slots; ++j) {
      for (Index r = 0; r < rows; ++r) {
        if (!a.mask[((r0 + r) % a.tokens) * a.mask_ld + j]) st[j * ld + r] = kNegInf;
      }
    }
  }
  typename Vec::Reg top[RV], total[RV];
  for (int r = 0; r < RV; ++r) top[r] = Vec::set1(kNegInf), total[r] = Vec::zero();
  for (Index j = 0; j < slots; ++j) {
    for (int r = 0; r < RV; ++r)
      top[r] = Vec::max(top[r], Vec::load(st + j * ld + r * Vec::kWidth));
  }
  // A row that sees no slot has maximum -inf: subtracting 0 instead makes its terms e^-inf = 0.
  for (int r = 0; r < RV; ++r) top[r] = Vec::zero_below(top[r], Vec::set1(-3.0e38f), top[r]);
  for (Index j = 0; j < slots; ++j) {
    for (int r = 0; r < RV; ++r) {
      float* at = st + j * ld + r * Vec::kWidth;
      const typename Vec::Reg e = exp_nonpositive(Vec::sub(Vec::load(at), top[r]));
      Vec::store(at, e);
      total[r] = Vec::add(total[r], e);
    }
  }
  for (int r = 0; r < RV; ++r) Vec::store(scale + r * Vec::kWidth, total[r]);
  for (Index r = 0; r < ld; ++r) scale[r] = scale[r] > 0.0f ? 1.0f / scale[r] : 0.0f;
}

}  // namespace
