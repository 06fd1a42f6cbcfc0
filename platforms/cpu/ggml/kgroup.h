/* The super-block types (Q2_K .. Q6_K, IQ4_XS) for several activation rows at once: 16
 * weight rows per group, one weight row per 32-bit lane of a 512-bit vector (included by
 * kernels.c in its VNNI build, after tile_k, whose per-pair fp32 arithmetic this
 * reproduces exactly: see k_finish).
 *
 * A super-block of the group is decoded once for all the call's activation rows, in two
 * halves of eight rows: each 32-value chunk of the eight rows (k_chunk) is transposed so
 * that lane r holds four consecutive quants of row r, and the headers' scales, mins and
 * centres become vectors over the rows (8 x 8 byte transposes); the halves are then joined.
 * Four activation rows at a time then cost one vpdpbusd per four values for all 16 rows
 * (their four int8 quants broadcast), one integer multiply by the sub-blocks' scales per
 * chunk, and the fp32 accumulation per super-block of k_finish. vpdpbusd takes the
 * unsigned quants whole (no int16 pair saturation), so IQ4_XS's values come as values + 128,
 * and 128 times the scaled activation sums are taken back from the integer dot.
 *
 * Q4_K, Q5_K, Q6_K and IQ4_XS weights may also come repacked once (kpack_rows): each
 * super-block of a group's 16 rows stored as its rows' 32-bit words interleaved, word w of
 * row r at 64 w + 4 r (Q6_K's trailing fp16 d: the 16 rows' d after the words), the same
 * bytes as the rows. A
 * chunk's quants then load straight into lanes (kpack_chunk: no transposes, decoded again for
 * each pass of four activation rows, in registers), and the headers decode as vectors over
 * the rows (kpack_head), so the groups serve every row count from this layout, one included.
 * Measured (2-vCPU Zen 5, loaded, one thread, CPU time, Qwen2.5 / Llama-3.1-8B shapes,
 * weights from memory) against the row layout's kernels: see kernels.c at KG_MIN_ROWS.
 * Tried and not kept (same machine and measure, Qwen2.5-1.5B's weights): decoding a
 * repacked super-block's quants once into the kgroup_t for all the passes of four rows
 * (as the row layout does) instead of in registers per pass was 5-15% slower at 4-128
 * rows (Q4_K 8960 x 1536: 0.54 against 0.47 ms at 4, 2.84 against 2.65 at 32; Q6_K
 * 151936 x 1536: 60 against 52 ms at 32); repacking row-layout weights on the fly, per
 * group or per super-block into a thread's scratch (a tied Q6_K LM head), cost more than
 * the transposes it replaces (151936 x 1536 Q6_K: 21 against 15 ms at 4 rows, 27 against
 * 27 at 8, 64 against 60 at 32). */
#ifndef HWPLUG_GGML_KGROUP_H
#define HWPLUG_GGML_KGROUP_H

/* weight rows per group (lanes); activation rows per pass over a group's super-blocks;
 * activation rows per load of a chunk's quants */
enum { KG_ROWS = 16, KG_PASS = 64, KG_R = 4 };

/* r[i] <- lane n of r[i] is lane i of r[n] (an 8 x 8 transpose of int32) */
INLINE void transpose8_epi32(__m256i r[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int h = 0; h < 8; h += 4) {
        u[h] = _mm256_unpacklo_epi64(t[h], t[h + 2]);
        u[h + 1] = _mm256_unpackhi_epi64(t[h], t[h + 2]);
        u[h + 2] = _mm256_unpacklo_epi64(t[h + 1], t[h + 3]);
        u[h + 3] = _mm256_unpackhi_epi64(t[h + 1], t[h + 3]);
    }
    for (int i = 0; i < 4; ++i) {
        r[i] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x31);
    }
}

/* a group's super-block: q[j][i] lane r = quants 32 j + 4 i .. + 3 of row r; the headers as
 * vectors over the rows: sc[k] (int32), the int16 pairs (x[2p], x[2p + 1]) of the mins (mnp)
 * and of the scales (scp), d and dmin */
