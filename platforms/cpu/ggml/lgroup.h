/* The 32-value block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; IQ4_NL with int8 activations) for
 * several activation rows at once, one weight row per 32-bit lane of a 512-bit vector
 * (included by kernels.c in its VNNI build, after legacy_tile_of, whose per-pair fp32
 * arithmetic this reproduces lane by lane: see legacy_values).
 *
 * A group of LW_ROWS weight rows has each row's block decoded and turned so that vector i
 * holds word i of every row of the group (transpose16_epi32): with int16 activations the 16
 * int16 pairs of one block (legacy_values), each met by the activation row's pair i,
 * broadcast, in one vpdpwssd; with int8 activations the 8 unsigned byte quads of each of
 * two blocks (legacy_unsigned: the values plus legacy_center), met by the row's quads in
 * one vpdpbusd each, less legacy_center times the quants' sum (exact). Per activation row a
 * block then costs 16 (int16) or 8 (int8) dot instructions for the 16 weight rows and no
 * horizontal sums, then one fp32 FMA for the 16 pairs (Q4_1, Q5_1: one more for the
 * minimum). The weight's decoding and transpose are shared by the activation rows (no
 * packing of the activations). With int16, up to LW_MAX_ROWS activation rows (a verify
 * step's) keep their accumulators in registers (lw_group); more (a batch's, a prefill's),
 * and int8 rows from LB_MIN_ROWS, in memory, a tile of LT_TILE rows at a time (lt_group).
 * Either way a row's outputs are the same bits, whatever the other rows of the call. */
#ifndef HWPLUG_GGML_LGROUP_H
#define HWPLUG_GGML_LGROUP_H

/* weight rows per group; the most activation rows held in registers (lw_group: 2 x 11
 * accumulators); the longest rows (blocks) for which one activation row takes the groups
 * too (lw_one_row). lt_group measured 0.91-1.05x lw_group's speed at 1-11 rows (2-vCPU Zen 4,
 * two threads, Q4_1, Q5_1, Q8_0, 960 x 576 and 576 x 1536 from memory). */
enum { LW_ROWS = 16, LW_MAX_ROWS = 11, LW_ONE_ROW_BLOCKS = 24 };
/* the fewest int8 activation rows that take the groups (lt_group) rather than the tiles: at 2
 * rows 1.05-1.25x faster, at 5 1.8-2.0x, at 32 1.9-3.2x (2-vCPU Zen 4, two threads, Q4_1 and
 * Q8_0, 576 x 576, 3072 x 576 and 576 x 1536 from memory); one row keeps the tiles, whose
 * eight pairs' streams run ahead of sixteen */
enum { LB_MIN_ROWS = 2 };

/* whether one activation row takes the groups: one thread, CPU time, loaded, weights from
 * memory, against the one-row tiles, 576 inputs (18 blocks): Q8_0 1.2-1.4x, Q4_0
 * 1.12-1.18x, Q4_1 1.02-1.06x faster, Q5_0 and Q5_1 0.96-0.99x (their fifth bits cost more
 * for 16 rows); 1536 inputs 0.87-0.95x, 0.8-0.86x, 0.92-0.96x (sixteen rows' streams at
 * once, the tiles' eight). Since lw_block_q4, Q4_0's and Q4_1's groups take ~2/3 of that
 * time at one row; with 1536 and 8960 inputs they were then 0.9-1.2x the tiles (two
 * threads, 576 x 1536 to 8960 x 1536), so the limit stands. */
INLINE int lw_one_row(int type, int64_t nb) {
    return nb <= LW_ONE_ROW_BLOCKS && type != T_Q5_0 && type != T_Q5_1;
}

/* blocks per transposed step of lw_block: one as int16 pairs (wide: 16 vectors), two as
 * unsigned byte quads (int8 activations: 8 vectors each) */
#define LW_STEP(wide) ((wide) ? 1 : 2)

/* Q4_0 and Q4_1 (lw_block_q4): the raw block of each of the 16 rows turned first, then
 * decoded in lanes, all rows at once: the blocks' first 32 bytes as 8 words (a byte-masked
 * load, nothing read past the block) in an 8 x 8 transpose in each 256-bit half (rows 0-7,
 * 8-15), so w[j] lane r = word j of row r's block: Q4_1 w[0] (d, m) and w[1 .. 4] its 16
 * quant bytes; Q4_0 w[0] (d, bytes 0-1), w[1 .. 3], w[4] (bytes 14-15). Per block about a
 * third of the instructions of decoding each row and turning the pairs (lw_block's other
 * types). */
