// src/model/kernels/kernels.hpp — entry points of the per-ISA CPU kernels: the small-row linear
// kernel (linear_kernel.inl) and the fused few-query attention (attention_kernel.inl). Private
// to the library; src/model/cpu_linear.cpp and src/model/cpu_attention.cpp dispatch to them.
#pragma once

namespace promptcache::kernels {

// out[t * ldo + j] = sum_i x[t * k + i] * w[j * k + i] for t in [0, m) and j in [n0, n1).
// x is m x k, w is (at least n1) x k, both row-major and dense; f32. `scratch` is null or
// linear_scratch_floats(m, k) floats of the calling thread: with it, kLinearLaneMinRows rows and
// more run along the vector lanes (x transposed into the scratch). Up to 12 rows the weight-row
// blocks take at most two passes of 6 tokens (AVX-512) and are as fast or faster; from 13 on the
// lanes are (16 tokens: 14.7-15.2 against 18.5-18.8 ms for bench-small's 12 layers,
// docs/benchmarks-history.md).
// The weights may also be bf16 or f16 (W below), converted to f32 as they are loaded; x, the
// sums and out stay f32, so the result is the f32 product with the converted weights. With f16
// weights the scratch is used from 2 rows on (rows converted once for several passes).
template <class W>
using LinearRowsOf = void (*)(const float* x, long long m, long long k, const W* w, long long n0,
                              long long n1, float* out, long long ldo, float* scratch);
// A bf16 or f16 weight element, its 16 bits as stored (the layout of at::BFloat16, at::Half).
struct Bf16 {
  unsigned short bits;
};
struct F16 {
  unsigned short bits;
};
// One value of an 8-bit weight row (promptcache/model/q8_weights.hpp): a row of k weights is k
// int8 values, then one f16 scale per block of kQ8Block values (the last block may be shorter),
// q8_row_bytes(k) bytes in all; weight = value x its block's scale.
struct Q8 {
  signed char value;
};
constexpr long long kQ8Block = 32;
// Up to this many rows of x, Q8 kernels quantize x to 8 bits too and multiply in integers.
constexpr long long kQ8DotMaxRows = 4;
constexpr long long q8_row_bytes(long long k) {
  return k + 2 * ((k + kQ8Block - 1) / kQ8Block);
}
using LinearRowsFn = LinearRowsOf<float>;
using LinearRowsBf16Fn = LinearRowsOf<Bf16>;
using LinearRowsF16Fn = LinearRowsOf<F16>;
// For Q8 weights, w is the first row and rows are q8_row_bytes(k) apart.
using LinearRowsQ8Fn = LinearRowsOf<Q8>;
// `count` bf16/f16 values converted to f32 (the long-input path converts a weight so, then runs
// the f32 GEMM).
template <class W>
using WidenOf = void (*)(const W* src, long long count, float* dst);
// `rows` Q8 rows of k weights each (q8_row_bytes(k) apart) into rows x k floats.
using WidenQ8Fn = void (*)(const Q8* src, long long rows, long long k, float* dst);
constexpr long long kLinearLaneMinRows = 13;
// x transposed, its tokens padded to a multiple of 16 (the widest vector); then, for bf16/f16
// weights, a block of up to kLinearLaneMaxBlockRows weight rows converted to f32; for Q8
// weights and up to kQ8DotMaxRows rows, x quantized to 8 bits (q8_scratch_x_floats).
constexpr long long kLinearLaneMaxBlockRows = 12;
constexpr long long linear_scratch_x_floats(long long m, long long k) {
  return k * ((m + 15) / 16 * 16);
}
// Q8 weights with up to kQ8DotMaxRows rows of x: x quantized, its scales and 32-value blocks
// (f32 units).
constexpr long long q8_scratch_x_floats(long long m, long long k) {
  return m * ((k + kQ8Block - 1) / kQ8Block) * (1 + kQ8Block / 4);
}
constexpr long long linear_scratch_floats(long long m, long long k) {
  return linear_scratch_x_floats(m, k) + kLinearLaneMaxBlockRows * k + q8_scratch_x_floats(m, k);
}

// The element type of a call's keys and values: f32, or bf16/f16 (a KV cache and module states
// kept at half the bytes; the kernel converts them to f32 as it reads, and computes in f32).
enum class KvType { kF32, kBf16, kF16 };

// One run of a KV head's slots: `slots` keys and as many values, each a dense row of d elements
// of the call's KvType. The slots of one call may lie in several runs (the module states an
// assembled request reads in place from the store, then its own fresh tokens), taken in order:
// the first run's slots are slots 0 .. its slots - 1 of the mask, and so on.
struct AttendSegment {
  const void* k = nullptr;  // [slots, d], row-major
  const void* v = nullptr;  // [slots, d], row-major
  long long slots = 0;
};

// One KV head's attention for a few query rows, f32:
//   out[r] = softmax_j(q[r] . k[j], over the slots j row r may see) applied to v.
// Row r belongs to token r % tokens (grouped-query heads stack their rows group-major). Every
// row sees slots [0, open); a slot j >= open is seen by token i iff mask[i * mask_ld + j], or
// by all when mask is null. A row that sees no slot gets zeros.
// With ALiBi (slopes not null), row r's score of slot j is first added
//   slopes[r / tokens] * (key_pos[j] - query_pos[r % tokens]),
// the slope of the row's query head times the distance of their positions.
struct AttendArgs {
  const float* q = nullptr;  // [rows, d], already scaled by 1/sqrt(d)
  long long rows = 0, d = 0;
  const AttendSegment* segments = nullptr;  // segment_count runs of slots, in slot order
  long long segment_count = 0;
  long long slots = 0;         // the runs' slots together
  const bool* mask = nullptr;  // [tokens, mask_ld] or null
  long long mask_ld = 0, tokens = 1, open = 0;
  float* out = nullptr;      // [rows, d]
  float* scratch = nullptr;  // attend_scratch_floats(d, slots) floats
  KvType kv = KvType::kF32;  // of every run's keys and values
  // ALiBi, or all null: [rows / tokens] slopes, [slots] key and [tokens] query positions.
  const float* slopes = nullptr;
  const float* key_pos = nullptr;
  const float* query_pos = nullptr;
};
using AttendRowsFn = void (*)(const AttendArgs& args);

// Query rows the attention kernel's scratch is sized for: a call with fewer than
// kAttendLaneMinRows rows (a decode step) keeps their scores row by row; from that many on, rows
// go in chunks of at most this many along the vector lanes.
constexpr long long kAttendRowChunk = 48;
constexpr long long kAttendLaneMinRows = 12;
// bf16/f16 keys or values are converted to f32 a block of at most this many slots at a time
// (a block of keys for the scores, or of values for the product with V).
constexpr long long kAttendWidenSlots = 64;
// Scratch floats attend_rows needs for one call: the scores of a chunk of rows over every slot,
// the chunk's queries and output sums (transposed), one scale per row, and a block of converted
// keys or values.
// The vdpbf16ps attention (attend_rows_bf16_avx512bf16) also keeps a block's softmax weights as
// pairs of high and low bf16 parts there.
constexpr long long attend_scratch_floats(long long d, long long slots) {
  return kAttendRowChunk * (slots + 2 * d + 1) + kAttendWidenSlots * d +
         kAttendWidenSlots * kAttendRowChunk;
}

// Compiled with AVX-512F / with AVX2+FMA enabled (both with F16C, which the bf16/f16 kernels
// use); call only where the CPU has them. Null on processors for which these kernels are not
// built. The attention kernels take only a head size that is a multiple of the vector width
// (kAvx512Width, kAvx2Width).
// (type, name) of each kernel avx2.cpp and avx512.cpp export as name_avx2 / name_avx512:
// declared here, defined by isa_exports.inl in both files, so the two sets stay one shape.
#define PROMPTCACHE_ISA_KERNELS(X)      \
  X(LinearRowsFn, linear_rows)          \
  X(LinearRowsBf16Fn, linear_rows_bf16) \
  X(LinearRowsF16Fn, linear_rows_f16)   \
  X(WidenOf<Bf16>, widen_bf16)          \
  X(WidenOf<F16>, widen_f16)            \
  X(LinearRowsQ8Fn, linear_rows_q8)     \
  X(WidenQ8Fn, widen_q8)                \
  X(AttendRowsFn, attend_rows)
#define PROMPTCACHE_DECLARE_ISA_KERNEL(type, name) \
  extern const type name##_avx512;                 \
  extern const type name##_avx2;
PROMPTCACHE_ISA_KERNELS(PROMPTCACHE_DECLARE_ISA_KERNEL)
#undef PROMPTCACHE_DECLARE_ISA_KERNEL
constexpr long long kAvx512Width = 16, kAvx2Width = 8;

// ---- bf16 weights times x rounded to bf16 (AVX-512 BF16, avx512_bf16.cpp) ----
// x is rounded to bf16 once per call (round to nearest even) into rows of bf16_dot_stride(k)
// values, zero-padded; then out[t * ldo + j] = sum_i xb[t * stride + i] * w[j * k + i] for t in
// [0, m) and j in [n0, n1), products of bf16 pairs summed in f32 (vdpbf16ps). Each output
// element is summed in one fixed order whatever m, the tails or the split over threads, so a
// row's result does not depend on the other rows of the call.
constexpr long long kBf16DotChunk = 32;
constexpr long long bf16_dot_stride(long long k) {
  return (k + kBf16DotChunk - 1) / kBf16DotChunk * kBf16DotChunk;
}
using RoundBf16Fn = void (*)(const float* x, long long m, long long k, Bf16* xb);
using LinearRowsBf16DotFn = void (*)(const Bf16* xb, long long m, long long k, const Bf16* w,
                                     long long n0, long long n1, float* out, long long ldo);
// Compiled with AVX-512 F/BW/VL/BF16; call only where the CPU has them (null where this
// compiler could not build them).
extern const RoundBf16Fn round_bf16_avx512bf16;
extern const LinearRowsBf16DotFn linear_rows_bf16_dot_avx512bf16;
// The fused attention (AttendArgs) for bf16 keys and values and at least kAttendLaneMinRows
// query rows, d a multiple of kAvx512Width, with vdpbf16ps: the queries and the softmax
// numerators are split into a high and a low bf16 part each (x = high + low to 2^-16 of x) and
// both multiplied with the stored keys and values as they are, products summed in f32; the
// softmax and the output are f32. The result is the f32 attention over the bf16 states to
// about 2^-16 relative, in another order of sums.
// A row's output does not depend on the other rows of the call. Fewer rows (a decode step) are
// attend_rows_avx512's.
extern const AttendRowsFn attend_rows_bf16_avx512bf16;

}  // namespace promptcache::kernels
