/* The SIMD layer of kernels.c (included by it, after its types): 32 weight quants (unsigned
 * bytes, or signed for Q8_0 and the IQ4 types), their integer dots with 32 int8 or int16
 * activations as 8 int32 lane sums (for the super-block types: scaled by the sub-blocks'
 * integer scales and accumulated over a super-block), fp32 accumulation, dequantized stores.
 * Two implementations: AVX2 intrinsics (HWPLUG_GGML_AVX2; with HWPLUG_GGML_VNNI the int8
 * dots use AVX-512 VNNI's vpdpbusd / vpdpwssd on 256-bit vectors) and GNU C vector
 * extensions with the same 8 lanes. Every int8 dot sums the same products into the same
 * lanes in each, so the integer results are equal. */
#ifndef HWPLUG_GGML_SIMD_H
#define HWPLUG_GGML_SIMD_H

/* the fp16 scale at p (unaligned) as fp32 */
INLINE float fp16_to_fp32(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#ifdef HWPLUG_GGML_AVX2
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
    uint32_t bits;
    float f;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else { /* zero or subnormal: mant * 2^-24 is exact */
        f = (float)mant * 5.9604644775390625e-8f;
        memcpy(&bits, &f, 4);
        bits |= sign;
    }
    memcpy(&f, &bits, 4);
    return f;
#endif
}

/* ---- the SIMD layer: 32 weight quants, their dot with 32 int8 or int16 activations ---- */
#ifdef HWPLUG_GGML_AVX2
typedef __m256i u8x32;
typedef __m256i isum_t; /* 8 int32 partial sums */

INLINE __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
INLINE u8x32 load_u8(const void *p) { return load32(p); }
/* 16 bytes -> their 16 low nibbles, then their 16 high nibbles (legacy block order) */
INLINE u8x32 nibbles16(const uint8_t *p) {
    __m128i t = _mm_loadu_si128((const __m128i *)p);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0F));
}
INLINE u8x32 lo4(const uint8_t *p) { return _mm256_and_si256(load32(p), _mm256_set1_epi8(0x0F)); }
INLINE u8x32 hi4(const uint8_t *p) {
    return _mm256_and_si256(_mm256_srli_epi16(load32(p), 4), _mm256_set1_epi8(0x0F));
}
/* (p[l] >> shift) & mask for l < 32 */
INLINE u8x32 field(const uint8_t *p, int shift, int mask) {
    return _mm256_and_si256(_mm256_srli_epi16(load32(p), shift), _mm256_set1_epi8((char)mask));
}
/* v | (((p[l] >> shift) & mask) << at) for l < 32 (the field fits the byte at `at`) */
INLINE u8x32 or_bits(u8x32 v, const uint8_t *p, int shift, int mask, int at) {
    return _mm256_or_si256(v, _mm256_slli_epi16(field(p, shift, mask), at));
}
/* table[u[l]] for nibbles u (table: 16 bytes) */
INLINE u8x32 lookup16(u8x32 u, const uint8_t *table) {
    return _mm256_shuffle_epi8(
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)table)), u);
}
/* bytes u - 128 as signed bytes (u ^ 0x80) */
INLINE u8x32 minus128(u8x32 u) { return _mm256_xor_si256(u, _mm256_set1_epi8((char)0x80)); }
/* bytes u - c (wrapping: signed bytes for u < c) */
INLINE u8x32 sub_u8(u8x32 u, int c) { return _mm256_sub_epi8(u, _mm256_set1_epi8((char)c)); }
/* v | (bit l of bits) << 4 for l < 32 */
INLINE u8x32 or_bits32(u8x32 v, uint32_t bits) {
    const __m256i spread = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                             0x0101010101010101, 0x0000000000000000);
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread);
    bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7FBFDFEFF7FBFDFE));
    __m256i set = _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
    return _mm256_or_si256(v, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
}
/* u . x for unsigned bytes u and int8 x, |x| <= 127 (the products of a pair fit int16: u <=
 * 128): lane k sums products 4k..4k+3 */
INLINE isum_t dot_u8v(u8x32 u, __m256i x) {
#ifdef HWPLUG_GGML_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, x);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
#endif
}
/* w . x for int8 w (as bytes, >= -128): |w| against x with w's sign */
INLINE isum_t dot_s8(u8x32 w, const int8_t *x) {
    return dot_u8v(_mm256_sign_epi8(w, w), _mm256_sign_epi8(load32(x), w));
}
/* ---- the super-block types: sub-block scales in integer arithmetic ---- */
typedef __m256i scl_t; /* 16 int16: the scale of values 0..15, then of 16..31 */
/* 8 bytes at p, as one 8-byte load: the header's fields are written as 8-byte words just
 * before, and a load wider than the store that wrote it cannot take its value from the
 * store buffer (a stall of ~15 cycles per super-block and row) */