typedef struct {
    __m256i q[8][8];
    __m256i sc[16], mnp[8], scp[8];
    __m256 d, dmin;
} khalf_t;
/* the same for the group's 16 rows: two halves of 8, rows 8 .. 15 in the upper 256 bits */
typedef struct {
    __m512i q[8][8];
    __m512i sc[16], mnp[8], scp[8];
    __m512 d, dmin;
} kgroup_t;

/* out[k] lane r = byte k of the 8 bytes at p[r] (k, r < 8), as int32: signed or unsigned
 * bytes (an 8 x 8 byte transpose by unpacking) */
INLINE void transpose8x8_bytes(const void *const p[8], __m256i out[8], int is_signed) {
    __m128i x[8];
    for (int r = 0; r < 8; ++r) x[r] = load8(p[r]);
    const __m128i a0 = _mm_unpacklo_epi8(x[0], x[1]), a1 = _mm_unpacklo_epi8(x[2], x[3]),
                  a2 = _mm_unpacklo_epi8(x[4], x[5]), a3 = _mm_unpacklo_epi8(x[6], x[7]);
    const __m128i b0 = _mm_unpacklo_epi16(a0, a1), b1 = _mm_unpackhi_epi16(a0, a1),
                  b2 = _mm_unpacklo_epi16(a2, a3), b3 = _mm_unpackhi_epi16(a2, a3);
    const __m128i c[4] = {_mm_unpacklo_epi32(b0, b2), _mm_unpackhi_epi32(b0, b2),
                          _mm_unpacklo_epi32(b1, b3), _mm_unpackhi_epi32(b1, b3)};
    for (int i = 0; i < 4; ++i) { /* c[i]: bytes k = 2 i for rows 0..7, then k = 2 i + 1 */
        const __m128i hi = _mm_srli_si128(c[i], 8);
        out[2 * i] = is_signed ? _mm256_cvtepi8_epi32(c[i]) : _mm256_cvtepu8_epi32(c[i]);
        out[2 * i + 1] = is_signed ? _mm256_cvtepi8_epi32(hi) : _mm256_cvtepu8_epi32(hi);
    }
}

/* lane r: the int16 pair (lo[r], hi[r]) (lo, hi: int32 lanes within int16) */
INLINE __m256i int16_pairs(__m256i lo, __m256i hi) {
    return _mm256_or_si256(_mm256_and_si256(lo, _mm256_set1_epi32(0xFFFF)),
                           _mm256_slli_epi32(hi, 16));
}

INLINE void khalf_load(int type, const uint8_t *blk, int64_t ld, khalf_t *g) {
    const int n = k_per32(type) ? 8 : 16, mins = k_has_mins(type);
    khead_t h[8];
    for (int r = 0; r < 8; ++r) k_header(type, blk + r * ld, &h[r]);
    for (int half = 0; half < n / 8; ++half) {
        const void *sc[8], *mn[8];
        for (int r = 0; r < 8; ++r) {
            sc[r] = h[r].sc + 8 * half;
            mn[r] = h[r].mn + 8 * half;
        }
        transpose8x8_bytes(sc, g->sc + 8 * half, 1);
        __m256i m[8];
        if (mins) transpose8x8_bytes(mn, m, 0);
        for (int p = 0; p < 4; ++p) {
            g->scp[4 * half + p] = int16_pairs(g->sc[8 * half + 2 * p], g->sc[8 * half + 2 * p + 1]);
            g->mnp[4 * half + p] = mins ? int16_pairs(m[2 * p], m[2 * p + 1]) : _mm256_setzero_si256();
        }
    }
    g->d = _mm256_setr_ps(h[0].d, h[1].d, h[2].d, h[3].d, h[4].d, h[5].d, h[6].d, h[7].d);
    g->dmin = mins ? _mm256_setr_ps(h[0].dmin, h[1].dmin, h[2].dmin, h[3].dmin, h[4].dmin,
                                    h[5].dmin, h[6].dmin, h[7].dmin)
                   : _mm256_setzero_ps();
    for (int j = 0; j < 8; ++j) {
        for (int r = 0; r < 8; ++r) g->q[j][r] = k_chunk(type, blk + r * ld, j);
        transpose8_epi32(g->q[j]);
    }
}

INLINE __m512i join(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}
INLINE __m512 join_ps(__m256 lo, __m256 hi) {
    return _mm512_castsi512_ps(join(_mm256_castps_si256(lo), _mm256_castps_si256(hi)));
}

