/* The 32-value block types with int16 activations (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) for
 * several activation rows at once: one activation row per 32-bit lane of a 512-bit vector
 * (included by kernels.c in its VNNI build, after legacy_tile_of, whose per-pair fp32
 * arithmetic this reproduces lane by lane: see legacy_values).
 *
 * The activations are first laid out in chunks of LG_LANES rows (lg_pack): for each block,
 * vector i holds the int16 pair (x[2 i], x[2 i + 1]) of every row of the chunk, zeros for
 * the rows past the call's. A weight row's block is decoded once per chunk (legacy_values)
 * and each of its 16 int16 pairs, broadcast, meets vector i in one vpdpwssd, so a block
 * costs 16 vpdpwssd for the chunk's 16 rows, with no horizontal sums; then one fp32 FMA per
 * block for all 16 (Q4_1, Q5_1: one more for the minimum). */
#ifndef HWPLUG_GGML_LGROUP_H
#define HWPLUG_GGML_LGROUP_H

/* activation rows per chunk (lanes); weight rows per thread's share of a pass; the
 * activation rows from which legacy_linear takes the chunks (fewer: the tiles of eight
 * pairs). A chunk costs about what 1.5 of the tiles' eight-row passes cost (2-vCPU Zen 5,
 * one thread, CPU time, loaded machine, Q4_1 576x576 and 1536x8960 from memory: 5 and 8
 * rows 1.4-1.7x slower than the tiles, 32 rows 1.4-1.5x faster), hence 12. */
enum { LG_LANES = 16, LG_ROWS = 16, LG_MIN_ROWS = 12 };

/* the activations' int16 quants of a (block-major, see act_t), into p: chunk c, block b at
 * p + (c * nb + b) * 16 * LG_LANES int32s (vector i: pair i of the chunk's rows) */
static void lg_pack(const act_t *a, int32_t *p, int nthreads) {
    const int64_t chunks = (a->rows + LG_LANES - 1) / LG_LANES;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (chunks * a->nb >= 64)
    for (int64_t cb = 0; cb < chunks * a->nb; ++cb) {
        const int64_t c = cb / a->nb, b = cb % a->nb;
        int32_t *dst = p + cb * 16 * LG_LANES;
        for (int l = 0; l < LG_LANES; ++l) {
            const int64_t m = c * LG_LANES + l;
            int32_t pairs[16] = {0};
            if (m < a->rows) memcpy(pairs, Q16(a, b * a->rows + m), sizeof pairs);
            for (int i = 0; i < 16; ++i) dst[i * LG_LANES + l] = pairs[i];
        }
    }
}

/* res lanes l < mt: the pairs (weight row w, activation row m0 + l) of chunk `packed` */
INLINE void lg_row(int type, const uint8_t *w, const act_t *a, const int32_t *packed,
                   int64_t m0, int mt, float *res) {
    const int bytes = legacy_bytes(type);
    const __mmask16 valid = (__mmask16)((1u << mt) - 1);
    __m512 acc = _mm512_setzero_ps(), off = _mm512_setzero_ps();
    for (int64_t b = 0; b < a->nb; ++b, packed += 16 * LG_LANES) {
        const uint8_t *blk = w + b * bytes;
        u8x32 u;
        wide_t uw;
        legacy_values(type, blk, 1, &u, &uw);
        int32_t pairs[16];
        memcpy(pairs, &uw.lo, 32);
        memcpy(pairs + 8, &uw.hi, 32);
        __m512i part[4]; /* four chains: vpdpwssd's latency, not its throughput, would bound one */
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; ++j) part[j] = _mm512_setzero_si512();
        _Pragma("GCC unroll 16") for (int i = 0; i < 16; ++i) part[i & 3] = _mm512_dpwssd_epi32(
            part[i & 3], _mm512_set1_epi32(pairs[i]), _mm512_loadu_si512(packed + i * LG_LANES));
        const __m512i tot = _mm512_add_epi32(_mm512_add_epi32(part[0], part[1]),
                                             _mm512_add_epi32(part[2], part[3]));
        const int64_t i0 = b * a->rows + m0;
        const __m512 dx = _mm512_maskz_loadu_ps(valid, a->d + i0);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot),
                              _mm512_mul_ps(_mm512_set1_ps(fp16_to_fp32(blk)), dx), acc);
        if (legacy_has_min(type))
            off = _mm512_fmadd_ps(_mm512_set1_ps(fp16_to_fp32(blk + 2)),
                                  _mm512_maskz_loadu_ps(valid, a->sd + i0), off);
    }
    _mm512_mask_storeu_ps(res, valid, _mm512_add_ps(acc, off));
}

