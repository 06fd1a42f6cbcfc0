/* GGUF (ggml) quantized blocks, computed on the CPU without dequantizing the weight.
 *
 * hwplug_ggml_linear: out[M, N] = x[M, K] @ dequantize(w[N, row_bytes]).T (+ bias), fp32,
 *   written with a row stride of ldo floats (a column slice of a wider output). The
 *   activations are quantized as llama.cpp does, each row once per call, rounding to nearest
 *   even:
 *   - for the types of 32-value blocks: per block of 32 to int16 (scale max|x| / 32767) or
 *     int8 (max|x| / 127); each weight block is dotted with them in integer arithmetic (exact:
 *     the int32 bounds are stated at legacy_values), then one fp32 FMA per block and pair,
 *     in the AVX2 builds eight pairs at once (legacy_tile_of), in the VNNI build's groups
 *     16 (lgroup.h);
 *   - for the super-block types (Q2_K .. Q6_K, IQ4_XS): per super-block of 256 to int8 (one
 *     scale, max|x| / 127) with the sums of each 16 quants (Q8_K, see q8k_t); the weight's
 *     integer sub-block scales multiply the int16 pair sums of the 8-bit products (madd, or
 *     VNNI's vpdpwssd), the sub-blocks' mins or centres meet the activations' 16-value sums
 *     in integer arithmetic too, and a super-block costs one fp32 FMA per pair of rows. From
 *     KG_MIN_ROWS activation rows the VNNI build takes them 16 weight rows at a time
 *     instead, one row per 32-bit lane of AVX-512 vectors (kgroup.h), with the same fp32
 *     arithmetic per pair, so each output is the same whichever kernel computes it.
 *   hwplug_ggml_repack repacks Q4_K, Q5_K, Q6_K and IQ4_XS weights once for those groups
 *   (same bytes, held instead of the rows), hwplug_ggml_linear_repacked multiplies them:
 *   bitwise the same.
 *   Output rows are split over OpenMP threads; each output is one thread's, computed in
 *   the same order whatever the thread count and whatever the other activation rows of the
 *   call (batch-invariant: a token's row is the same in a decode step of one, of many, or
 *   in a prefill).
 * hwplug_ggml_dequantize: the fp32 values of selected rows (an embedding lookup, a tile);
 *   hwplug_ggml_dequantize_repacked the same from weights hwplug_ggml_repack wrote (a tied
 *   table that is also the LM head held once, repacked).
 *
 * Types (gguf.GGMLQuantizationType values): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL (blocks of
 * 32); Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS (super-blocks of 256). Block layouts are those of
 * ggml-common.h. Built three times from this file and its SIMD layer (simd.h): with
 * HWPLUG_GGML_AVX2 (AVX2 + FMA + F16C intrinsics), with HWPLUG_GGML_AVX2 and
 * HWPLUG_GGML_VNNI (the int8 dots by AVX-512 VNNI on 256-bit vectors) and without (portable:
 * GNU C vector extensions, which GCC and clang lower to each CPU's SIMD). All compute the
 * same integer dots, and for the 32-value types the same fp32 results; for the super-block
 * types the portable build groups a block's products into its 8 lanes differently, so its
 * fp32 results may differ in the last bits.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef HWPLUG_GGML_AVX2
#include <immintrin.h>
#endif

enum { T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8,
       T_Q2_K = 10, T_Q3_K = 11, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_IQ4_NL = 20,
       T_IQ4_XS = 23 };
enum { QK = 32, QK_K = 256, MT_MAX = 4 };

#define INLINE static inline __attribute__((always_inline))
/* Every weight prefetch: for reading, into L2 and L1 (prefetcht1), not non-temporal: on a
 * 2-vCPU Zen 4, a repacked Q6_K decode row (1024 x 4096, 40 copies from memory, two
 * threads) read 15.8 GB/s with the non-temporal hint and 34 with this one (Q4_K: 33.5
 * either way). */
#define PREFETCH(p) __builtin_prefetch((p), 0, 2)
/* Ask for the same block of the weight rows two groups ahead (2 * MT_MAX rows further):
 * a tile's rows are short streams that the hardware prefetchers do not ramp up on in time,
 * and in a decode step the weights come from memory, not cache. */
#define PREFETCH_NEXT_GROUP(blk, ld) PREFETCH((blk) + 2 * MT_MAX * (ld))
/* the same for every cache line of a super-block of `bytes` bytes */
#define PREFETCH_NEXT_GROUP_BLOCK(blk, ld, bytes)                     \
    for (int pf = 0; pf < (bytes); pf += 64) PREFETCH_NEXT_GROUP((blk) + pf, ld)

/* The quantized activations, block-major so that a block's rows lie side by side: for block
 * b of row m, i = b * rows + m indexes
 * - for the 32-value types (int8 or int16, the `wide` flag the kernels pass along): the
 *   quants q[32 i ..], the scale d[i] and d[i] * sum(q) as sd[i] (int8: sum(q) as sum[i]);
 * - for the super-block types: the q8k_t ((q8k_t *)q)[i] (d and sd unused). */
typedef struct {
    void *q;
    float *d, *sd;
    int64_t nb, rows; /* blocks (of 32, or super-blocks of 256) per row; rows */
    int32_t *sum;     /* int8 quants of 32-value blocks: sum(q) of block i, else NULL */
} act_t;
/* a super-block of activations (Q8_K): the scale, the sums of each 16 quants, the quants */
typedef struct {
    float d;
    int16_t bsums[QK_K / 16];
    int8_t q[QK_K];
} q8k_t;
#define K8(a, i) ((const q8k_t *)(a)->q + (i))

#include "simd.h"

/* ---- activations: int8 or int16 (wide) per block of 32 ---- */
/* the quants of block i of the activations, and their dot products with a weight block */
#define Q8(a, i) ((const int8_t *)(a)->q + QK * (i))
#define Q16(a, i) ((const int16_t *)(a)->q + QK * (i))
/* IQ4_NL's and IQ4_XS's 16 values (-127 .. 113), plus 128 (unsigned bytes) */
static const uint8_t IQ4_VALUES[16] = {1,   24,  45,  63,  79,  93,  106, 118,
                                       129, 141, 153, 166, 181, 197, 217, 241};

/* ---- the 32-value block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) ----
 * Per pair (weight row, activation row), whichever kernel and build computes it, over the
 * blocks in order:
 *   acc = fmaf(tot, dw * dx, acc), tot the exact integer dot of the block's weight values
 *   (legacy_values) with the activations' quants, dw and dx their scales, and for Q4_1 and
 *   Q5_1 off = fmaf(m, sd, off) (m the block's minimum, sd = dx * the quants' sum),
 * then acc + off. A row's result therefore depends neither on the rows beside it in the
 * call (batch invariance), nor on the tile that computed it, nor on the build. Largest
 * |tot|: Q8_0 with int16 activations, 32 * 128 * 32767 < 2^27 (each int32 lane < 2^24). */