/* the group's super-block at blk (rows ld bytes apart) */
INLINE void kgroup_load(int type, const uint8_t *blk, int64_t ld, kgroup_t *g) {
    const int n = k_per32(type) ? 8 : 16, bytes = k_bytes(type);
    /* the next group's super-block: each row's run of a group is a short stream that the
     * hardware prefetchers do not ramp up on, and in a decode step it comes from memory */
    for (int r = 0; r < KG_ROWS; ++r)
        for (int line = 0; line < bytes; line += 64)
            PREFETCH(blk + (KG_ROWS + r) * ld + line);
    khalf_t a, b;
    khalf_load(type, blk, ld, &a);
    khalf_load(type, blk + 8 * ld, ld, &b);
    for (int j = 0; j < 8; ++j)
        for (int i = 0; i < 8; ++i) g->q[j][i] = join(a.q[j][i], b.q[j][i]);
    for (int k = 0; k < n; ++k) g->sc[k] = join(a.sc[k], b.sc[k]);
    for (int p = 0; p < n / 2; ++p) {
        g->scp[p] = join(a.scp[p], b.scp[p]);
        g->mnp[p] = join(a.mnp[p], b.mnp[p]);
    }
    g->d = join_ps(a.d, b.d);
    g->dmin = join_ps(a.dmin, b.dmin);
}

/* the types kpack_rows repacks */
INLINE int kpack_type(int type) {
    return type == T_Q4_K || type == T_Q5_K || type == T_Q6_K || type == T_IQ4_XS;
}
/* word w of a repacked super-block: lane r = word w of row r */
#define KPACK_WORD(p, w) _mm512_loadu_si512((const void *)((p) + 64 * (w)))

/* r[i] <- lane n of r[i] is lane i of r[n] (a 16 x 16 transpose of int32) */
INLINE void transpose16_epi32(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int h = 0; h < 16; h += 4) { /* 128-bit lane L of u[h + j]: word 4 L + j of rows h.. */
        u[h] = _mm512_unpacklo_epi64(t[h], t[h + 2]);
        u[h + 1] = _mm512_unpackhi_epi64(t[h], t[h + 2]);
        u[h + 2] = _mm512_unpacklo_epi64(t[h + 1], t[h + 3]);
        u[h + 3] = _mm512_unpackhi_epi64(t[h + 1], t[h + 3]);
    }
    for (int j = 0; j < 4; ++j) {
        const __m512i a = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x88),
                      b = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xDD),
                      c = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x88),
                      d = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xDD);
        r[j] = _mm512_shuffle_i32x4(a, c, 0x88);
        r[4 + j] = _mm512_shuffle_i32x4(b, d, 0x88);
        r[8 + j] = _mm512_shuffle_i32x4(a, c, 0xDD);
        r[12 + j] = _mm512_shuffle_i32x4(b, d, 0xDD);
    }
}

/* out <- the rows n0 .. n0 + 15 of w (rows row_bytes apart, n0 a multiple of 16) repacked:
 * per super-block sb, 16 * bytes bytes at (n0 / 16 * nb + sb) * 16 * bytes; 16 words of
 * the 16 rows at a time by wide loads and a transpose in registers */
INLINE void kpack_rows(int type, const uint8_t *w, int64_t row_bytes, int64_t n0, uint8_t *out) {
    const int bytes = k_bytes(type), words = bytes / 4;
    const int64_t nb = row_bytes / bytes;
    for (int64_t sb = 0; sb < nb; ++sb) {
        uint8_t *dst = out + (n0 / KG_ROWS * nb + sb) * KG_ROWS * bytes;
        const uint8_t *src = w + n0 * row_bytes + sb * bytes;
        for (int i = 0; i < words; i += KG_ROWS) { /* 16 words of the 16 rows at a time */
            const int n = words - i < KG_ROWS ? words - i : KG_ROWS;
            const __mmask16 mask = (__mmask16)((1u << n) - 1);
            __m512i r[KG_ROWS];
            for (int k = 0; k < KG_ROWS; ++k)
                r[k] = _mm512_maskz_loadu_epi32(mask, src + k * row_bytes + 4 * i);
            transpose16_epi32(r);
            for (int k = 0; k < n; ++k) _mm512_storeu_si512((void *)(dst + 64 * (i + k)), r[k]);
        }
        if (bytes % 4)
            for (int r = 0; r < KG_ROWS; ++r)
                memcpy(dst + 64 * words + 2 * r, src + r * row_bytes + 4 * words, 2);
    }
}