INLINE __m128i load8(const void *p) { return _mm_loadl_epi64((const __m128i *)p); }
INLINE __m128i load8x2(const void *p) {
    return _mm_unpacklo_epi64(load8(p), load8((const char *)p + 8));
}
/* a super-block's 16 (eight: n == 8) int8 scales as int16, scales 0..7 (lo) and 8..15 (hi)
 * in both 128-bit lanes, from which each 32 values' scales are one byte shuffle */
typedef struct { __m256i lo, hi; } kscales_t;
INLINE kscales_t kscales_load(const int8_t *sc, int n) {
    const __m128i lo = _mm_cvtepi8_epi16(load8(sc));
    return (kscales_t){_mm256_broadcastsi128_si256(lo),
                       n == 8 ? _mm256_setzero_si256() : _mm256_broadcastsi128_si256(
                                                _mm_cvtepi8_epi16(load8(sc + 8)))};
}
/* scale k0 for values 0..15 and k1 for 16..31 (k0 / 8 == k1 / 8; constants after inlining) */
INLINE scl_t kscale(const kscales_t *s, int k0, int k1) {
    const char a = (char)(2 * (k0 & 7)), b = (char)(2 * (k1 & 7));
    const __m256i pick = _mm256_setr_epi8(a, a + 1, a, a + 1, a, a + 1, a, a + 1, a, a + 1, a,
                                          a + 1, a, a + 1, a, a + 1, b, b + 1, b, b + 1, b,
                                          b + 1, b, b + 1, b, b + 1, b, b + 1, b, b + 1, b, b + 1);
    return _mm256_shuffle_epi8(k0 < 8 ? s->lo : s->hi, pick);
}
INLINE isum_t isum_zero(void) { return _mm256_setzero_si256(); }
/* s + the pairs' sums of int16 products p, each times its scale */
INLINE isum_t scaled_acc(isum_t s, __m256i p, scl_t sc) {
#ifdef HWPLUG_GGML_VNNI
    return _mm256_dpwssd_epi32(s, p, sc);
#else
    return _mm256_add_epi32(s, _mm256_madd_epi16(p, sc));
#endif
}
/* s + sc * (u . x) per half, u unsigned (<= 63: maddubs' pairs never saturate) */
INLINE isum_t dot_acc_u8(isum_t s, u8x32 u, const int8_t *x, scl_t sc) {
    return scaled_acc(s, _mm256_maddubs_epi16(u, load32(x)), sc);
}
/* the same for int8 w (|w| <= 127) */
INLINE isum_t dot_acc_s8(isum_t s, u8x32 w, const int8_t *x, scl_t sc) {
    return scaled_acc(s, _mm256_maddubs_epi16(_mm256_sign_epi8(w, w),
                                              _mm256_sign_epi8(load32(x), w)), sc);
}
INLINE int hsum4(__m128i v) {
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(v, _mm_shuffle_epi32(v, 0xB1)));
}
INLINE int hsum8_i32(__m256i p) {
    return hsum4(_mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1)));
}
/* sum_k a[k] b[k] for k < 16, int8 a (signed) or uint8 a */
/* the sum of the 8 int32 lanes */
INLINE int isum_total(isum_t s) { return hsum8_i32(s); }
INLINE int dot16_i8(const int8_t *a, const int16_t *b) {
    return hsum8_i32(_mm256_madd_epi16(_mm256_cvtepi8_epi16(load8x2(a)), load32(b)));
}
INLINE int dot16_u8(const uint8_t *a, const int16_t *b) {
    return hsum8_i32(_mm256_madd_epi16(_mm256_cvtepu8_epi16(load8x2(a)), load32(b)));
}
/* sum_j a[j] (b[2j] + b[2j + 1]) for j < 8 (|b[2j] + b[2j + 1]| < 2^15) */
INLINE int dot8_u8_pairs(const uint8_t *a, const int16_t *b) {
    const __m128i pairs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)b),
                                         _mm_loadu_si128((const __m128i *)(b + 8)));
    return hsum4(_mm_madd_epi16(_mm_cvtepu8_epi16(load8(a)), pairs));
}
/* int16 activations (the 32-value types): the weights widened to int16, _mm256_madd_epi16
 * pairs, 8 int32 lanes of 4 products each. Largest lane: Q8_0, 4 * 128 * 32767 < 2^24. */
