/* The 32-value block types with int16 activations (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) for
 * several activation rows at once, one weight row per 32-bit lane of a 512-bit vector
 * (included by kernels.c in its VNNI build, after legacy_tile_of, whose per-pair fp32
 * arithmetic this reproduces lane by lane: see legacy_values).
 *
 * A group of LW_ROWS weight rows has each row's block decoded (legacy_values) and its 16
 * int16 pairs turned so that vector i holds pair i of every row of the group
 * (transpose16_epi32); pair i of an activation row, broadcast, meets vector i in one
 * vpdpwssd, so per activation row a block costs 16 vpdpwssd for the 16 weight rows and no
 * horizontal sums, then one fp32 FMA for the 16 pairs (Q4_1, Q5_1: one more for the
 * minimum). The weight's decoding and transpose are shared by the activation rows (no
 * packing of the activations). Up to LW_MAX_ROWS activation rows (a verify step's) keep
 * their accumulators in registers (lw_group); more (a batch's, a prefill's) in memory, a
 * tile of LT_TILE rows at a time (lt_group). Either way a row's outputs are the same bits,
 * whatever the other rows of the call. */
#ifndef HWPLUG_GGML_LGROUP_H
#define HWPLUG_GGML_LGROUP_H

/* weight rows per group; the most activation rows held in registers (lw_group: 2 x 11
 * accumulators); the longest rows (blocks) for which one activation row takes the groups
 * too (lw_one_row). lt_group measured 0.91-1.05x lw_group's speed at 1-11 rows (2-vCPU Zen 4,
 * two threads, Q4_1, Q5_1, Q8_0, 960 x 576 and 576 x 1536 from memory). */
enum { LW_ROWS = 16, LW_MAX_ROWS = 11, LW_ONE_ROW_BLOCKS = 24 };

/* whether one activation row takes the groups: one thread, CPU time, loaded, weights from
 * memory, against the one-row tiles, 576 inputs (18 blocks): Q8_0 1.2-1.4x, Q4_0
 * 1.12-1.18x, Q4_1 1.02-1.06x faster, Q5_0 and Q5_1 0.96-0.99x (their fifth bits cost more
 * for 16 rows); 1536 inputs 0.87-0.95x, 0.8-0.86x, 0.92-0.96x (sixteen rows' streams at
 * once, the tiles' eight) */
INLINE int lw_one_row(int type, int64_t nb) {
    return nb <= LW_ONE_ROW_BLOCKS && type != T_Q5_0 && type != T_Q5_1;
}

/* block b of the LW_ROWS weight rows at w (ld bytes apart), decoded and turned: z[i] lane r
 * holds int16 pair i of row r; *dw lane r the block's scale of row r, *mw (Q4_1, Q5_1) its
 * minimum */
INLINE void lw_block(int type, const uint8_t *w, int64_t ld, int64_t b, __m512i z[16],
                     __m512 *dw, __m512 *mw) {
    const uint8_t *blk = w + b * legacy_bytes(type);
    _Pragma("GCC unroll 16") for (int r = 0; r < LW_ROWS; ++r) {
        u8x32 u;
        wide_t uw;
        PREFETCH(blk + (r + LW_ROWS) * ld); /* the next group's block */
        legacy_values(type, blk + r * ld, 1, &u, &uw);
        z[r] = _mm512_inserti64x4(_mm512_castsi256_si512(uw.lo), uw.hi, 1);
    }
    transpose16_epi32(z); /* kgroup.h: z[r] lane i -> z[i] lane r */
    const __m512i rows = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32((int)ld));
    const __m512i words = _mm512_i32gather_epi32(rows, (const void *)blk, 1);
    *dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(words));
    *mw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(words, 16)));
}

/* lane r: the int32 dot product of weight row r's block (z, see lw_block) and activation
 * row i's */
INLINE __m512i lw_dot(const __m512i z[16], const act_t *a, int64_t i) {
    const int32_t *x = (const int32_t *)Q16(a, i);
    __m512i part[4]; /* four chains: vpdpwssd's latency, not its throughput, would bound one */
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; ++j) part[j] = _mm512_setzero_si512();
    _Pragma("GCC unroll 16") for (int k = 0; k < 16; ++k) part[k & 3] =
        _mm512_dpwssd_epi32(part[k & 3], z[k], _mm512_set1_epi32(x[k]));
    return _mm512_add_epi32(_mm512_add_epi32(part[0], part[1]), _mm512_add_epi32(part[2], part[3]));
}

/* out[m * ldo + n] (+ bias[n]) for the MT activation rows and the LW_ROWS weight rows at w
 * (ld bytes apart, n from n0) */