/* the headers of a repacked super-block at p as kgroup_t's vectors (q left alone): Q4_K's
 * and Q5_K's word 0 (d, dmin) and words 1 .. 3 (k_scales, lane by lane); Q6_K's words
 * 48 .. 51 (int8 scales) and its 16 d after the 52 words; IQ4_XS's word 0 (d, the scales'
 * high bits) and word 1 (their low nibbles), as k_header decodes them */
INLINE void kpack_head(int type, const uint8_t *p, kgroup_t *g) {
    const __m512i low8 = _mm512_set1_epi32(0xFF);
    if (type == T_IQ4_XS) {
        const __m512i w0 = KPACK_WORD(p, 0), w1 = KPACK_WORD(p, 1);
        g->d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(w0));
        g->dmin = _mm512_setzero_ps();
        for (int k = 0; k < 8; ++k) /* (low nibble k | 2 high bits k << 4) - 32 */
            g->sc[k] = _mm512_sub_epi32(
                _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi32(w1, 4 * k), _mm512_set1_epi32(15)),
                    _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w0, 16 + 2 * k),
                                                       _mm512_set1_epi32(3)), 4)),
                _mm512_set1_epi32(32));
        for (int q = 0; q < 4; ++q)
            g->scp[q] = _mm512_or_si512(
                _mm512_and_si512(g->sc[2 * q], _mm512_set1_epi32(0xFFFF)),
                _mm512_slli_epi32(g->sc[2 * q + 1], 16));
    } else if (type == T_Q4_K || type == T_Q5_K) {
        const __m512i w0 = KPACK_WORD(p, 0), a = KPACK_WORD(p, 1), b = KPACK_WORD(p, 2),
                      c = KPACK_WORD(p, 3);
        const __m512i low6 = _mm512_set1_epi8(0x3F), low4 = _mm512_set1_epi8(0x0F),
                      top2 = _mm512_set1_epi8(0x03);
        g->d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(w0));
        g->dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(w0, 16)));
        const __m512i s[2] = {_mm512_and_si512(a, low6),
                              _mm512_or_si512(_mm512_and_si512(c, low4),
                                              _mm512_slli_epi32(_mm512_and_si512(
                                                  _mm512_srli_epi32(a, 6), top2), 4))};
        const __m512i m[2] = {_mm512_and_si512(b, low6),
                              _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(c, 4), low4),
                                              _mm512_slli_epi32(_mm512_and_si512(
                                                  _mm512_srli_epi32(b, 6), top2), 4))};
        for (int k = 0; k < 8; ++k)
            g->sc[k] = _mm512_and_si512(_mm512_srli_epi32(s[k / 4], 8 * (k % 4)), low8);
        for (int q = 0; q < 4; ++q) { /* bytes 2 q, 2 q + 1 of the mins as an int16 pair */
            const __m512i x = _mm512_srli_epi32(m[q / 2], 16 * (q % 2));
            g->mnp[q] = _mm512_or_si512(_mm512_and_si512(x, low8),
                                        _mm512_slli_epi32(_mm512_and_si512(
                                            x, _mm512_set1_epi32(0xFF00)), 8));
        }
    } else { /* Q6_K */
        g->d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 64 * 52)));
        g->dmin = _mm512_setzero_ps();
        for (int k = 0; k < 16; ++k)
            g->sc[k] = _mm512_srai_epi32(_mm512_slli_epi32(KPACK_WORD(p, 48 + k / 4),
                                                           24 - 8 * (k % 4)), 24);
        for (int q = 0; q < 8; ++q)
            g->scp[q] = _mm512_or_si512(
                _mm512_and_si512(g->sc[2 * q], _mm512_set1_epi32(0xFFFF)),
                _mm512_slli_epi32(g->sc[2 * q + 1], 16));
    }
}