INLINE __m256i widen_lo(u8x32 u) { return _mm256_cvtepu8_epi16(_mm256_castsi256_si128(u)); }
INLINE __m256i widen_hi(u8x32 u) { return _mm256_cvtepu8_epi16(_mm256_extracti128_si256(u, 1)); }
/* lo . x[0..15] + hi . x[16..31] (VNNI: the pairs' sums by vpdpwssd, the same lanes) */
INLINE isum_t dot16_pair(__m256i lo, __m256i hi, const int16_t *x) {
#ifdef HWPLUG_GGML_VNNI
    return _mm256_dpwssd_epi32(_mm256_madd_epi16(lo, load32(x)), hi, load32(x + 16));
#else
    return _mm256_add_epi32(_mm256_madd_epi16(lo, load32(x)),
                            _mm256_madd_epi16(hi, load32(x + 16)));
#endif
}
typedef struct { __m256i lo, hi; } wide_t; /* 32 weight quants as int16: 0..15, 16..31 */
INLINE wide_t widen(u8x32 u) { return (wide_t){widen_lo(u), widen_hi(u)}; }
/* nibbles16, widened: one widening of the 16 bytes, then their low and high nibbles */
INLINE wide_t nibbles16_wide(const uint8_t *p) {
    const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    return (wide_t){_mm256_and_si256(b, _mm256_set1_epi16(0x0F)), _mm256_srli_epi16(b, 4)};
}
INLINE isum_t dot16_wide(const wide_t *w, const int16_t *x) { return dot16_pair(w->lo, w->hi, x); }
/* the int16 weight quants minus c */
INLINE wide_t wide_sub(wide_t w, int c) {
    const __m256i v = _mm256_set1_epi16((short)c);
    return (wide_t){_mm256_sub_epi16(w.lo, v), _mm256_sub_epi16(w.hi, v)};
}
/* 32 int8 weight quants, widened */
INLINE wide_t s8_wide(const int8_t *w) {
    return (wide_t){_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w)),
                    _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 16)))};
}
/* lane m: the sum of s[m]'s eight lanes (the hadds pair lanes within each 128-bit half,
 * the last step adds the halves) */
INLINE __m256i hsum8(const isum_t s[8]) {
    const __m256i u0 = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]),
                                         _mm256_hadd_epi32(s[2], s[3]));
    const __m256i u1 = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]),
                                         _mm256_hadd_epi32(s[6], s[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20),
                            _mm256_permute2x128_si256(u0, u1, 0x31));
}
/* o[l] = d * (u[l] - offset) + add, with d, add = d0, add0 for l < 16 and d1, add1 after */
INLINE void store_f32(u8x32 u, float d0, float d1, int offset, float add0, float add1,
                      float *o) {
    const __m256i off = _mm256_set1_epi32(offset);
    __m128i halves[2] = {_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1)};
    for (int h = 0; h < 2; ++h) {
        const __m256 vd = _mm256_set1_ps(h ? d1 : d0), va = _mm256_set1_ps(h ? add1 : add0);
        __m256i lo = _mm256_sub_epi32(_mm256_cvtepu8_epi32(halves[h]), off);
        __m256i hi = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(halves[h], 8)), off);
        _mm256_storeu_ps(o + 16 * h, _mm256_fmadd_ps(vd, _mm256_cvtepi32_ps(lo), va));
        _mm256_storeu_ps(o + 16 * h + 8, _mm256_fmadd_ps(vd, _mm256_cvtepi32_ps(hi), va));
    }
}
/* max |x[l]| for l < 32 */
INLINE float block_amax(const float *x) {
    const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256 v = _mm256_and_ps(_mm256_loadu_ps(x), abs);
    for (int k = 8; k < 32; k += 8)
        v = _mm256_max_ps(v, _mm256_and_ps(_mm256_loadu_ps(x + k), abs));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}
/* q[l] = x[l] * id rounded to nearest even, l < 32 (cvtps under the default rounding mode:
 * the scalar layer's product plus and minus 1.5 * 2^23), as int8 (wide: int16); sums[h]:
 * the sum of q[16 h .. 16 h + 15]. |x id| stays within the target type. */