INLINE void lw_group(int type, const uint8_t *w, int64_t ld, const act_t *a, int MT,
                     float *out, int64_t ldo, const float *bias) {
    __m512 acc[LW_MAX_ROWS], off[LW_MAX_ROWS];
    _Pragma("GCC unroll 11") for (int m = 0; m < MT; ++m) acc[m] = off[m] = _mm512_setzero_ps();
    for (int64_t b = 0; b < a->nb; ++b) {
        __m512i z[16];
        __m512 dw, mw;
        lw_block(type, w, ld, b, z, &dw, &mw);
        _Pragma("GCC unroll 11") for (int m = 0; m < MT; ++m) {
            const int64_t i = b * a->rows + m;
            acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lw_dot(z, a, i)),
                                     _mm512_mul_ps(dw, _mm512_set1_ps(a->d[i])), acc[m]);
            if (legacy_has_min(type))
                off[m] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a->sd[i]), off[m]);
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

/* ---- many activation rows ("lt"): a batch's or a prefill's ----
 * A group against the activation rows LT_TILE at a time, each block decoded and turned once
 * per tile (lw_block) and met by every row of the tile in turn, the rows' accumulators in
 * memory (a tile's: 2 x 4 KB): 16 vpdpwssd per row and block, no loads but the pairs'
 * broadcasts and the accumulators'. Against the activations laid out one row per lane
 * (chunks of 16 rows, each chunk's vector loaded per vpdpwssd) it took 0.41-0.74x the time
 * at 12-512 rows (2-vCPU Zen 4, two threads, the five types, SmolLM2's shapes and its LM
 * head from memory; the same bits). */
enum { LT_TILE = 64 };

/* acc/off[m * 16 + r] += activation row m0 + m against weight row r of the group at w */
INLINE void lt_tile(int type, const uint8_t *w, int64_t ld, const act_t *a, int64_t m0, int mt,
                    float *acc, float *off) {
    for (int64_t b = 0; b < a->nb; ++b) {
        __m512i z[16];
        __m512 dw, mw;
        lw_block(type, w, ld, b, z, &dw, &mw);
        for (int m = 0; m < mt; ++m) {
            const int64_t i = b * a->rows + m0 + m;
            _mm512_storeu_ps(acc + 16 * m, _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(lw_dot(z, a, i)), _mm512_mul_ps(dw, _mm512_set1_ps(a->d[i])),
                _mm512_loadu_ps(acc + 16 * m)));
            if (legacy_has_min(type))
                _mm512_storeu_ps(off + 16 * m, _mm512_fmadd_ps(
                    mw, _mm512_set1_ps(a->sd[i]), _mm512_loadu_ps(off + 16 * m)));
        }
    }
}

static void lt_group(int type, const uint8_t *w, int64_t ld, const act_t *a, float *out,
                     int64_t ldo, const float *bias) {
    float acc[LT_TILE * 16], off[LT_TILE * 16];
    const __m512 add = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
    for (int64_t m0 = 0; m0 < a->rows; m0 += LT_TILE) {
        const int mt = (int)(a->rows - m0 < LT_TILE ? a->rows - m0 : LT_TILE);
        memset(acc, 0, sizeof(float) * 16 * (size_t)mt);
        memset(off, 0, sizeof(float) * 16 * (size_t)mt);
        switch (type) {
        case T_Q4_0: lt_tile(T_Q4_0, w, ld, a, m0, mt, acc, off); break;
        case T_Q4_1: lt_tile(T_Q4_1, w, ld, a, m0, mt, acc, off); break;
        case T_Q5_0: lt_tile(T_Q5_0, w, ld, a, m0, mt, acc, off); break;
        case T_Q5_1: lt_tile(T_Q5_1, w, ld, a, m0, mt, acc, off); break;
        default: lt_tile(T_Q8_0, w, ld, a, m0, mt, acc, off); break;
        }
        for (int m = 0; m < mt; ++m)
            _mm512_storeu_ps(out + (m0 + m) * ldo, _mm512_add_ps(
                _mm512_add_ps(_mm512_loadu_ps(acc + 16 * m), _mm512_loadu_ps(off + 16 * m)), add));
    }
}

/* the first N / LW_ROWS * LW_ROWS weight rows, LW_ROWS at a time split over the threads,
 * for int16 activations of any number of rows (lw_group up to LW_MAX_ROWS, lt_group
 * beyond); the rows they cover */
static int64_t lw_linear(int type, const uint8_t *w, int64_t row_bytes, int64_t N,
                         const act_t *a, float *out, int64_t ldo, const float *bias,
                         int nthreads) {
    const int64_t groups = N / LW_ROWS, M = a->rows;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (N * a->nb * QK * M >= 65536)
    for (int64_t g = 0; g < groups; ++g) {
        const uint8_t *wg = w + g * LW_ROWS * row_bytes;
        const float *bg = bias ? bias + g * LW_ROWS : NULL;
        if (M > LW_MAX_ROWS)
            lt_group(type, wg, row_bytes, a, out + g * LW_ROWS, ldo, bg);
        else
            lw_group_of(type, wg, row_bytes, a, out + g * LW_ROWS, ldo, bg);
    }
    return groups * LW_ROWS;
}

#endif /* HWPLUG_GGML_LGROUP_H */