/* q[i] lane r = quants 32 j + 4 i .. + 3 of row r of the repacked super-block at p (as
 * k_chunk decodes them: Q4_K's qs at word 4; Q5_K's qh at word 4 and qs at word 12; Q6_K's
 * ql at word 0 and qh at word 32; IQ4_XS's qs at word 2, looked up in IQ4_VALUES) */
INLINE void kpack_chunk(int type, const uint8_t *p, int j, __m512i q[8]) {
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    if (type == T_Q4_K || type == T_Q5_K) {
        const int qs = type == T_Q5_K ? 12 : 4;
        _Pragma("GCC unroll 8") for (int i = 0; i < 8; ++i) {
            const __m512i v = KPACK_WORD(p, qs + 8 * (j >> 1) + i);
            q[i] = _mm512_and_si512(j & 1 ? _mm512_srli_epi16(v, 4) : v, low4);
            if (type == T_Q5_K) /* bit j of qh[l], as bit 4 */
                q[i] = _mm512_or_si512(q[i], _mm512_slli_epi16(_mm512_and_si512(
                    _mm512_srli_epi16(KPACK_WORD(p, 4 + i), j), _mm512_set1_epi8(1)), 4));
        }
    } else if (type == T_IQ4_XS) { /* 16 bytes of nibbles: the low 16 values, then the high */
        const __m512i values = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)IQ4_VALUES));
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; ++i) {
            const __m512i v = KPACK_WORD(p, 2 + 4 * j + i);
            q[i] = _mm512_shuffle_epi8(values, _mm512_and_si512(v, low4));
            q[4 + i] = _mm512_shuffle_epi8(values, _mm512_and_si512(_mm512_srli_epi16(v, 4), low4));
        }
    } else { /* Q6_K: qh's bits 2 s, 2 s + 1 moved to bits 4, 5 by one shift (none at s = 2)
              * and masked, then one bit select (vpternlogd 0xCA) takes bits 0 .. 3 from ql's
              * nibble: 3.25 operations per four quants instead of 5 (one thread, 1024 x 4096
              * in cache, a 2-vCPU Zen 4: 1 row 89-92 -> 87 us, 4 rows 245-289 -> 232-242) */
        const int h = j >> 2, s = j & 3;
        _Pragma("GCC unroll 8") for (int i = 0; i < 8; ++i) {
            const __m512i l = KPACK_WORD(p, 16 * h + 8 * (s & 1) + i),
                          qh = KPACK_WORD(p, 32 + 8 * h + i);
            const __m512i hb = _mm512_and_si512(
                s < 2 ? _mm512_slli_epi16(qh, 4 - 2 * s) : s == 3 ? _mm512_srli_epi16(qh, 2) : qh,
                _mm512_set1_epi8(0x30));
            q[i] = _mm512_ternarylogic_epi32(low4, s & 2 ? _mm512_srli_epi16(l, 4) : l, hb, 0xCA);
        }
    }
}

/* the int32 broadcast of the four int8 at p */
INLINE __m512i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* sum_p pairs[p] . (b[2p], b[2p + 1]) per lane, for p < n */
INLINE __m512i kgroup_pairs(const __m512i *pairs, const int16_t *b, int n) {
    __m512i s = _mm512_setzero_si512();
    for (int p = 0; p < n; ++p) {
        int32_t v;
        memcpy(&v, b + 2 * p, 4);
        s = _mm512_dpwssd_epi32(s, pairs[p], _mm512_set1_epi32(v));
    }
    return s;
}

/* activation rows x[0 .. R - 1] against the group's super-block: acc and off as k_finish
 * has them. Each chunk's quants are loaded once for the R rows: from g (transposed), or
 * decoded from the repacked super-block at pk when it is not NULL. */