/* out[m * ldo + n] (+ bias[n]) for the call's rows and n < N, through the chunks: threads
 * split the weight rows LG_ROWS at a time, each group against every chunk in turn */
static void lg_linear(int type, const uint8_t *w, int64_t row_bytes, int64_t N,
                      const act_t *a, const int32_t *packed, float *out, int64_t ldo,
                      const float *bias, int nthreads) {
    const int64_t M = a->rows, chunks = (M + LG_LANES - 1) / LG_LANES;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (N * a->nb * QK * M >= 65536)
    for (int64_t n0 = 0; n0 < N; n0 += LG_ROWS) {
        for (int64_t c = 0; c < chunks; ++c) {
            const int mt = (int)(M - c * LG_LANES < LG_LANES ? M - c * LG_LANES : LG_LANES);
            for (int64_t n = n0; n < N && n < n0 + LG_ROWS; ++n) {
                float res[LG_LANES];
                const int32_t *chunk = packed + c * a->nb * 16 * LG_LANES;
                switch (type) {
#define LG_TYPE(T) case T: lg_row(T, w + n * row_bytes, a, chunk, c * LG_LANES, mt, res); break;
                LG_TYPE(T_Q4_0) LG_TYPE(T_Q4_1) LG_TYPE(T_Q5_0) LG_TYPE(T_Q5_1)
#undef LG_TYPE
                default: lg_row(T_Q8_0, w + n * row_bytes, a, chunk, c * LG_LANES, mt, res);
                }
                for (int l = 0; l < mt; ++l)
                    out[(c * LG_LANES + l) * ldo + n] = res[l] + (bias ? bias[n] : 0.0f);
            }
        }
    }
}

/* ---- one weight row per lane ("lw"): a verify step's 2 to LW_MAX_ROWS activation rows ----
 * The transpose of the chunks above: a group of LW_ROWS weight rows, each row's block decoded
 * (legacy_values) and its 16 int16 pairs turned so that vector i holds pair i of every row
 * of the group (transpose16_epi32); pair i of an activation row, broadcast, meets vector i in one
 * vpdpwssd, so per activation row a block costs 16 vpdpwssd for the 16 weight rows and no
 * horizontal sums, then one fp32 FMA for the 16 pairs (Q4_1, Q5_1: one more for the
 * minimum), lane by lane the arithmetic of legacy_tile_of. The weight's decoding and
 * transpose are shared by the call's activation rows (no packing of the activations). */
/* weight rows per group; the most activation rows; the longest rows (blocks) for which one
 * activation row takes the groups too (lw_one_row) */
enum { LW_ROWS = 16, LW_MAX_ROWS = LG_MIN_ROWS - 1, LW_ONE_ROW_BLOCKS = 24 };

/* whether one activation row takes the groups: one thread, CPU time, loaded, weights from
 * memory, against the one-row tiles, 576 inputs (18 blocks): Q8_0 1.2-1.4x, Q4_0
 * 1.12-1.18x, Q4_1 1.02-1.06x faster, Q5_0 and Q5_1 0.96-0.99x (their fifth bits cost more
 * for 16 rows); 1536 inputs 0.87-0.95x, 0.8-0.86x, 0.92-0.96x (sixteen rows' streams at
 * once, the tiles' eight) */
INLINE int lw_one_row(int type, int64_t nb) {
    return nb <= LW_ONE_ROW_BLOCKS && type != T_Q5_0 && type != T_Q5_1;
}

/* out[m * ldo + n] (+ bias[n]) for the MT activation rows and the LW_ROWS weight rows at w
 * (ld bytes apart, n from n0) */