INLINE void lw_raw_q4(const uint8_t *blk, int64_t ld, int bytes, __m512i w[5]) {
    const __mmask32 mask = (__mmask32)((1u << bytes) - 1);
    __m512i x[8], t[8], u[8];
    _Pragma("GCC unroll 8") for (int r = 0; r < 8; ++r) {
        PREFETCH(blk + (r + LW_ROWS) * ld); /* the next group's block */
        PREFETCH(blk + (r + 8 + LW_ROWS) * ld);
        x[r] = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_maskz_loadu_epi8(mask, blk + r * ld)),
            _mm256_maskz_loadu_epi8(mask, blk + (r + 8) * ld), 1);
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < 8; i += 2) {
        t[i] = _mm512_unpacklo_epi32(x[i], x[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(x[i], x[i + 1]);
    }
    _Pragma("GCC unroll 2") for (int h = 0; h < 8; h += 4) {
        u[h] = _mm512_unpacklo_epi64(t[h], t[h + 2]);
        u[h + 1] = _mm512_unpackhi_epi64(t[h], t[h + 2]);
        u[h + 2] = _mm512_unpacklo_epi64(t[h + 1], t[h + 3]);
        u[h + 3] = _mm512_unpackhi_epi64(t[h + 1], t[h + 3]);
    }
    /* words j < 4 from the 128-bit lanes 0 and 2 of u[j] and u[j + 4], word 4 from lanes 1
     * and 3 of u[0] and u[4] */
    const __m512i first = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13),
                  second = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; ++j)
        w[j] = _mm512_permutex2var_epi64(u[j], first, u[j + 4]);
    w[4] = _mm512_permutex2var_epi64(u[0], second, u[4]);
}

/* lw_block for Q4_0 and Q4_1 (see lw_raw_q4): the same vectors from the raw words. Quant
 * byte q holds value q (low nibble) and value q + 16 (high nibble); it sits at byte
 * (q + off) % 4 of word (q + off) / 4, off the quants' offset in the block (2, 4). */
INLINE void lw_block_q4(int type, int wide, const uint8_t *w, int64_t ld, int64_t b,
                        int64_t nb, __m512i z[16], __m512 dw[2], __m512 mw[2]) {
    const int bytes = legacy_bytes(type), off = bytes - 16, two = !wide && b + 1 < nb;
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    /* vpshufb indexes bytes of its 128-bit lane: word d of a lane starts at byte 4d */
    const __m512i lane_word = _mm512_set4_epi32(0xC000C, 0x80008, 0x40004, 0);
    for (int h = 0; h < 1 + two; ++h) {
        __m512i raw[5];
        lw_raw_q4(w + (b + h) * bytes, ld, bytes, raw);
        dw[h] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(raw[0]));
        mw[h] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(raw[0], 16)));
        if (wide) { /* pair p: values 2p, 2p + 1 (quant bytes 2p, 2p + 1), pair 8 + p: + 16 */
            _Pragma("GCC unroll 8") for (int p = 0; p < 8; ++p) {
                const int q = 2 * p + off, at = q % 4;
                const __m512i pick = _mm512_add_epi32(
                    _mm512_set1_epi32(at | 0x8000 | (at + 1) << 16 | (int)0x80000000), lane_word);
                const __m512i pair = _mm512_shuffle_epi8(raw[q / 4], pick); /* 2 bytes, 0-extended */
                z[p] = _mm512_and_si512(pair, _mm512_set1_epi16(0x0F));
                z[8 + p] = _mm512_srli_epi16(pair, 4);
                if (legacy_center(type)) { /* Q4_0's values are the nibbles less 8 */
                    const __m512i center = _mm512_set1_epi16((short)legacy_center(type));
                    z[p] = _mm512_sub_epi16(z[p], center);
                    z[8 + p] = _mm512_sub_epi16(z[8 + p], center);
                }
            }
        } else { /* quad i: values 4i .. 4i + 3 (quant bytes 4i ..), quad 4 + i: + 16 */
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; ++i) {
                const __m512i quad = off == 4 ? raw[1 + i]
                    : _mm512_or_si512(_mm512_srli_epi32(raw[i], 16), _mm512_slli_epi32(raw[i + 1], 16));
                z[8 * h + i] = _mm512_and_si512(quad, low4);
                z[8 * h + 4 + i] = _mm512_and_si512(_mm512_srli_epi32(quad, 4), low4);
            }
        }
    }
}