INLINE int legacy_bytes(int type) {
    switch (type) {
    case T_Q4_1: return 20;
    case T_Q5_0: return 22;
    case T_Q5_1: return 24;
    case T_Q8_0: return 34;
    default: return 18; /* Q4_0, IQ4_NL */
    }
}
INLINE int legacy_has_min(int type) { return type == T_Q4_1 || type == T_Q5_1; }
/* A block's weight values w / d as the dots take them, into u (int8 activations: signed
 * bytes) or uw (wide: int16 activations): Q4_0 q - 8 and Q5_0 q - 16 (16 bytes of nibbles
 * after the scale, Q5_0's fifth bits between), Q4_1 and Q5_1 q (the minimum m after the
 * scale: w = d q + m), Q8_0 its int8 q, IQ4_NL its nibbles' IQ4_VALUES (int8 only). */
/* What legacy_values subtracts from the block's unsigned quants (legacy_unsigned) */
INLINE int legacy_center(int type) {
    switch (type) {
    case T_Q4_0: return 8;
    case T_Q5_0: return 16;
    case T_Q4_1: case T_Q5_1: return 0;
    default: return 128; /* Q8_0, IQ4_NL */
    }
}
/* the block's values plus legacy_center as unsigned bytes: Q8_0's int8 q + 128 (q ^ 0x80),
 * IQ4_NL's IQ4_VALUES, the others' quants */
INLINE u8x32 legacy_unsigned(int type, const uint8_t *blk) {
    if (type == T_Q8_0) return minus128(load_u8(blk + 2));
    if (type == T_IQ4_NL) return lookup16(nibbles16(blk + 2), IQ4_VALUES);
    const uint8_t *qs = blk + legacy_bytes(type) - 16;
    u8x32 v = nibbles16(qs);
    if (type == T_Q5_0 || type == T_Q5_1) {
        uint32_t h;
        memcpy(&h, qs - 4, 4);
        v = or_bits32(v, h);
    }
    return v;
}
INLINE void legacy_values(int type, const uint8_t *blk, int wide, u8x32 *u, wide_t *uw) {
    if (type == T_Q8_0) {
        if (wide)
            *uw = s8_wide((const int8_t *)(blk + 2));
        else
            *u = load_u8(blk + 2);
        return;
    }
    const int center = legacy_center(type);
    if (wide && (type == T_Q4_0 || type == T_Q4_1))
        *uw = wide_sub(nibbles16_wide(blk + legacy_bytes(type) - 16), center);
    else if (wide)
        *uw = wide_sub(widen(legacy_unsigned(type, blk)), center);
    else
        *u = sub_u8(legacy_unsigned(type, blk), center);
}
/* the block's values (legacy_values) against the quants of block i of the activations */
INLINE isum_t legacy_dot(const u8x32 *u, const wide_t *uw, const act_t *a, int64_t i,
                         int wide) {
    return wide ? dot16_wide(uw, Q16(a, i)) : dot_s8(*u, Q8(a, i));
}

/* row x of the activations into a (block-major, see act_t), m its index: 32-value types */
INLINE void quantize_row(const float *restrict x, const act_t *a, int64_t m, int wide) {
    const float qmax = wide ? 32767.0f : 127.0f;
    for (int64_t b = 0; b < a->nb; ++b, x += QK) {
        const int64_t i = b * a->rows + m;
        const float amax = block_amax(x), id = amax > 0.0f ? qmax / amax : 0.0f;
        int sums[2];
        quantize32(x, id, (char *)a->q + (size_t)(QK * i) * (wide ? 2 : 1), wide, sums);
        a->d[i] = amax / qmax;
        a->sd[i] = a->d[i] * (float)(sums[0] + sums[1]);
        if (a->sum) a->sum[i] = sums[0] + sums[1];
    }
}

/* the same for the super-block types: Q8_K super-blocks of int8 (see q8k_t) */
INLINE void quantize_row_k(const float *restrict x, const act_t *a, int64_t m) {
    for (int64_t sb = 0; sb < a->nb; ++sb, x += QK_K) {
        q8k_t *y = (q8k_t *)a->q + sb * a->rows + m;
        float amax = 0.0f;
        for (int b = 0; b < QK_K / QK; ++b) {
            const float v = block_amax(x + QK * b);
            amax = v > amax ? v : amax;
        }
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        for (int b = 0; b < QK_K / QK; ++b) {
            int sums[2];
            quantize32(x + QK * b, id, y->q + QK * b, 0, sums);
            y->bsums[2 * b] = (int16_t)sums[0];
            y->bsums[2 * b + 1] = (int16_t)sums[1];
        }
        y->d = amax / 127.0f;
    }
}

/* for each activation row m of a tile of nr weight rows by mt activation rows: t, the
 * accumulator of the pair (r, m) */
#define FOR_M _Pragma("GCC unroll 4") for (int m = 0, t = r * mt; m < mt; ++m, ++t)
/* the index of block b of activation row m (see act_t) */
#define I(b) ((b) * a->rows + m)

/* ---- the 32-value block types: a tile of nrv <= LT_LANES / mtp weight rows (ld bytes
 * apart) by mt <= mtp activation rows (mtp: 1, 2, 4 or 8; `a` starts at the tile's first),
 * res[r * mtp + m] for the pair (r, m), each pair's sums as legacy_values states ---- */
enum { LT_LANES = 8 };
#ifdef HWPLUG_GGML_AVX2
/* One pair per fp32 lane, lane r * mtp + m: (8, 1) for one activation row, (4, 2), (2, 4)
 * for three and four, (1, 8) from five (a verify step's rows, a prefill's chunks of 8).
 * Each weight block is decoded once for the tile's activation rows, the eight pairs'
 * integer dots are summed across lanes together (hsum8), and the block then costs one
 * fp32 FMA for all eight pairs (Q4_1, Q5_1: one more for the minimum), lane by lane the
 * per-pair arithmetic above. */
/* lane l: the fp16 at p + (l / mtp) * ld as fp32 (0 for the rows from nrv on) */
INLINE __m256 lanes_fp16(const uint8_t *p, int64_t ld, int mtp, int nrv) {
    uint16_t h[LT_LANES] = {0};
    _Pragma("GCC unroll 8") for (int r = 0; r < LT_LANES / mtp; ++r)
        if (r < nrv) memcpy(&h[r], p + r * ld, 2);
    return _mm256_cvtph_ps(_mm_setr_epi16(
        (short)h[0 / mtp], (short)h[1 / mtp], (short)h[2 / mtp], (short)h[3 / mtp],
        (short)h[4 / mtp], (short)h[5 / mtp], (short)h[6 / mtp], (short)h[7 / mtp]));
}
/* lane l: p[l % mtp], 0 where the mask (lanes of the rows m < mt) is clear; reads nothing
 * past p[mt - 1] */