INLINE void lw_group(int type, const uint8_t *w, int64_t ld, const act_t *a, int MT,
                     float *out, int64_t ldo, const float *bias) {
    const int bytes = legacy_bytes(type);
    const __m512i rows = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32((int)ld));
    __m512 acc[LW_MAX_ROWS], off[LW_MAX_ROWS];
    _Pragma("GCC unroll 11") for (int m = 0; m < MT; ++m) acc[m] = off[m] = _mm512_setzero_ps();
    for (int64_t b = 0; b < a->nb; ++b) {
        const uint8_t *blk = w + b * bytes;
        __m512i z[16];
        _Pragma("GCC unroll 16") for (int r = 0; r < LW_ROWS; ++r) {
            u8x32 u;
            wide_t uw;
            PREFETCH(blk + (r + LW_ROWS) * ld); /* the next group's block */
            legacy_values(type, blk + r * ld, 1, &u, &uw);
            z[r] = _mm512_inserti64x4(_mm512_castsi256_si512(uw.lo), uw.hi, 1);
        }
        transpose16_epi32(z); /* kgroup.h: z[r] lane i -> z[i] lane r */
        /* lane r: the block's scale and (Q4_1, Q5_1) minimum of weight row r, as fp16 */
        const __m512i words = _mm512_i32gather_epi32(rows, (const void *)blk, 1);
        const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(words));
        _Pragma("GCC unroll 11") for (int m = 0; m < MT; ++m) {
            const int64_t i = b * a->rows + m;
            const int32_t *x = (const int32_t *)Q16(a, i);
            __m512i part[4];
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; ++j) part[j] = _mm512_setzero_si512();
            _Pragma("GCC unroll 16") for (int k = 0; k < 16; ++k) part[k & 3] =
                _mm512_dpwssd_epi32(part[k & 3], z[k], _mm512_set1_epi32(x[k]));
            const __m512i tot = _mm512_add_epi32(_mm512_add_epi32(part[0], part[1]),
                                                 _mm512_add_epi32(part[2], part[3]));
            acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot),
                                     _mm512_mul_ps(dw, _mm512_set1_ps(a->d[i])), acc[m]);
            if (legacy_has_min(type))
                off[m] = _mm512_fmadd_ps(
                    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(words, 16))),
                    _mm512_set1_ps(a->sd[i]), off[m]);
        }
    }
    const __m512 add = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
    _Pragma("GCC unroll 11") for (int m = 0; m < MT; ++m)
        _mm512_storeu_ps(out + m * ldo, _mm512_add_ps(_mm512_add_ps(acc[m], off[m]), add));
}

/* lw_group with type and the row count MT compile-time constants in each instance */
#define LW_TYPES(MT)                                                                       \
    switch (type) {                                                                        \
    case T_Q4_0: lw_group(T_Q4_0, w, ld, a, MT, out, ldo, bias); break;                    \
    case T_Q4_1: lw_group(T_Q4_1, w, ld, a, MT, out, ldo, bias); break;                    \
    case T_Q5_0: lw_group(T_Q5_0, w, ld, a, MT, out, ldo, bias); break;                    \
    case T_Q5_1: lw_group(T_Q5_1, w, ld, a, MT, out, ldo, bias); break;                    \
    default: lw_group(T_Q8_0, w, ld, a, MT, out, ldo, bias); break;                        \
    }
static void lw_group_of(int type, const uint8_t *w, int64_t ld, const act_t *a, float *out,
                        int64_t ldo, const float *bias) {
    switch (a->rows) {
    case 1: LW_TYPES(1) break;
    case 2: LW_TYPES(2) break;
    case 3: LW_TYPES(3) break;
    case 4: LW_TYPES(4) break;
    case 5: LW_TYPES(5) break;
    case 6: LW_TYPES(6) break;
    case 7: LW_TYPES(7) break;
    case 8: LW_TYPES(8) break;
    case 9: LW_TYPES(9) break;
    case 10: LW_TYPES(10) break;
    default: LW_TYPES(11) break;
    }
}
#undef LW_TYPES

/* the first N / LW_ROWS * LW_ROWS weight rows, LW_ROWS at a time split over the threads,
 * for int16 activations of 1 to LW_MAX_ROWS rows; the rows they cover */
static int64_t lw_linear(int type, const uint8_t *w, int64_t row_bytes, int64_t N,
                         const act_t *a, float *out, int64_t ldo, const float *bias,
                         int nthreads) {
    const int64_t groups = N / LW_ROWS, M = a->rows;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (N * a->nb * QK * M >= 65536)
    for (int64_t g = 0; g < groups; ++g)
        lw_group_of(type, w + g * LW_ROWS * row_bytes, row_bytes, a, out + g * LW_ROWS, ldo,
                    bias ? bias + g * LW_ROWS : NULL);
    return groups * LW_ROWS;
}

#endif /* HWPLUG_GGML_LGROUP_H */