/* block b of the LW_ROWS weight rows at w (ld bytes apart; nb blocks a row), decoded and
 * turned: wide, z[i] lane r holds int16 pair i of row r (legacy_values); else z[8 h + i]
 * lane r quad i of block b + h of row r as unsigned bytes (legacy_unsigned; zero past the
 * last block). dw[h] lane r: the scale of row r's block b + h, mw[h] its minimum (Q4_1,
 * Q5_1) */
INLINE void lw_block(int type, int wide, const uint8_t *w, int64_t ld, int64_t b, int64_t nb,
                     __m512i z[16], __m512 dw[2], __m512 mw[2]) {
    if (type == T_Q4_0 || type == T_Q4_1) {
        lw_block_q4(type, wide, w, ld, b, nb, z, dw, mw);
        return;
    }
    const int bytes = legacy_bytes(type), two = !wide && b + 1 < nb;
    const uint8_t *blk = w + b * bytes;
    _Pragma("GCC unroll 16") for (int r = 0; r < LW_ROWS; ++r) {
        PREFETCH(blk + (r + LW_ROWS) * ld); /* the next group's block(s) */
        if (wide) {
            u8x32 u;
            wide_t uw;
            legacy_values(type, blk + r * ld, 1, &u, &uw);
            z[r] = _mm512_inserti64x4(_mm512_castsi256_si512(uw.lo), uw.hi, 1);
        } else {
            PREFETCH(blk + (r + LW_ROWS) * ld + 2 * bytes - 1);
            const u8x32 next = two ? legacy_unsigned(type, blk + bytes + r * ld)
                                   : _mm256_setzero_si256();
            z[r] = _mm512_inserti64x4(_mm512_castsi256_si512(
                legacy_unsigned(type, blk + r * ld)), next, 1);
        }
    }
    transpose16_epi32(z); /* kgroup.h: z[r] lane i -> z[i] lane r */
    const __m512i rows = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32((int)ld));
    for (int h = 0; h < 1 + two; ++h) {
        const __m512i words = _mm512_i32gather_epi32(rows, (const void *)(blk + h * bytes), 1);
        dw[h] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(words));
        mw[h] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(words, 16)));
    }
}

/* lane r: the int32 dot product of weight row r's block b + h (z from lw_block at b) and
 * block b + h of activation row m, i = (b + h) * rows + m: int16 pairs by vpdpwssd, or
 * unsigned byte quads by vpdpbusd less legacy_center times the activations' sum */
INLINE __m512i lw_dot(int type, int wide, const __m512i z[16], int h, const act_t *a,
                      int64_t i) {
    const int32_t *x = wide ? (const int32_t *)Q16(a, i) : (const int32_t *)Q8(a, i);
    __m512i part[4]; /* four chains: the dot's latency, not its throughput, would bound one */
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; ++j) part[j] = _mm512_setzero_si512();
    if (wide) {
        _Pragma("GCC unroll 16") for (int k = 0; k < 16; ++k) part[k & 3] =
            _mm512_dpwssd_epi32(part[k & 3], z[k], _mm512_set1_epi32(x[k]));
    } else {
        _Pragma("GCC unroll 8") for (int k = 0; k < 8; ++k) part[k & 3] =
            _mm512_dpbusd_epi32(part[k & 3], z[8 * h + k], _mm512_set1_epi32(x[k]));
        if (legacy_center(type))
            part[0] = _mm512_sub_epi32(part[0], _mm512_set1_epi32(legacy_center(type) * a->sum[i]));
    }
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
        __m512 dw[2], mw[2];
        lw_block(type, 1, w, ld, b, a->nb, z, dw, mw);
        _Pragma("GCC unroll 11") for (int m = 0; m < MT; ++m) {
            const int64_t i = b * a->rows + m;
            acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lw_dot(type, 1, z, 0, a, i)),
                                     _mm512_mul_ps(dw[0], _mm512_set1_ps(a->d[i])), acc[m]);
            if (legacy_has_min(type))
                off[m] = _mm512_fmadd_ps(mw[0], _mm512_set1_ps(a->sd[i]), off[m]);
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
INLINE void lt_tile(int type, int wide, const uint8_t *w, int64_t ld, const act_t *a,
                    int64_t m0, int mt, float *acc, float *off) {
    for (int64_t b = 0; b < a->nb; b += LW_STEP(wide)) {
        __m512i z[16];
        __m512 dw[2], mw[2];
        lw_block(type, wide, w, ld, b, a->nb, z, dw, mw);
        for (int h = 0; h < LW_STEP(wide) && b + h < a->nb; ++h)
            for (int m = 0; m < mt; ++m) {
                const int64_t i = (b + h) * a->rows + m0 + m;
                _mm512_storeu_ps(acc + 16 * m, _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(lw_dot(type, wide, z, h, a, i)),
                    _mm512_mul_ps(dw[h], _mm512_set1_ps(a->d[i])), _mm512_loadu_ps(acc + 16 * m)));
                if (legacy_has_min(type))
                    _mm512_storeu_ps(off + 16 * m, _mm512_fmadd_ps(
                        mw[h], _mm512_set1_ps(a->sd[i]), _mm512_loadu_ps(off + 16 * m)));
            }
    }
}