INLINE __m256 lanes_act(const float *p, int mtp, __m256i mask) {
    switch (mtp) {
    case 1: return _mm256_broadcast_ss(p);
    case 2: { double pair; memcpy(&pair, p, 8); return _mm256_castpd_ps(_mm256_set1_pd(pair)); }
    case 4: {
        const __m128 v = _mm_maskload_ps(p, _mm256_castsi256_si128(mask));
        return _mm256_set_m128(v, v);
    }
    default: return _mm256_maskload_ps(p, mask);
    }
}
INLINE void legacy_tile_of(int type, const uint8_t *w, int64_t ld, int nrv, const act_t *a,
                           int mtp, int mt, float *res, int wide) {
    const int nr = LT_LANES / mtp, bytes = legacy_bytes(type);
    const __m256i mask = _mm256_cmpgt_epi32(
        _mm256_set1_epi32(mt), _mm256_setr_epi32(0, 1 % mtp, 2 % mtp, 3 % mtp, 4 % mtp,
                                                 5 % mtp, 6 % mtp, 7 % mtp));
    __m256 acc = _mm256_setzero_ps(), off = _mm256_setzero_ps();
    for (int64_t b = 0; b < a->nb; ++b) {
        const uint8_t *blk = w + b * bytes;
        isum_t s[LT_LANES];
        _Pragma("GCC unroll 8") for (int r = 0; r < nr; ++r) {
            u8x32 u = _mm256_setzero_si256();
            wide_t uw = {u, u};
            if (r < nrv) {
                PREFETCH_NEXT_GROUP(blk + r * ld, ld);
                legacy_values(type, blk + r * ld, wide, &u, &uw);
            }
            _Pragma("GCC unroll 8") for (int m = 0; m < mtp; ++m) s[r * mtp + m] =
                r < nrv && m < mt ? legacy_dot(&u, &uw, a, I(b), wide) : isum_zero();
        }
        const __m256 scale = _mm256_mul_ps(lanes_fp16(blk, ld, mtp, nrv),
                                           lanes_act(a->d + b * a->rows, mtp, mask));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hsum8(s)), scale, acc);
        if (legacy_has_min(type))
            off = _mm256_fmadd_ps(lanes_fp16(blk + 2, ld, mtp, nrv),
                                  lanes_act(a->sd + b * a->rows, mtp, mask), off);
    }
    _mm256_storeu_ps(res, _mm256_add_ps(acc, off));
}
#else
/* portable: pair by pair, the same arithmetic */
INLINE void legacy_tile_of(int type, const uint8_t *w, int64_t ld, int nrv, const act_t *a,
                           int mtp, int mt, float *res, int wide) {
    const int bytes = legacy_bytes(type);
    for (int r = 0; r < nrv; ++r) {
        float acc[LT_LANES] = {0}, off[LT_LANES] = {0};
        for (int64_t b = 0; b < a->nb; ++b) {
            const uint8_t *blk = w + r * ld + b * bytes;
            u8x32 u;
            wide_t uw;
            legacy_values(type, blk, wide, &u, &uw);
            const float dw = fp16_to_fp32(blk);
            for (int m = 0; m < mt; ++m) {
                const int64_t i = I(b);
                acc[m] = fmaf((float)isum_total(legacy_dot(&u, &uw, a, i, wide)), dw * a->d[i],
                              acc[m]);
                if (legacy_has_min(type)) off[m] = fmaf(fp16_to_fp32(blk + 2), a->sd[i], off[m]);
            }
        }
        for (int m = 0; m < mt; ++m) res[r * mtp + m] = acc[m] + off[m];
    }
}
#endif
/* the tile with type, mtp, wide and the weight rows nrv compile-time constants in each
 * instance (NRV: nrv, a variable, for the tiles short of rows), and the activation rows mt
 * too in the tiles of 1 and 2 rows (always exact: mt == mtp; one thread, CPU time, loaded,
 * AVX2 build, Q8_0 1536 x 1536: 1.16x and 1.31x faster). Exact tiles of 3 rows (2 x 3
 * pairs) measured 1.12-1.4x faster at 3 rows, but the build that had them computed 5 rows
 * 0.75x as fast (cause not found), so 3 rows take the tiles of 4. */
#define LEGACY_TILE(T, MTP, W, NRV) \
    legacy_tile_of(T, w, ld, NRV, a, MTP, (MTP) <= 2 ? (MTP) : mt, res, W)
#define LEGACY_TYPES_OF(MTP, W, NRV)                                                    \
    switch (type) {                                                                     \
    case T_Q4_0: LEGACY_TILE(T_Q4_0, MTP, W, NRV); break;                               \
    case T_Q4_1: LEGACY_TILE(T_Q4_1, MTP, W, NRV); break;                               \
    case T_Q5_0: LEGACY_TILE(T_Q5_0, MTP, W, NRV); break;                               \
    case T_Q5_1: LEGACY_TILE(T_Q5_1, MTP, W, NRV); break;                               \
    case T_Q8_0: LEGACY_TILE(T_Q8_0, MTP, W, NRV); break;                               \
    default: if (!(W)) LEGACY_TILE(T_IQ4_NL, MTP, 0, NRV); break;                       \
    }
#define LEGACY_TYPES(MTP, W) LEGACY_TYPES_OF(MTP, W, nrv)
/* one activation row (a decode step): full tiles of LT_LANES weight rows unrolled */
#define LEGACY_TYPES_ONE(W)                                                             \
    if (nrv == LT_LANES) { LEGACY_TYPES_OF(1, W, LT_LANES) } else { LEGACY_TYPES(1, W) }
static void legacy_tile(int type, const uint8_t *w, int64_t ld, int nrv, const act_t *a,
                        int mtp, int mt, float *res, int wide) {
    switch (mtp * 2 + wide) {
    case 2: LEGACY_TYPES_ONE(0) break;
    case 3: LEGACY_TYPES_ONE(1) break;
    case 4: LEGACY_TYPES(2, 0) break;
    case 5: LEGACY_TYPES(2, 1) break;
    case 8: LEGACY_TYPES(4, 0) break;
    case 9: LEGACY_TYPES(4, 1) break;
    case 16: LEGACY_TYPES(8, 0) break;
    default: LEGACY_TYPES(8, 1) break;
    }
}
#undef LEGACY_TYPES_ONE
#undef LEGACY_TYPES
#undef LEGACY_TYPES_OF
#undef LEGACY_TILE

/* the 6-bit scales and mins of Q4_K / Q5_K's eight sub-blocks, four bytes at a time:
 * sc[j] = q[j] & 63, mn[j] = q[j + 4] & 63, and for j + 4 the low (sc) or high (mn) nibble of
 * q[j + 8] with the top two bits of q[j] (sc) or q[j + 4] (mn) above it; each stored as one
 * 8-byte word (the kernels read each with one 8-byte load: store forwarding) */