INLINE void kgroup_rows_r(int type, const kgroup_t *g, const q8k_t *const x[], int R,
                          __m512 *acc, __m512 *off, const uint8_t *pk) {
    const int per32 = k_per32(type), center = k_center(type);
    __m512i tot[KG_R];
    _Pragma("GCC unroll 4") for (int m = 0; m < R; ++m) tot[m] = _mm512_setzero_si512();
    _Pragma("GCC unroll 8") for (int j = 0; j < 8; ++j) {
        __m512i q[8];
        if (pk)
            kpack_chunk(type, pk, j, q);
        else
            _Pragma("GCC unroll 8") for (int i = 0; i < 8; ++i) q[i] = g->q[j][i];
        _Pragma("GCC unroll 4") for (int m = 0; m < R; ++m) {
            const int8_t *xq = x[m]->q + 32 * j;
            __m512i lo = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[0], bcast4(xq));
            __m512i hi = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[4], bcast4(xq + 16));
            _Pragma("GCC unroll 3") for (int i = 1; i < 4; ++i) {
                lo = _mm512_dpbusd_epi32(lo, q[i], bcast4(xq + 4 * i));
                hi = _mm512_dpbusd_epi32(hi, q[4 + i], bcast4(xq + 16 + 4 * i));
            }
            if (per32)
                tot[m] = _mm512_add_epi32(
                    tot[m], _mm512_mullo_epi32(_mm512_add_epi32(lo, hi), g->sc[j]));
            else
                tot[m] = _mm512_add_epi32(
                    tot[m], _mm512_add_epi32(_mm512_mullo_epi32(lo, g->sc[2 * j]),
                                             _mm512_mullo_epi32(hi, g->sc[2 * j + 1])));
        }
    }
    const int pairs = per32 ? 4 : 8;
    _Pragma("GCC unroll 4") for (int m = 0; m < R; ++m) {
        /* the activations' sums per scale: of 32 values (per32 types) or of 16 */
        _Alignas(16) int16_t sums32[8];
        const int16_t *sums = x[m]->bsums;
        if (per32) {
            _mm_store_si128((__m128i *)sums32,
                            _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)sums),
                                           _mm_loadu_si128((const __m128i *)(sums + 8))));
            sums = sums32;
        }
        if (type == T_IQ4_XS)
            tot[m] = _mm512_sub_epi32(tot[m],
                                      _mm512_slli_epi32(kgroup_pairs(g->scp, sums, pairs), 7));
        const __m512 dx = _mm512_set1_ps(x[m]->d);
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot[m]), _mm512_mul_ps(g->d, dx), acc[m]);
        if (k_has_mins(type))
            off[m] = _mm512_fmadd_ps(_mm512_mul_ps(g->dmin, dx),
                                     _mm512_cvtepi32_ps(kgroup_pairs(g->mnp, sums, pairs)),
                                     off[m]);
        else if (center && type != T_IQ4_XS)
            off[m] = _mm512_fmadd_ps(
                _mm512_mul_ps(g->d, dx),
                _mm512_cvtepi32_ps(_mm512_mullo_epi32(kgroup_pairs(g->scp, sums, pairs),
                                                      _mm512_set1_epi32(center))),
                off[m]);
    }
}

/* (acc - off) of activation row m against a group of 16 repacked weight rows (w: their
 * super-blocks, see kpack_rows), all super-blocks in one loop: the decode step's row, and
 * the rows past the last full pass of KG_R. Out of line, one instance per type: inlined
 * into kgroup_rows' loop over rows, the compiler hoisted each super-block's decoding out
 * of the (R = 1) calls and spilled it to the stack (one row, 64 x 8192 in cache, one
 * thread, a 2-vCPU Zen 4, per call with ~5 us of quantizing the row: Q4_K 19.1 -> 13.5 us,
 * Q5_K 23.7 -> 17.9, Q6_K 25.5 -> 20.8, IQ4_XS 23.8 -> 13.7; the same integer dots and fp32
 * arithmetic per pair). */
/* the headers of the repacked super-block at pk into g, after asking for the super-block
 * two ahead (one stream per group: the hardware prefetchers do not ramp up on it in time) */
INLINE void kpack_next(int type, const uint8_t *pk, kgroup_t *g) {
    const int bytes = k_bytes(type);
    for (int line = 0; line < KG_ROWS * bytes; line += 64)
        PREFETCH(pk + 2 * KG_ROWS * bytes + line);
    kpack_head(type, pk, g);
}