#define LT_TILE_OF(T, W) lt_tile(T, W, w, ld, a, m0, mt, acc, off)
#define LT_TYPES(W)                                                                        \
    switch (type) {                                                                        \
    case T_Q4_0: LT_TILE_OF(T_Q4_0, W); break;                                             \
    case T_Q4_1: LT_TILE_OF(T_Q4_1, W); break;                                             \
    case T_Q5_0: LT_TILE_OF(T_Q5_0, W); break;                                             \
    case T_Q5_1: LT_TILE_OF(T_Q5_1, W); break;                                             \
    case T_Q8_0: LT_TILE_OF(T_Q8_0, W); break;                                             \
    default: if (!(W)) LT_TILE_OF(T_IQ4_NL, 0); break;                                     \
    }
static void lt_group(int type, int wide, const uint8_t *w, int64_t ld, const act_t *a,
                     float *out, int64_t ldo, const float *bias) {
    float acc[LT_TILE * 16], off[LT_TILE * 16];
    const __m512 add = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
    for (int64_t m0 = 0; m0 < a->rows; m0 += LT_TILE) {
        const int mt = (int)(a->rows - m0 < LT_TILE ? a->rows - m0 : LT_TILE);
        memset(acc, 0, sizeof(float) * 16 * (size_t)mt);
        memset(off, 0, sizeof(float) * 16 * (size_t)mt);
        if (wide) { LT_TYPES(1) } else { LT_TYPES(0) }
        for (int m = 0; m < mt; ++m)
            _mm512_storeu_ps(out + (m0 + m) * ldo, _mm512_add_ps(
                _mm512_add_ps(_mm512_loadu_ps(acc + 16 * m), _mm512_loadu_ps(off + 16 * m)), add));
    }
}
#undef LT_TYPES
#undef LT_TILE_OF

/* lw_group_of or lt_group over groups [g0, g1) of LW_ROWS weight rows */
static void run_lgroups(const void *ctx, int64_t g0, int64_t g1) {
    const job_t *j = ctx;
    for (int64_t g = g0; g < g1; ++g) {
        const uint8_t *wg = j->w + g * LW_ROWS * j->row_bytes;
        const float *bg = j->bias ? j->bias + g * LW_ROWS : NULL;
        if (!j->flag || j->act->rows > LW_MAX_ROWS)
            lt_group(j->type, j->flag, wg, j->row_bytes, j->act, j->out + g * LW_ROWS, j->ldo, bg);
        else
            lw_group_of(j->type, wg, j->row_bytes, j->act, j->out + g * LW_ROWS, j->ldo, bg);
    }
}
/* the first N / LW_ROWS * LW_ROWS weight rows, LW_ROWS at a time split over the threads,
 * for activations of any number of rows: int16 (wide) through lw_group up to LW_MAX_ROWS
 * and lt_group beyond, int8 through lt_group; the rows they cover */
static int64_t lw_linear(int type, int wide, const uint8_t *w, int64_t row_bytes, int64_t N,
                         const act_t *a, float *out, int64_t ldo, const float *bias,
                         int nthreads) {
    const int64_t groups = N / LW_ROWS;
    const job_t job = {type, w, row_bytes, N, 0, a, out, ldo, bias, wide};
    balanced_for(groups, N * a->nb * QK * a->rows >= 65536 ? nthreads : 1, 4, run_lgroups, &job);
    return groups * LW_ROWS;
}

#endif /* HWPLUG_GGML_LGROUP_H */