INLINE void k_scales(const uint8_t *q, uint8_t *sc, uint8_t *mn) {
    uint32_t a, b, c;
    memcpy(&a, q, 4);
    memcpy(&b, q + 4, 4);
    memcpy(&c, q + 8, 4);
    const uint32_t low6 = 0x3F3F3F3Fu, low4 = 0x0F0F0F0Fu, top2 = 0x03030303u;
    const uint32_t s0 = a & low6, m0 = b & low6, s1 = (c & low4) | (((a >> 6) & top2) << 4),
                   m1 = ((c >> 4) & low4) | (((b >> 6) & top2) << 4);
    const uint64_t scales = s0 | (uint64_t)s1 << 32, mins = m0 | (uint64_t)m1 << 32;
    memcpy(sc, &scales, 8);
    memcpy(mn, &mins, 8);
}

/* ---- the super-block types against Q8_K activations ----
 * A super-block's header as integers: w = d sc[k] (q - center) - dmin mn[k] for value q of
 * the k-th 16 values (the k-th 32 for the types of 32-value sub-blocks, k_per32: sc and mn
 * then hold 8), q the unsigned quants k_chunk decodes (IQ4_XS: its values plus 128, center
 * 128). k_header writes sc and mn as whole 8-byte words, which the kernels read back with
 * 8-byte loads (load8 in simd.h: store forwarding). */
typedef struct {
    float d, dmin;
    int8_t sc[16];
    uint8_t mn[16]; /* Q2_K, Q4_K, Q5_K only */
} khead_t;
INLINE int k_bytes(int type) {
    switch (type) {
    case T_Q2_K: return 84;
    case T_Q3_K: return 110;
    case T_Q4_K: return 144;
    case T_Q5_K: return 176;
    case T_Q6_K: return 210;
    default: return 136; /* IQ4_XS */
    }
}
INLINE int k_center(int type) {
    return type == T_Q3_K ? 4 : type == T_Q6_K ? 32 : type == T_IQ4_XS ? 128 : 0;
}
INLINE int k_has_mins(int type) { return type == T_Q2_K || type == T_Q4_K || type == T_Q5_K; }
INLINE int k_per32(int type) { return type == T_Q4_K || type == T_Q5_K || type == T_IQ4_XS; }
/* the index in sc and mn of the scale of values 16 k .. 16 k + 15 */
INLINE int k_index(int type, int k) { return k_per32(type) ? k >> 1 : k; }
/* Q2_K (scales[16]: 4-bit scale | 4-bit min << 4, qs[64] of 2-bit q, d, dmin);
 * Q3_K (hmask[32]: the third bits, qs[64] of 2-bit q, 12 bytes of 6-bit scales + 32, d);
 * Q4_K / Q5_K (d, dmin, 12 bytes of eight 6-bit scales and mins, Q5_K: qh[32], qs[128]);
 * Q6_K (ql[128], qh[64], int8 scales[16], d);
 * IQ4_XS (d, 16 bits of the scales' high bits, 4 bytes of their low nibbles, qs[128]):
 * 6-bit scales + 32 per 32 values */
INLINE void k_header(int type, const uint8_t *blk, khead_t *h) {
    switch (type) {
    case T_Q2_K: { /* eight scales (mins) at a time */
        uint64_t q[2], sc[2], mn[2];
        memcpy(q, blk, 16);
        for (int i = 0; i < 2; ++i) {
            sc[i] = q[i] & 0x0F0F0F0F0F0F0F0Fu;
            mn[i] = (q[i] >> 4) & 0x0F0F0F0F0F0F0F0Fu;
        }
        memcpy(h->sc, &sc[0], 8);
        memcpy(h->sc + 8, &sc[1], 8);
        memcpy(h->mn, &mn[0], 8);
        memcpy(h->mn + 8, &mn[1], 8);
        h->d = fp16_to_fp32(blk + 80);
        h->dmin = fp16_to_fp32(blk + 82);
        break;
    }
    case T_Q3_K: { /* scale k: the low (k < 8) or high nibble of byte k % 8, bits 2 (k / 4)
                    * of byte 8 + k % 4 above it, minus 32; four scales at a time */
        uint32_t q[3], s[4];
        memcpy(q, blk + 96, 12);
        const uint32_t low4 = 0x0F0F0F0Fu, two = 0x03030303u, top = 0x80808080u;
        s[0] = (q[0] & low4) | ((q[2] & two) << 4);
        s[1] = (q[1] & low4) | (((q[2] >> 2) & two) << 4);
        s[2] = ((q[0] >> 4) & low4) | (((q[2] >> 4) & two) << 4);
        s[3] = ((q[1] >> 4) & low4) | (((q[2] >> 6) & two) << 4);
        for (int i = 0; i < 4; ++i) /* each byte (< 64) minus 32, no borrow between bytes */
            s[i] = ((s[i] | top) - 0x20202020u) ^ top;
        const uint64_t lo = s[0] | (uint64_t)s[1] << 32, hi = s[2] | (uint64_t)s[3] << 32;
        memcpy(h->sc, &lo, 8);
        memcpy(h->sc + 8, &hi, 8);
        h->d = fp16_to_fp32(blk + 108);
        break;
    }
    case T_Q4_K: case T_Q5_K:
        h->d = fp16_to_fp32(blk);
        h->dmin = fp16_to_fp32(blk + 2);
        k_scales(blk + 4, (uint8_t *)h->sc, h->mn);
        break;
    case T_Q6_K:
        h->d = fp16_to_fp32(blk + 208);
        memcpy(h->sc, blk + 192, 16);
        break;
    default: { /* IQ4_XS */
        uint16_t high;
        memcpy(&high, blk + 2, 2);
        h->d = fp16_to_fp32(blk);
        uint64_t packed = 0;
        for (int b = 0; b < 8; ++b)
            packed |= (uint64_t)(uint8_t)((((blk[4 + b / 2] >> (4 * (b % 2))) & 15) |
                                           (((high >> (2 * b)) & 3) << 4)) - 32) << (8 * b);
        memcpy(h->sc, &packed, 8);
    }
    }
}
/* the unsigned quants of values 32 j .. 32 j + 31 of a super-block */
INLINE u8x32 k_chunk(int type, const uint8_t *blk, int j) {
    switch (type) {
    case T_Q2_K: return field(blk + 16 + 32 * (j >> 2), 2 * (j & 3), 3);
    case T_Q3_K: return or_bits(field(blk + 32 + 32 * (j >> 2), 2 * (j & 3), 3), blk, j, 1, 2);
    case T_Q4_K: case T_Q5_K: {
        const uint8_t *qs = blk + (type == T_Q5_K ? 48 : 16) + 32 * (j >> 1);
        const u8x32 u = (j & 1) ? hi4(qs) : lo4(qs);
        return type == T_Q5_K ? or_bits(u, blk + 16, j, 1, 4) : u;
    }
    case T_Q6_K: {
        const int h = j >> 2, s = j & 3;
        const uint8_t *ql = blk + 64 * h + 32 * (s & 1);
        return or_bits((s & 2) ? hi4(ql) : lo4(ql), blk + 128 + 32 * h, 2 * s, 3, 4);
    }
    default: return lookup16(nibbles16(blk + 8 + 16 * j), IQ4_VALUES); /* IQ4_XS */
    }
}
/* The super-block types: a super-block's dots, scaled and summed in int32 lanes, then one
 * fp32 FMA per pair of rows; the mins (or the centre) against the activations' 16-value
 * sums. Largest lane (Q6_K): 8 sub-blocks * 2 * (2 * 63 * 127) * 128 < 2^26.
 * Per pair (weight row, activation row) the fp32 arithmetic is fixed, whichever kernel runs
 * it (this one, or the row groups of kgroup.h): over the super-blocks in order,
 *   acc = fmaf(tot, d * dx, acc) with tot the exact integer dot of the super-block, and
 *   off = fmaf(dmin * dx, mins, off) (Q2_K, Q4_K, Q5_K) or fmaf(d * dx, centre * csum, off)
 *   (Q3_K, Q6_K), then acc - off (IQ4_XS: tot of the signed values, no offset),
 * so a row's result does not depend on how many rows the call has (batch invariance). */