INLINE void quantize32(const float *x, float id, void *q, int wide, int sums[2]) {
    const __m256 vid = _mm256_set1_ps(id);
    __m256i v[4];
    for (int k = 0; k < 4; ++k)
        v[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), vid));
    /* lanes 0, 1: the sums of values 0 .. 15 and of 16 .. 31, each split over two halves */
    __m256i t = _mm256_hadd_epi32(_mm256_add_epi32(v[0], v[1]), _mm256_add_epi32(v[2], v[3]));
    t = _mm256_hadd_epi32(t, t);
    const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    sums[0] = _mm_cvtsi128_si32(h);
    sums[1] = _mm_extract_epi32(h, 1);
    /* packs interleaves the 128-bit halves; a permutation restores the order */
    const __m256i ab = _mm256_packs_epi32(v[0], v[1]), cd = _mm256_packs_epi32(v[2], v[3]);
    if (wide) {
        _mm256_storeu_si256((__m256i *)q, _mm256_permute4x64_epi64(ab, 0xD8));
        _mm256_storeu_si256((__m256i *)q + 1, _mm256_permute4x64_epi64(cd, 0xD8));
    } else {
        _mm256_storeu_si256((__m256i *)q,
                            _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd),
                                                        _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
}
#else /* GNU C vector extensions (GCC >= 9, clang): the same 8 lanes as the AVX2 layer */
typedef uint8_t u8x16 __attribute__((vector_size(16)));
typedef uint8_t u8x32 __attribute__((vector_size(32)));
typedef int8_t i8x32 __attribute__((vector_size(32)));
typedef int16_t i16x16 __attribute__((vector_size(32)));
typedef int16_t i16x32 __attribute__((vector_size(64)));
typedef int32_t i32x8 __attribute__((vector_size(32)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
typedef float f32x8 __attribute__((vector_size(32)));
typedef float f32x16 __attribute__((vector_size(64)));
typedef i32x8 isum_t;

INLINE u8x32 load_u8(const void *p) { u8x32 v; memcpy(&v, p, 32); return v; }
/* the halves (values 0..15, 16..31) of a vector of 32 lanes */
#define HALVES(half_type, v, lo, hi)     \
    half_type lo, hi;                    \
    memcpy(&lo, &(v), sizeof lo);        \
    memcpy(&hi, (const char *)&(v) + sizeof lo, sizeof hi)
INLINE u8x32 nibbles16(const uint8_t *p) {
    u8x16 t, lo, hi;
    memcpy(&t, p, 16);
    lo = t & 15;
    hi = t >> 4;
    u8x32 r;
    memcpy(&r, &lo, 16);
    memcpy((char *)&r + 16, &hi, 16);
    return r;
}
INLINE u8x32 lo4(const uint8_t *p) { return load_u8(p) & 15; }
INLINE u8x32 hi4(const uint8_t *p) { return load_u8(p) >> 4; }
INLINE u8x32 field(const uint8_t *p, int shift, int mask) {
    return (load_u8(p) >> shift) & (uint8_t)mask;
}
INLINE u8x32 or_bits(u8x32 v, const uint8_t *p, int shift, int mask, int at) {
    return v | (field(p, shift, mask) << at);
}
INLINE u8x32 lookup16(u8x32 u, const uint8_t *table) {
    for (int l = 0; l < 32; ++l) u[l] = table[u[l]];
    return u;
}
INLINE u8x32 minus128(u8x32 u) { return u ^ 0x80; }
INLINE u8x32 sub_u8(u8x32 u, int c) { return u - (uint8_t)c; }
INLINE u8x32 or_bits32(u8x32 v, uint32_t bits) {
    for (int l = 0; l < 32; ++l) v[l] |= (uint8_t)(((bits >> l) & 1) << 4);
    return v;
}
/* products of 32 lanes -> 8 sums of 4, as maddubs + madd order them (|products| <= 16256) */
INLINE isum_t sum_products(const i16x32 *p, int sc0, int sc1) {
    HALVES(i16x16, *p, lo, hi);
    i32x16 wide_lo = __builtin_convertvector(lo, i32x16) * sc0,
           wide_hi = __builtin_convertvector(hi, i32x16) * sc1;
    i32x16 both = wide_lo + wide_hi; /* lane k: products k and 16 + k */
    HALVES(i32x8, both, a, b);
    return a + b;
}
/* the products of int8 w (as bytes) and x */
INLINE i16x32 products_s8(u8x32 w, const int8_t *x) {
    i8x32 xs;
    memcpy(&xs, x, 32);
    return __builtin_convertvector((i8x32)w, i16x32) * __builtin_convertvector(xs, i16x32);
}
INLINE isum_t dot_s8(u8x32 w, const int8_t *x) {
    const i16x32 p = products_s8(w, x);
    return sum_products(&p, 1, 1);
}
typedef struct { int lo, hi; } scl_t;
typedef struct { const int8_t *sc; } kscales_t;
INLINE kscales_t kscales_load(const int8_t *sc, int n) { (void)n; return (kscales_t){sc}; }
INLINE scl_t kscale(const kscales_t *s, int k0, int k1) { return (scl_t){s->sc[k0], s->sc[k1]}; }
INLINE isum_t isum_zero(void) { return (isum_t){0}; }
INLINE isum_t dot_acc_u8(isum_t s, u8x32 u, const int8_t *x, scl_t sc) {
    i8x32 xs;
    memcpy(&xs, x, 32);
    const i16x32 p = __builtin_convertvector(u, i16x32) * __builtin_convertvector(xs, i16x32);
    return s + sum_products(&p, sc.lo, sc.hi);
}
INLINE isum_t dot_acc_s8(isum_t s, u8x32 w, const int8_t *x, scl_t sc) {
    const i16x32 p = products_s8(w, x);
    return s + sum_products(&p, sc.lo, sc.hi);
}
INLINE int isum_total(isum_t s) {
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}
INLINE int dot16_i8(const int8_t *a, const int16_t *b) {
    int s = 0;
    for (int k = 0; k < 16; ++k) s += a[k] * b[k];
    return s;
}
INLINE int dot16_u8(const uint8_t *a, const int16_t *b) {
    int s = 0;
    for (int k = 0; k < 16; ++k) s += a[k] * b[k];
    return s;
}
INLINE int dot8_u8_pairs(const uint8_t *a, const int16_t *b) {
    int s = 0;
    for (int j = 0; j < 8; ++j) s += a[j] * (b[2 * j] + b[2 * j + 1]);
    return s;
}
/* int16 activations: w . x as 8 sums of 4 (lane k: products k, 8 + k, 16 + k, 24 + k; the
 * int32 bounds of the AVX2 layer hold) */
INLINE isum_t dot16(const i16x32 *w, const int16_t *x) {
    i16x32 xs;
    memcpy(&xs, x, sizeof xs);
    HALVES(i16x16, *w, wl, wh);
    HALVES(i16x16, xs, xl, xh);
    const i32x16 p = __builtin_convertvector(wl, i32x16) * __builtin_convertvector(xl, i32x16) +
                     __builtin_convertvector(wh, i32x16) * __builtin_convertvector(xh, i32x16);
    HALVES(i32x8, p, a, b);
    return a + b;
}
typedef i16x32 wide_t;
INLINE wide_t widen(u8x32 u) { return __builtin_convertvector(u, i16x32); }
INLINE wide_t nibbles16_wide(const uint8_t *p) { return widen(nibbles16(p)); }
INLINE isum_t dot16_wide(const wide_t *w, const int16_t *x) { return dot16(w, x); }
INLINE wide_t wide_sub(wide_t w, int c) { return w - (int16_t)c; }
INLINE wide_t s8_wide(const int8_t *w) {
    i8x32 ws;
    memcpy(&ws, w, 32);
    return __builtin_convertvector(ws, i16x32);
}
INLINE float block_amax(const float *x) {
    float amax = 0.0f;
    for (int l = 0; l < 32; ++l) amax = fabsf(x[l]) > amax ? fabsf(x[l]) : amax;
    return amax;
}
INLINE void quantize32(const float *x, float id, void *q, int wide, int sums[2]) {
    for (int h = 0; h < 2; ++h) {
        sums[h] = 0;
        for (int l = 16 * h; l < 16 * h + 16; ++l) { /* + 1.5 * 2^23 rounds half to even */
            const int v = (int)((x[l] * id + 0x1.8p23f) - 0x1.8p23f);
            if (wide)
                ((int16_t *)q)[l] = (int16_t)v;
            else
                ((int8_t *)q)[l] = (int8_t)v;
            sums[h] += v;
        }
    }
}
INLINE void store_f32(u8x32 u, float d0, float d1, int offset, float add0, float add1,
                      float *o) {
    HALVES(u8x16, u, lo, hi);
    f32x16 a = (__builtin_convertvector(lo, f32x16) - (float)offset) * d0 + add0,
           b = (__builtin_convertvector(hi, f32x16) - (float)offset) * d1 + add1;
    memcpy(o, &a, sizeof a);
    memcpy(o + 16, &b, sizeof b);
}
#endif

#endif /* HWPLUG_GGML_SIMD_H */