INLINE __m512 kpack_row_of(int type, const uint8_t *w, const act_t *a, int64_t m) {
    const int bytes = k_bytes(type);
    __m512 acc = _mm512_setzero_ps(), off = _mm512_setzero_ps();
    kgroup_t g;
    for (int64_t sb = 0; sb < a->nb; ++sb) {
        const uint8_t *pk = w + sb * KG_ROWS * bytes;
        kpack_next(type, pk, &g);
        const q8k_t *x = K8(a, sb * a->rows + m);
        kgroup_rows_r(type, &g, &x, 1, &acc, &off, pk);
    }
    return _mm512_sub_ps(acc, off);
}
#define KPACK_ROW(T)                                                                  \
    static __attribute__((noinline)) __m512 kpack_row_##T(const uint8_t *w, const act_t *a, \
                                                          int64_t m) {                 \
        return kpack_row_of(T, w, a, m);                                              \
    }
KPACK_ROW(T_Q4_K) KPACK_ROW(T_Q5_K) KPACK_ROW(T_Q6_K) KPACK_ROW(T_IQ4_XS)
#undef KPACK_ROW
INLINE __m512 kpack_row(int type, const uint8_t *w, const act_t *a, int64_t m) {
    switch (type) {
    case T_Q4_K: return kpack_row_T_Q4_K(w, a, m);
    case T_Q5_K: return kpack_row_T_Q5_K(w, a, m);
    case T_Q6_K: return kpack_row_T_Q6_K(w, a, m);
    default: return kpack_row_T_IQ4_XS(w, a, m);
    }
}

/* out[m * ldo + n0 + r] for r < 16 and every activation row m, from weight rows n0 .. n0 +
 * 15 (w: row n0, or with packed their repacked super-blocks, see kpack_rows) */
INLINE void kgroup_rows(int type, const uint8_t *w, int64_t ld, const act_t *a, float *out,
                        int64_t ldo, const float *bias, int packed) {
    const int bytes = k_bytes(type);
    const __m512 b = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
    kgroup_t g;
    for (int64_t m0 = 0; m0 < a->rows; m0 += KG_PASS) {
        const int mc = (int)(a->rows - m0 < KG_PASS ? a->rows - m0 : KG_PASS);
        /* the rows taken by super-block below; with packed, the rest by kpack_row */
        const int full = packed ? mc / KG_R * KG_R : mc;
        __m512 acc[KG_PASS], off[KG_PASS];
        for (int m = 0; m < mc; ++m) acc[m] = off[m] = _mm512_setzero_ps();
        for (int m = full; m < mc; ++m) acc[m] = kpack_row(type, w, a, m0 + m);
        for (int64_t sb = 0; full && sb < a->nb; ++sb) {
            const uint8_t *pk = packed ? w + sb * KG_ROWS * bytes : NULL;
            if (packed) {
                kpack_next(type, pk, &g);
            } else {
                kgroup_load(type, w + sb * bytes, ld, &g);
            }
            for (int m = 0; m < full; m += KG_R) {
                const q8k_t *x[KG_R];
                const int r = full - m < KG_R ? full - m : KG_R;
                for (int i = 0; i < r; ++i) x[i] = K8(a, sb * a->rows + m0 + m + i);
                if (r == KG_R)
                    kgroup_rows_r(type, &g, x, KG_R, acc + m, off + m, pk);
                else
                    for (int i = 0; i < r; ++i)
                        kgroup_rows_r(type, &g, x + i, 1, acc + m + i, off + m + i, pk);
            }
        }
        for (int m = 0; m < mc; ++m)
            _mm512_storeu_ps(out + (m0 + m) * ldo,
                             _mm512_add_ps(_mm512_sub_ps(acc[m], off[m]), b));
    }
}

/* each type's instance (type and packed compile-time constants in each) */
static void kgroup(int type, const uint8_t *w, int64_t ld, const act_t *a, float *out,
                   int64_t ldo, const float *bias, int packed) {
    switch (type) {
#define KG(T) case T: kgroup_rows(T, w, ld, a, out, ldo, bias, 0); break;
#define KP(T) case T: { if (packed) kgroup_rows(T, w, ld, a, out, ldo, bias, 1); \
                        else kgroup_rows(T, w, ld, a, out, ldo, bias, 0); } break;
    KG(T_Q2_K) KG(T_Q3_K) KP(T_Q4_K) KP(T_Q5_K) KP(T_Q6_K) KP(T_IQ4_XS)
#undef KG
#undef KP
    }
}
#endif /* HWPLUG_GGML_KGROUP_H */