INLINE void k_finish(int type, const khead_t *h, const q8k_t *x, int tot, float *acc,
                     float *off) {
    const int center = k_center(type);
    *acc = fmaf((float)tot, h->d * x->d, *acc);
    if (k_has_mins(type))
        *off = fmaf(h->dmin * x->d,
                    (float)(k_per32(type) ? dot8_u8_pairs(h->mn, x->bsums)
                                          : dot16_u8(h->mn, x->bsums)),
                    *off);
    else if (center && type != T_IQ4_XS)
        *off = fmaf(h->d * x->d, (float)(center * dot16_i8(h->sc, x->bsums)), *off);
}
INLINE void tile_k(int type, const uint8_t *w, int64_t ld, int nr, const act_t *a, int mt,
                   float *res) {
    float acc[MT_MAX] = {0}, off[MT_MAX] = {0};
    const int bytes = k_bytes(type);
    for (int64_t sb = 0; sb < a->nb; ++sb) {
        _Pragma("GCC unroll 4") for (int r = 0; r < nr; ++r) {
            const uint8_t *blk = w + r * ld + sb * bytes;
            PREFETCH_NEXT_GROUP_BLOCK(blk, ld, bytes);
            khead_t h;
            k_header(type, blk, &h);
            const kscales_t scales = kscales_load(h.sc, k_per32(type) ? 8 : 16);
            isum_t s[MT_MAX];
            _Pragma("GCC unroll 4") for (int m = 0; m < mt; ++m) s[m] = isum_zero();
            _Pragma("GCC unroll 8") for (int j = 0; j < 8; ++j) {
                const u8x32 u = k_chunk(type, blk, j);
                const scl_t sc =
                    kscale(&scales, k_index(type, 2 * j), k_index(type, 2 * j + 1));
                _Pragma("GCC unroll 4") for (int m = 0; m < mt; ++m) {
                    const int8_t *x = K8(a, I(sb))->q + 32 * j;
                    s[m] = type == T_IQ4_XS ? dot_acc_s8(s[m], minus128(u), x, sc)
                                            : dot_acc_u8(s[m], u, x, sc);
                }
            }
            FOR_M k_finish(type, &h, K8(a, I(sb)), isum_total(s[m]), &acc[t], &off[t]);
        }
    }
    _Pragma("GCC unroll 4") for (int t = 0; t < nr * mt; ++t) res[t] = acc[t] - off[t];
}

/* one tile of a super-block type; nr and mt are compile-time constants after inlining
 * into tile() */
INLINE void tile_of_type(int type, const uint8_t *w, int64_t ld, int nr, const act_t *a,
                         int mt, float *res) {
    switch (type) {
#define K_TILE(T) case T: tile_k(T, w, ld, nr, a, mt, res); break;
    K_TILE(T_Q2_K) K_TILE(T_Q3_K) K_TILE(T_Q4_K) K_TILE(T_Q5_K) K_TILE(T_Q6_K) K_TILE(T_IQ4_XS)
#undef K_TILE
    }
}

/* tile shapes (nr, mt): (4, 1), (2, 2), and (1, mt) for the rest; nr and mt compile-time
 * constants in each instance */
static void tile(int type, const uint8_t *w, int64_t ld, int nr, const act_t *a, int mt,
                 float *res) {
    switch (mt * 8 + nr) {
    case 9: tile_of_type(type, w, ld, 1, a, 1, res); break;
    case 12: tile_of_type(type, w, ld, 4, a, 1, res); break;
    case 17: tile_of_type(type, w, ld, 1, a, 2, res); break;
    case 18: tile_of_type(type, w, ld, 2, a, 2, res); break;
    case 25: tile_of_type(type, w, ld, 1, a, 3, res); break;
    default: tile_of_type(type, w, ld, 1, a, 4, res); break;
    }
}

/* ---- output row groups over the threads ---- */
#ifdef _OPENMP
#include <omp.h>
#endif
/* a share of items: its next item from the front in the low 32 bits, its end (the next
 * item from the back, exclusive) in the high 32 bits; a cache line each */
typedef struct { _Alignas(64) uint64_t span; } share_t;

/* up to want items of *s claimed from its front (back: from its back); the count (0 when
 * the share is empty), the first item in *first */
static int64_t claim(share_t *s, int64_t want, int back, int64_t *first) {
    uint64_t old = __atomic_load_n(&s->span, __ATOMIC_RELAXED);
    for (;;) {
        const uint64_t lo = old & 0xffffffffu, hi = old >> 32;
        if (lo >= hi) return 0;
        const uint64_t n = hi - lo < (uint64_t)want ? hi - lo : (uint64_t)want;
        const uint64_t next = back ? (hi - n) << 32 | lo : hi << 32 | (lo + n);
        if (__atomic_compare_exchange_n(&s->span, &old, next, 1, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
            *first = (int64_t)(back ? hi - n : lo);
            return (int64_t)n;
        }
    }
}

/* run(ctx, i0, i1) over items [0, n) (n < 2^32) on nthreads threads: each thread owns a
 * contiguous share and runs it front to back, chunk items a claim; a thread done with its
 * own takes one item at a time from the back of the others'. Every item runs exactly once,
 * whole, on one thread (what it computes does not depend on which), and each thread reads
 * one contiguous stretch of weights but for the last few items. A static split made the
 * first thread done wait for the other at every call's end: a thread the scheduler took
 * away for a moment (another runnable thread: a server's HTTP thread, a second OpenMP
 * runtime's workers) held up the whole call. */
static void balanced_for(int64_t n, int nthreads, int64_t chunk,
                         void (*run)(const void *, int64_t, int64_t), const void *ctx) {
#ifndef _OPENMP
    nthreads = 1;
#endif
    share_t *shares = nthreads > 1 && n > 1
                          ? aligned_alloc(64, sizeof(share_t) * (size_t)nthreads) : NULL;
    if (!shares) { run(ctx, 0, n); return; }
    for (int t = 0; t < nthreads; ++t)
        shares[t].span = (uint64_t)(n * (t + 1) / nthreads) << 32 | (uint64_t)(n * t / nthreads);
#pragma omp parallel num_threads(nthreads)
    {
#ifdef _OPENMP
        const int self = omp_get_thread_num();
#else
        const int self = 0;
#endif
        int64_t first, got;
        while ((got = claim(&shares[self], chunk, 0, &first)) > 0) run(ctx, first, first + got);
        for (int u = 1; u < nthreads; ++u)  /* every share, whether its thread started or not */
            while (claim(&shares[(self + u) % nthreads], 1, 1, &first) > 0)
                run(ctx, first, first + 1);
    }
    free(shares);
}

/* one linear call's work, the ctx of the run_* functions balanced_for calls: weight rows
 * from n_start to N in units of the loop's own row count; flag: packed (the super-block
 * types) or wide (the 32-value ones) */
typedef struct {
    int type; const uint8_t *w; int64_t row_bytes, N, n_start; const act_t *act; float *out;
    int64_t ldo; const float *bias; int flag;
} job_t;

#ifdef HWPLUG_GGML_VNNI
#include "kgroup.h"
#include "lgroup.h"
/* activation rows from which the super-block types take kgroup (fewer: tile_k). Measured
 * on a 2-vCPU Zen 5, one thread, CPU time per call: weights in cache (1536 x 1536), every
 * type level or better from 6 rows (1.04-1.2x), 1.15-1.35x at 8, 2.0-2.25x at 32, 0.88x
 * at 4; weights from memory (Q4_K 8960 x 1536, as in a decode step) 1.11x at 8, 1.71x at
 * 32. Q4_K and Q6_K weights repacked once (hwplug_ggml_repack) take the groups at every row
 * count: against the rows' kernels, one thread, CPU time, weights from memory, a loaded
 * machine, 1536 x 1536, 8960 x 1536, 1536 x 8960 and 4096 x 14336: Q4_K 1.07-1.20x at 1
 * row, 1.5-1.8x at 3-4, 1.5-1.8x at 8, 1.3-1.4x at 16-17, 1.2-1.3x at 32, 1.06-1.11x at
 * 70-128; Q6_K 1.01-1.12x, 1.4-1.5x, 1.5-2.3x, 1.4-1.7x, 1.2-1.5x, 1.1-1.16x. The same
 * measure, Qwen2.5-1.5B IQ4_XS's 1536 x 1536, 8960 x 1536 and 1536 x 8960 (weights from
 * the file): IQ4_XS 1.5-1.85x at 1 row, 2.1-2.4x at 4, 2.1-2.5x at 8, 1.6-1.7x at 32,
 * 1.35-1.5x at 128; Q5_K (its 1536 x 8960 and 256 x 1536) 1.13-1.19x, 1.4-1.5x,
 * 1.5-1.8x, 1.18-1.22x, 1.04-1.06x. */
enum { KG_MIN_ROWS = 8 };
/* kgroup over groups [g0, g1) of KG_ROWS weight rows */
static void run_kgroups(const void *ctx, int64_t g0, int64_t g1) {
    const job_t *j = ctx;
    for (int64_t g = g0; g < g1; ++g)
        kgroup(j->type, j->w + g * KG_ROWS * j->row_bytes, j->row_bytes, j->act,
               j->out + g * KG_ROWS, j->ldo, j->bias ? j->bias + g * KG_ROWS : NULL, j->flag);
}
#endif
/* the super-block types (Q8_K activations) */
static int super_type(int type) {
    return type == T_Q2_K || type == T_Q3_K || type == T_Q4_K || type == T_Q5_K ||
           type == T_Q6_K || type == T_IQ4_XS;
}
/* the types with int16 activations */
static int wide_type(int type) {
    return type == T_Q4_0 || type == T_Q4_1 || type == T_Q5_0 || type == T_Q5_1 || type == T_Q8_0;
}
static int linear_type(int type) { return wide_type(type) || type == T_IQ4_NL || super_type(type); }

/* weight rows n_start + MT_MAX * [i0, i1) in groups of MT_MAX (the last one may be short);
 * each group against the activations in tiles of mt rows */
static void run_super_tiles(const void *ctx, int64_t i0, int64_t i1) {
    const job_t *j = ctx;
    const int64_t M = j->act->rows;
    for (int64_t n0 = j->n_start + i0 * MT_MAX; n0 < j->N && n0 < j->n_start + i1 * MT_MAX;
         n0 += MT_MAX) {
        const int rows = (int)(j->N - n0 < MT_MAX ? j->N - n0 : MT_MAX);
        for (int64_t m0 = 0; m0 < M;) {
            const act_t part = {(char *)j->act->q + sizeof(q8k_t) * (size_t)m0, NULL, NULL,
                                j->act->nb, M};
            const int mt = (int)(M - m0 < MT_MAX ? M - m0 : MT_MAX);
            for (int r0 = 0; r0 < rows;) {
                const int nr = rows - r0 < 4 / mt ? 1 : 4 / mt;
                float res[MT_MAX];
                tile(j->type, j->w + (n0 + r0) * j->row_bytes, j->row_bytes, nr, &part, mt, res);
                for (int r = 0; r < nr; ++r)
                    for (int m = 0; m < mt; ++m)
                        j->out[(m0 + m) * j->ldo + n0 + r0 + r] =
                            res[r * mt + m] + (j->bias ? j->bias[n0 + r0 + r] : 0.0f);
                r0 += nr;
            }
            m0 += mt;
        }
    }
}

/* out[m * ldo + n] = (act @ W.T)[m, n] (+ bias[n]): the super-block types, split over
 * nthreads threads by weight rows; packed: the groups of 16 rows are repacked
 * (hwplug_ggml_repack) and take the groups at every row count */
static void super_linear(int type, const uint8_t *w, int64_t row_bytes, int64_t N,
                         const act_t *act, float *out, int64_t ldo, const float *bias,
                         int nthreads, int packed) {
    const int64_t M = act->rows, K = act->nb * QK_K;
    int64_t n_start = 0;
#ifdef HWPLUG_GGML_VNNI
    if (packed || M >= KG_MIN_ROWS) { /* groups of KG_ROWS weight rows, then the rest */
        const int64_t groups = N / KG_ROWS;
        const job_t job = {type, w, row_bytes, N, 0, act, out, ldo, bias, packed};
        balanced_for(groups, N * K * M >= 65536 ? nthreads : 1, 4, run_kgroups, &job);
        n_start = groups * KG_ROWS;
    }
#endif
    const job_t job = {type, w, row_bytes, N, n_start, act, out, ldo, bias, packed};
    balanced_for((N - n_start + MT_MAX - 1) / MT_MAX, N * K * M >= 65536 ? nthreads : 1, 4,
                 run_super_tiles, &job);
}

/* weight rows n_start + LT_LANES * [i0, i1) in groups of LT_LANES (the last one may be
 * short); each group against the activations in chunks of up to LT_LANES rows */
static void run_legacy_tiles(const void *ctx, int64_t i0, int64_t i1) {
    const job_t *j = ctx;
    const int64_t M = j->act->rows;
    const size_t block_bytes = (size_t)(QK * (j->flag ? 2 : 1));
    for (int64_t n0 = j->n_start + i0 * LT_LANES; n0 < j->N && n0 < j->n_start + i1 * LT_LANES;
         n0 += LT_LANES) {
        const int rows = (int)(j->N - n0 < LT_LANES ? j->N - n0 : LT_LANES);
        for (int64_t m0 = 0; m0 < M;) {
            const int mt = (int)(M - m0 < LT_LANES ? M - m0 : LT_LANES);
            const int mtp = mt == 1 ? 1 : mt == 2 ? 2 : mt <= 4 ? 4 : 8, nr = LT_LANES / mtp;
            const act_t *a = j->act;
            const act_t part = {(char *)a->q + block_bytes * (size_t)m0, a->d + m0, a->sd + m0,
                                a->nb, M, a->sum ? a->sum + m0 : NULL};
            for (int r0 = 0; r0 < rows; r0 += nr) {
                const int nrv = rows - r0 < nr ? rows - r0 : nr;
                float res[LT_LANES];
                legacy_tile(j->type, j->w + (n0 + r0) * j->row_bytes, j->row_bytes, nrv, &part,
                            mtp, mt, res, j->flag);
                for (int r = 0; r < nrv; ++r)
                    for (int m = 0; m < mt; ++m)
                        j->out[(m0 + m) * j->ldo + n0 + r0 + r] =
                            res[r * mtp + m] + (j->bias ? j->bias[n0 + r0 + r] : 0.0f);
            }
            m0 += mt;
        }
    }
}

/* the same for the 32-value types (int16 activations if wide): groups of LT_LANES weight
 * rows split over the threads; each group against the activations in chunks of up to
 * LT_LANES rows, each chunk in tiles of LT_LANES pairs (see legacy_tile_of), so a verify
 * step's or a prefill chunk's rows read each weight block once. The VNNI build takes
 * int16 activations of two rows or more (one where its rows are short), and int8 ones from
 * LB_MIN_ROWS rows, 16 weight rows at a time, one per lane (lgroup.h, lw_linear; the last
 * N % 16 rows through the tiles), each with the same fp32 arithmetic per pair. One thread,
 * CPU time, loaded, Q8_0 and Q4_1 with int16 activations, SmolLM2's and Qwen2.5-1.5B's
 * shapes from memory: a 5-row call costs 1.1-1.7x a 1-row call (the tiles: 2.2-3.8x). */
static void legacy_linear(int type, const uint8_t *w, int64_t row_bytes, int64_t N,
                          const act_t *act, float *out, int64_t ldo, const float *bias,
                          int wide, int nthreads) {
    const int64_t M = act->rows, K = act->nb * QK;
    int64_t n_start = 0; /* the weight rows from which the tiles compute */
#ifdef HWPLUG_GGML_VNNI
    if (wide ? M >= 2 || lw_one_row(type, act->nb) : M >= LB_MIN_ROWS)
        n_start = lw_linear(type, wide, w, row_bytes, N, act, out, ldo, bias, nthreads);
#endif
    const job_t job = {type, w, row_bytes, N, n_start, act, out, ldo, bias, wide};
    balanced_for((N - n_start + LT_LANES - 1) / LT_LANES, N * K * M >= 65536 ? nthreads : 1, 4,
                 run_legacy_tiles, &job);
}

/* hwplug_ggml_linear, with the weight's groups of 16 rows repacked (packed, see
 * hwplug_ggml_repack) or not */
static int linear(int type, const uint8_t *w, int64_t row_bytes, int64_t N, int64_t K,
                  const float *x, int64_t M, float *out, int64_t ldo, const float *bias,
                  int act_bits, int nthreads, int packed) {
    const int super = super_type(type);
    const int64_t nb = super ? K / QK_K : K / QK, width = act_bits / 8;
    const size_t block_bytes = super ? sizeof(q8k_t) : (size_t)(QK * width);
    const int sums = !super && width == 1;
    act_t act = {malloc(block_bytes * (size_t)(M * nb)),
                 super ? NULL : malloc(sizeof(float) * (size_t)(M * nb)),
                 super ? NULL : malloc(sizeof(float) * (size_t)(M * nb)), nb, M,
                 sums ? malloc(sizeof(int32_t) * (size_t)(M * nb)) : NULL};
    int status = (act.q && (super || (act.d && act.sd)) && (!sums || act.sum)) ? 0 : -2;
    if (status == 0) {
#pragma omp parallel for num_threads(nthreads) if (M >= 8)
        for (int64_t m = 0; m < M; ++m) {
            if (super)
                quantize_row_k(x + m * K, &act, m);
            else if (width == 2)
                quantize_row(x + m * K, &act, m, 1);
            else
                quantize_row(x + m * K, &act, m, 0);
        }
        if (super)
            super_linear(type, w, row_bytes, N, &act, out, ldo, bias, nthreads, packed);
        else
            legacy_linear(type, w, row_bytes, N, &act, out, ldo, bias, width == 2, nthreads);
    }
    free(act.q); free(act.d); free(act.sd); free(act.sum);
    return status;
}

/* out[m * ldo + n] = (x[M, K] @ W.T)[m, n] (+ bias[n]) for n < N, the activations quantized
 * to act_bits (8 or 16; the super-block types and IQ4_NL take 8 only) bits; 0 on success, -1
 * for a type or act_bits it does not serve, -2 when out of memory. K is a multiple of the
 * type's block and ldo >= N (the caller checks). */
int hwplug_ggml_linear(int type, const uint8_t *w, int64_t row_bytes, int64_t N, int64_t K,
                       const float *x, int64_t M, float *out, int64_t ldo, const float *bias,
                       int act_bits, int nthreads) {
    if (!linear_type(type) || (act_bits != 8 && (act_bits != 16 || !wide_type(type)))) return -1;
    return linear(type, w, row_bytes, N, K, x, M, out, ldo, bias, act_bits, nthreads, 0);
}

/* out <- w [N, row_bytes] with each group of 16 rows (the first N / 16 * 16 rows) repacked
 * for the 16-row groups (kpack_rows in kgroup.h), the rest copied: the same bytes, held
 * instead of the rows. 0, or -1 for a type (or a build) it does not serve: the VNNI build
 * repacks Q4_K, Q5_K, Q6_K and IQ4_XS. kpack_rows' wide loads and in-register transposes took 0.05 ms
 * against the word-by-word copies' 0.10 for a 1536 x 1536 Q4_K in cache, 1.05-1.5 against
 * 1.3-1.45 ms for 8960 x 1536 and 1.3-1.7 against 1.7 for a 1536 x 8960 Q6_K from memory
 * (one thread, CPU time, median of 21, a loaded 2-vCPU Zen 5): memory-bound from there. */
int hwplug_ggml_repack(int type, const uint8_t *w, int64_t N, int64_t row_bytes, uint8_t *out,
                       int nthreads) {
#ifdef HWPLUG_GGML_VNNI
    if (!kpack_type(type)) return -1;
    const int64_t groups = N / KG_ROWS;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (groups >= 64)
    for (int64_t g = 0; g < groups; ++g) kpack_rows(type, w, row_bytes, g * KG_ROWS, out);
    memcpy(out + groups * KG_ROWS * row_bytes, w + groups * KG_ROWS * row_bytes,
           (size_t)((N - groups * KG_ROWS) * row_bytes));
    return 0;
#else
    (void)type; (void)w; (void)N; (void)row_bytes; (void)out; (void)nthreads;
    return -1;
#endif
}

/* hwplug_ggml_linear on weights hwplug_ggml_repack wrote (int8 activations): each output
 * bitwise the same as from the rows, for every row count (the groups serve one row too). */
int hwplug_ggml_linear_repacked(int type, const uint8_t *w, int64_t row_bytes, int64_t N,
                                int64_t K, const float *x, int64_t M, float *out, int64_t ldo,
                                const float *bias, int nthreads) {
#ifdef HWPLUG_GGML_VNNI
    if (!kpack_type(type)) return -1;
    return linear(type, w, row_bytes, N, K, x, M, out, ldo, bias, 8, nthreads, 1);
#else
    (void)type; (void)w; (void)row_bytes; (void)N; (void)K; (void)x; (void)M; (void)out;
    (void)ldo; (void)bias; (void)nthreads;
    return -1;
#endif
}

/* ---- dequantization of whole rows ---- */
static void dequantize_row(int type, const uint8_t *w, int64_t K, float *o) {
    switch (type) {
    case T_F32: memcpy(o, w, sizeof(float) * (size_t)K); return;
    case T_F16: for (int64_t k = 0; k < K; ++k) o[k] = fp16_to_fp32(w + 2 * k); return;
    default: break;
    }
    if (type == T_Q4_0 || type == T_Q5_0 || type == T_Q4_1 || type == T_Q5_1) {
        const int five = type == T_Q5_0 || type == T_Q5_1, min = type == T_Q4_1 || type == T_Q5_1;
        const int bytes = 18 + 2 * min + 4 * five;
        for (int64_t b = 0; b < K / QK; ++b, w += bytes, o += QK) {
            u8x32 u = nibbles16(w + bytes - 16);
            if (five) { uint32_t h; memcpy(&h, w + 2 + 2 * min, 4); u = or_bits32(u, h); }
            const float d = fp16_to_fp32(w), m = min ? fp16_to_fp32(w + 2) : 0.0f;
            store_f32(u, d, d, min ? 0 : (five ? 16 : 8), m, m, o);
        }
    } else if (type == T_Q8_0) {
        for (int64_t b = 0; b < K / QK; ++b, w += 34) {
            const float d = fp16_to_fp32(w);
            for (int l = 0; l < QK; ++l) *o++ = d * (float)((const int8_t *)(w + 2))[l];
        }
    } else if (type == T_IQ4_NL) {
        for (int64_t b = 0; b < K / QK; ++b, w += 18, o += QK) {
            const float d = fp16_to_fp32(w);
            store_f32(lookup16(nibbles16(w + 2), IQ4_VALUES), d, d, 128, 0.0f, 0.0f, o);
        }
    } else if (super_type(type)) {
        const int bytes = k_bytes(type), center = k_center(type);
        for (int64_t sb = 0; sb < K / QK_K; ++sb, w += bytes) {
            khead_t h;
            k_header(type, w, &h);
            for (int j = 0; j < 8; ++j, o += QK) {
                const int k0 = k_index(type, 2 * j), k1 = k_index(type, 2 * j + 1);
                const float m0 = k_has_mins(type) ? -(h.dmin * (float)h.mn[k0]) : 0.0f,
                            m1 = k_has_mins(type) ? -(h.dmin * (float)h.mn[k1]) : 0.0f;
                store_f32(k_chunk(type, w, j), h.d * (float)h.sc[k0], h.d * (float)h.sc[k1],
                          center, m0, m1, o);
            }
        }
    }
}

/* hwplug_ggml_dequantize on weights hwplug_ggml_repack wrote (Q4_K, Q5_K, Q6_K, IQ4_XS; in
 * every build): row n of the first w_rows / 16 * 16 gathered super-block by super-block
 * from lane n % 16 of group n / 16 (its 32-bit words 64 bytes apart, then Q6_K's d 2 bytes
 * apart), the rest read as rows; the values bitwise those of the rows. 0, -1 for another
 * type, -3 for a row index outside [0, w_rows) (nothing written). */
int hwplug_ggml_dequantize_repacked(int type, const uint8_t *w, int64_t w_rows,
                                    int64_t row_bytes, const int64_t *rows, int64_t nrows,
                                    int64_t K, float *out, int nthreads) {
    if (type != T_Q4_K && type != T_Q5_K && type != T_Q6_K && type != T_IQ4_XS) return -1;
    for (int64_t r = 0; rows && r < nrows; ++r)
        if (rows[r] < 0 || rows[r] >= w_rows) return -3;
    const int bytes = k_bytes(type), words = bytes / 4, tail = bytes - 4 * words;
    const int64_t grouped = w_rows / 16 * 16, blocks = K / QK_K;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nrows * K >= 65536)
    for (int64_t r = 0; r < nrows; ++r) {
        const int64_t n = rows ? rows[r] : r;
        if (n >= grouped) {
            dequantize_row(type, w + n * row_bytes, K, out + r * K);
            continue;
        }
        const int lane = (int)(n % 16);
        uint8_t block[256];  /* one super-block of the row (at most Q6_K's 210 bytes) */
        for (int64_t s = 0; s < blocks; ++s) {
            const uint8_t *p = w + (n / 16 * blocks + s) * 16 * bytes;
            for (int i = 0; i < words; ++i) memcpy(block + 4 * i, p + 64 * i + 4 * lane, 4);
            memcpy(block + 4 * words, p + 64 * words + tail * lane, (size_t)tail);
            dequantize_row(type, block, QK_K, out + r * K + s * QK_K);
        }
    }
    return 0;
}

/* rows[r] (or r when rows is NULL) of w [w_rows, row_bytes] dequantized to out[r, K]; 0 on
 * success, -1 for a type it does not serve, -3 when a row index lies outside [0, w_rows)
 * (nothing written). F32 and F16 rows are converted. */
int hwplug_ggml_dequantize(int type, const uint8_t *w, int64_t w_rows, int64_t row_bytes,
                           const int64_t *rows, int64_t nrows, int64_t K, float *out,
                           int nthreads) {
    if (!linear_type(type) && type != T_F32 && type != T_F16) return -1;
    for (int64_t r = 0; rows && r < nrows; ++r)
        if (rows[r] < 0 || rows[r] >= w_rows) return -3;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nrows * K >= 65536)
    for (int64_t r = 0; r < nrows; ++r)
        dequantize_row(type, w + (rows ? rows[r] : r) * row_bytes, K, out + r * K);
    return 0;
}
