/* The small ops of a CPU decode step, fused into one pass each, fp32 (see ops.py):
 *
 * hwplug_rms_norm: out = s * rsqrt(mean(s^2) + eps) * w per row, s = x (+ residual, also
 *   written to sum) in the same pass; x's rows may come in groups apart (a [T, rows, H]
 *   view, e.g. Qwen3's q/k-norm on the heads of a fused qkv output).
 * hwplug_silu_and_mul: out = silu(x[:d]) * x[d:] per row.
 * hwplug_rotary: the neox or GPT-J rotation of each head's first rot_dim dims by its
 *   token's cos/sin row, the rest copied.
 * hwplug_cache_write: each token's key and value rows into its slot of the paged cache.
 * hwplug_linear_f32: activation rows by an fp32 weight through register tiles of dot
 *   products, each output summed in one order whatever the row count; OpenMP over the
 *   weight rows.
 * hwplug_paged_decode: attention of one query per decode row over its paged NHD cache,
 *   walking its block table (no gather): online softmax over chunks of keys, the query
 *   heads of one KV head together, sliding window and soft cap; a verify step's rows of
 *   one sequence read each chunk once. OpenMP over (run of rows, KV head).
 *
 * Built like the ggml kernels (hwplug.platforms.cpu.ggml.build): avx2 and portable builds
 * of the same GNU C vector code (8 fp32 lanes), which each build's flags lower to its SIMD.
 * Return values: 0 on success, -1 for an index out of range, -2 (decode) for a sequence
 * longer than its block table row holds (nothing else is checked here: the Python side
 * checks shapes and dtypes).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__FMA__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=fast") /* a * b + c as one FMA where the CPU has it */
#endif

#define INLINE static inline __attribute__((always_inline))
typedef float f32x8 __attribute__((vector_size(32)));
typedef int32_t i32x8 __attribute__((vector_size(32)));

INLINE f32x8 load8(const float *p) { f32x8 v; memcpy(&v, p, sizeof v); return v; }
INLINE void store8(float *p, f32x8 v) { memcpy(p, &v, sizeof v); }
INLINE f32x8 splat(float x) { return (f32x8){x, x, x, x, x, x, x, x}; }
INLINE float hsum(f32x8 v) {
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}
INLINE f32x8 select(i32x8 mask, f32x8 a, f32x8 b) { /* mask ? a : b, lane by lane */
    return (f32x8)((mask & (i32x8)a) | (~mask & (i32x8)b));
}

/* exp(x) lane by lane, x clamped to [-87, 88]: 2^n p(r), Cephes' expf polynomial (relative
 * error ~1e-7), so exp(-inf) is 1.6e-38, not 0 */
INLINE f32x8 exp8(f32x8 x) {
    x = select(x < -87.0f, splat(-87.0f), select(x > 88.0f, splat(88.0f), x));
    const f32x8 t = x * 1.44269504088896341f + 0.5f;
    i32x8 n = __builtin_convertvector(t, i32x8); /* truncates: floor for t < 0 is one less */
    n += (i32x8)(__builtin_convertvector(n, f32x8) > t);
    const f32x8 nf = __builtin_convertvector(n, f32x8);
    const f32x8 r = (x - nf * 0.693359375f) + nf * 2.12194440e-4f;
    f32x8 p = splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    return p * (f32x8)((n + 127) << 23);
}

/* ---- rms_norm ---- */
INLINE void rms_norm_row(const float *x, const float *res, float *out, float *sum,
                         const float *w, int64_t H, float eps) {
    f32x8 acc0 = {0}, acc1 = {0};
    float tail = 0.0f;
    int64_t i = 0;
    for (; i + 16 <= H; i += 16) {
        f32x8 a = load8(x + i), b = load8(x + i + 8);
        if (res) {
            a += load8(res + i);
            b += load8(res + i + 8);
            store8(sum + i, a);
            store8(sum + i + 8, b);
        }
        acc0 += a * a;
        acc1 += b * b;
    }
    for (; i < H; ++i) {
        const float s = res ? (sum[i] = x[i] + res[i]) : x[i];
        tail += s * s;
    }
    const float inv = 1.0f / sqrtf((hsum(acc0 + acc1) + tail) / (float)H + eps);
    const float *s = res ? sum : x;
    for (i = 0; i + 8 <= H; i += 8) store8(out + i, load8(s + i) * inv * load8(w + i));
    for (; i < H; ++i) out[i] = s[i] * inv * w[i];
}

/* rows of H values: out = rms_norm(x (+ res)), sum = x + res when res is given; x's rows
 * come in groups of `group` contiguous rows, the groups ldx floats apart (a [T, group, H]
 * view whose tokens sit apart, e.g. heads of a fused qkv output; ldx = group * H when x is
 * contiguous); res, out and sum are contiguous */
int hwplug_rms_norm(const float *x, int64_t group, int64_t ldx, const float *res, float *out,
                    float *sum, const float *w, int64_t rows, int64_t H, float eps,
                    int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static) if (rows * H >= (1 << 16))
    for (int64_t r = 0; r < rows; ++r)
        rms_norm_row(x + r / group * ldx + r % group * H, res ? res + r * H : 0, out + r * H,
                     sum ? sum + r * H : 0, w, H, eps);
    return 0;
}

/* ---- silu_and_mul ---- */
INLINE f32x8 silu_mul8(f32x8 g, f32x8 u) { return g / (1.0f + exp8(-g)) * u; }

/* rows of 2d values -> rows of d: silu(first half) * second half */
int hwplug_silu_and_mul(const float *x, float *out, int64_t rows, int64_t d, int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static) if (rows * d >= (1 << 16))
    for (int64_t r = 0; r < rows; ++r) {
        const float *g = x + 2 * d * r, *u = g + d;
        float *o = out + d * r;
        int64_t i = 0;
        for (; i + 8 <= d; i += 8) store8(o + i, silu_mul8(load8(g + i), load8(u + i)));
        if (i < d) { /* the last d % 8 values, through a zero-padded vector */
            f32x8 gt = {0}, ut = {0};
            const size_t bytes = sizeof(float) * (size_t)(d - i);
            memcpy(&gt, g + i, bytes);
            memcpy(&ut, u + i, bytes);
            const f32x8 ot = silu_mul8(gt, ut);
            memcpy(o + i, &ot, bytes);
        }
    }
    return 0;
}

/* ---- rotary_embedding ---- */
/* heads [H, D] of one token (head h at x + h * D) rotated into out (same layout) */
INLINE void rotate_heads(const float *x, float *out, int64_t H, int64_t D, int64_t rot,
                         const float *cos, const float *sin, int neox) {
    const int64_t half = rot / 2;
    for (int64_t h = 0; h < H; ++h, x += D, out += D) {
        if (neox) {
            for (int64_t i = 0; i < half; ++i) {
                const float a = x[i], b = x[i + half];
                out[i] = a * cos[i] - b * sin[i];
                out[i + half] = b * cos[i] + a * sin[i];
            }
        } else {
            for (int64_t i = 0; i < half; ++i) {
                const float a = x[2 * i], b = x[2 * i + 1];
                out[2 * i] = a * cos[i] - b * sin[i];
                out[2 * i + 1] = b * cos[i] + a * sin[i];
            }
        }
        memcpy(out + rot, x + rot, sizeof(float) * (size_t)(D - rot));
    }
}

/* query [T, Hq, D] (tokens q_stride values apart) and key [T, Hk, D] (k_stride apart)
 * rotated into q_out and k_out [T, H, D] by cache [max_pos, rot] rows pos[t]; -1 when a
 * position is not in [0, max_pos) */
int hwplug_rotary(const int64_t *pos, const float *cache, int64_t max_pos, int64_t rot,
                  const float *q, int64_t q_stride, int64_t Hq, float *q_out, const float *k,
                  int64_t k_stride, int64_t Hk, float *k_out, int64_t T, int64_t D, int neox) {
    for (int64_t t = 0; t < T; ++t)
        if (pos[t] < 0 || pos[t] >= max_pos) return -1;
    for (int64_t t = 0; t < T; ++t) {
        const float *c = cache + pos[t] * rot;
        rotate_heads(q + t * q_stride, q_out + t * Hq * D, Hq, D, rot, c, c + rot / 2, neox);
        rotate_heads(k + t * k_stride, k_out + t * Hk * D, Hk, D, rot, c, c + rot / 2, neox);
    }
    return 0;
}

/* ---- paged_attention, decode ---- */
enum { CHUNK = 16, MAX_GROUP = 16, MAX_HEAD = 256, MAX_ITEM = 32 };

/* lanes of two 8-lane vectors by index (0-7: a's, 8-15: b's): clang's and GCC 12's
 * __builtin_shufflevector, older GCC's __builtin_shuffle */
#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define SHUFFLE8(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#endif
#endif
#ifndef SHUFFLE8
#define SHUFFLE8(a, b, ...) __builtin_shuffle(a, b, (i32x8){__VA_ARGS__})
#endif

/* the lane sums of a[0..7], in lanes 0..7: pairs of lanes, then pairs of pairs, then the
 * two halves, each step adding two shuffles of two vectors (no horizontal sum per key) */
INLINE f32x8 hsum8(const f32x8 a[8]) {
    f32x8 p[4], t[2];
    for (int i = 0; i < 4; ++i)
        p[i] = SHUFFLE8(a[2 * i], a[2 * i + 1], 0, 8, 2, 10, 4, 12, 6, 14) +
               SHUFFLE8(a[2 * i], a[2 * i + 1], 1, 9, 3, 11, 5, 13, 7, 15);
    for (int i = 0; i < 2; ++i)
        t[i] = SHUFFLE8(p[2 * i], p[2 * i + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
               SHUFFLE8(p[2 * i], p[2 * i + 1], 2, 3, 10, 11, 6, 7, 14, 15);
    return SHUFFLE8(t[0], t[1], 0, 1, 2, 3, 8, 9, 10, 11) +
           SHUFFLE8(t[0], t[1], 4, 5, 6, 7, 12, 13, 14, 15);
}

/* acc[j] += x * k[j] over the D values of q and the keys k[j] = k + j * stride, j < n */
#define SCORE_KEYS(n)                                                                     \
    for (int64_t i = 0; i < D; i += 8) {                                                  \
        const f32x8 x = load8(q + i);                                                     \
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; ++j)                               \
            if (j < (n)) acc[j] += x * load8(k + j * stride + i);                         \
    }

/* q . k[j] in lane j for the n (<= 8) keys k[j] = k + j * stride, D long; lanes past n 0 */
INLINE f32x8 scores8(const float *q, const float *k, int64_t stride, int64_t n, int64_t D) {
    f32x8 acc[8];
    for (int j = 0; j < 8; ++j) acc[j] = splat(0.0f);
    if (n == 8) { /* the same sums, without a test per key in the loop */
        SCORE_KEYS(8)
    } else {
        SCORE_KEYS(n)
    }
    return hsum8(acc);
}

typedef struct {
    const float *k, *v;      /* the first key / value: cache[0 or 1, 0, 0, 0] */
    int64_t block_stride;    /* values from one cache block to the next */
    int64_t token_stride;    /* values from one slot to the next (Hkv * D) */
    int64_t block_size, num_blocks, D;
    float scale, cap;        /* cap 0: no soft cap */
} kv_t;

/* a[k] += p[j] * v[j][8 k .. 8 k + 8) for keys j < n (v[j] = v + j * stride), k < w */
#define WEIGH_KEYS(w)                                                                     \
    for (int64_t j = 0; j < n; ++j) {                                                     \
        const f32x8 pj = splat(p[j]);                                                     \
        _Pragma("GCC unroll 8") for (int k = 0; k < 8; ++k)                               \
            if (k < (w)) a[k] += pj * load8(v + j * stride + 8 * k);                      \
    }

/* acc[0, 8 w) = acc * correction + sum over keys j < n of p[j] * v[j] (v[j] = v + j * stride),
 * w <= 8 vectors in registers, each lane summed in key order */
INLINE void weigh_values(const float *p, int64_t n, const float *v, int64_t stride, int64_t w,
                         float correction, float *acc) {
    f32x8 a[8] = {0};
    _Pragma("GCC unroll 8") for (int k = 0; k < 8; ++k)
        if (k < w) a[k] = load8(acc + 8 * k) * correction;
    if (w == 8) { /* the same sums, without a test per vector in the loop */
        WEIGH_KEYS(8)
    } else {
        WEIGH_KEYS(w)
    }
    _Pragma("GCC unroll 8") for (int k = 0; k < 8; ++k)
        if (k < w) store8(acc + 8 * k, a[k]);
}

/* the largest lane of v */
INLINE float hmax8(f32x8 v) {
    v = select((i32x8)(v > SHUFFLE8(v, v, 4, 5, 6, 7, 0, 1, 2, 3)), v,
               SHUFFLE8(v, v, 4, 5, 6, 7, 0, 1, 2, 3));
    v = select((i32x8)(v > SHUFFLE8(v, v, 2, 3, 0, 1, 6, 7, 4, 5)), v,
               SHUFFLE8(v, v, 2, 3, 0, 1, 6, 7, 4, 5));
    return v[0] > v[1] ? v[0] : v[1];
}

/* Keys [k0, k0 + n) of one chunk (kp, vp: its first key and value) folded into the online
 * softmax of G query heads q [G, D]: m [G] the running maxima, l [G] the running sums, acc
 * [G, D] the running weighted values, s a [G, CHUNK] scratch. Every head's scores are
 * written before any is read back (no store-to-load stall per key). The same arithmetic
 * per head whichever rows share the call. */
INLINE void fold_chunk(const float *q, int G, const float *kp, const float *vp, int64_t n,
                       const kv_t *c, float *m, float *l, float *acc, float *s) {
    const int64_t D = c->D;
    for (int64_t j = 0; j < n; j += 8)
        for (int g = 0; g < G; ++g)
            store8(s + g * CHUNK + j, scores8(q + g * D, kp + j * c->token_stride,
                                              c->token_stride, n - j < 8 ? n - j : 8, D)
                                          * c->scale);
    for (int g = 0; g < G; ++g) {
        float *sg = s + g * CHUNK, *ag = acc + g * D, top = m[g];
        if (c->cap > 0.0f) /* cap tanh(v / cap) = cap (1 - 2 / (exp(2 v / cap) + 1)) */
            for (int h = 0; h < CHUNK; h += 8)
                store8(sg + h, c->cap - 2.0f * c->cap /
                                   (exp8(load8(sg + h) * (2.0f / c->cap)) + 1.0f));
        _Static_assert(CHUNK == 16, "a chunk's scores are two vectors");
        const i32x8 lane = {0, 1, 2, 3, 4, 5, 6, 7};
        const i32x8 low = lane < (int32_t)n, high = lane + 8 < (int32_t)n; /* keys < n */
        const f32x8 s0 = load8(sg), s1 = load8(sg + 8), none = splat(-INFINITY);
        const f32x8 a = select(low, s0, none), b = select(high, s1, none);
        const float most = hmax8(select((i32x8)(a > b), a, b));
        top = most > top ? most : top;
        const float correction = expf(m[g] - top); /* 0 on the first chunk */
        const f32x8 p0 = select(low, exp8(s0 - top), splat(0.0f));
        const f32x8 p1 = select(high, exp8(s1 - top), splat(0.0f));
        store8(sg, p0);
        store8(sg + 8, p1);
        l[g] = l[g] * correction + hsum(p0 + p1);
        for (int64_t i = 0; i < D; i += 64) /* 8 independent sums in registers at a time */
            weigh_values(sg, n, vp + i, c->token_stride, D - i < 64 ? (D - i) / 8 : 8,
                         correction, ag + i);
        m[g] = top;
    }
}

/* Prefetch the keys and values of KV heads [kh0, kh0 + hk) in slots [slot, slot + n) of
 * block (nothing for a block out of range: the walk reports it when it gets there) */
INLINE void fetch_chunk(const kv_t *c, int64_t block, int64_t slot, int64_t n, int64_t kh0,
                        int64_t hk) {
    if (block < 0 || block >= c->num_blocks) return;
    const int64_t first = block * c->block_stride + slot * c->token_stride + kh0 * c->D;
    for (int64_t j = 0; j < n; ++j)
        for (int64_t i = 0; i < hk * c->D; i += 16) { /* a 64-byte line */
            __builtin_prefetch(c->k + first + j * c->token_stride + i, 0, 3);
            __builtin_prefetch(c->v + first + j * c->token_stride + i, 0, 3);
        }
}

/* The query heads of KV heads [kh0, kh0 + hk) in decode rows [r0, r1) (row r: query + r *
 * q_stride, out + r * Hq * D; context seq_lens[r] keys of the blocks its table row lists)
 * attend to keys start onward, chunk by chunk: rows of one sequence read each chunk once,
 * from the cache the first row brought it into, and with every KV head (hk = Hkv) a chunk
 * is one contiguous stretch of the block. At most MAX_ITEM heads; -1 for a block out of
 * range. */
static int attend_rows(const float *query, int64_t q_stride, int64_t Hq, int64_t kh0,
                       int64_t hk, int G, const kv_t *c, const int32_t *tables,
                       int64_t table_stride, const int32_t *seq_lens, int64_t r0, int64_t r1,
                       int64_t start, float *out) {
    const int64_t D = c->D, bs = c->block_size, row_heads = hk * G;
    const int64_t heads = (r1 - r0) * row_heads;
    float m[MAX_ITEM], l[MAX_ITEM], s[MAX_GROUP * CHUNK], acc[MAX_ITEM * MAX_HEAD];
    int64_t longest = 0;
    for (int64_t r = r0; r < r1; ++r) longest = seq_lens[r] > longest ? seq_lens[r] : longest;
    for (int64_t h = 0; h < heads; ++h) { m[h] = -INFINITY; l[h] = 0.0f; }
    memset(acc, 0, sizeof(float) * (size_t)(heads * D));
    memset(s, 0, sizeof s);
    for (int64_t k0 = start; k0 < longest;) {
        const int64_t slot = k0 % bs, n = bs - slot < CHUNK ? bs - slot : CHUNK;
        const int64_t next = k0 + n; /* the last row's next chunk, on its way from memory */
        if (next < seq_lens[r1 - 1])
            fetch_chunk(c, tables[(r1 - 1) * table_stride + next / bs], next % bs,
                        bs - next % bs < CHUNK ? bs - next % bs : CHUNK, kh0, hk);
        for (int64_t r = r0; r < r1; ++r) {
            if (k0 >= seq_lens[r]) continue;
            const int64_t block = tables[r * table_stride + k0 / bs];
            if (block < 0 || block >= c->num_blocks) return -1;
            const int64_t rows = seq_lens[r] - k0 < n ? seq_lens[r] - k0 : n;
            for (int64_t kh = kh0; kh < kh0 + hk; ++kh) {
                const int64_t first = block * c->block_stride + slot * c->token_stride + kh * D;
                const int64_t h = (r - r0) * row_heads + (kh - kh0) * G;
                fold_chunk(query + r * q_stride + kh * G * D, G, c->k + first, c->v + first,
                           rows, c, m + h, l + h, acc + h * D, s);
            }
        }
        k0 += n;
    }
    for (int64_t r = r0; r < r1; ++r)
        for (int64_t h = 0; h < row_heads; ++h) {
            const int64_t at = (r - r0) * row_heads + h;
            const float inv = l[at] > 0.0f ? 1.0f / l[at] : 0.0f; /* no keys: zeros */
            float *o = out + (r * Hq + kh0 * G + h) * D;
            for (int64_t i = 0; i < D; i += 8) store8(o + i, load8(acc + at * D + i) * inv);
        }
    return 0;
}

/* whether decode row b starts a run: it cannot share row b - 1's chunks (another first
 * block, a sliding window that starts either row past key 0, or no table) */
INLINE int new_sequence(int64_t b, const int32_t *tables, int64_t table_stride,
                        int64_t table_width, const int32_t *seq_lens, int64_t window) {
    return b == 0 || table_width == 0 ||
           (window > 0 && (seq_lens[b] > window || seq_lens[b - 1] > window)) ||
           tables[b * table_stride] != tables[(b - 1) * table_stride];
}

/* out [B, Hq, D] = decode attention of query [B, Hq, D] (rows q_stride values apart) over
 * kv_cache [2, num_blocks, block_size, Hkv, D] (fp32, contiguous), block_tables [B,
 * table_stride] int32, seq_lens [B] int32; window 0: none, cap 0: none. D % 8 == 0,
 * D <= MAX_HEAD, Hq / Hkv <= MAX_GROUP (the caller checks). Consecutive rows whose tables
 * start with the same block and that see their context from key 0 (a verify step's rows
 * of one sequence) run together, up to MAX_ITEM heads. A work item is a row and every KV
 * head in a decode batch of sequences enough to keep the threads busy (each chunk read as
 * one stretch of memory), else a run of a share of the rows and one KV head.
 * Items are taken one at a time (they differ in size); each row's output is the same bits
 * however rows and heads are grouped. -1 for a block index out of range, -3 out of
 * memory. */
int hwplug_paged_decode(const float *query, int64_t q_stride, const float *kv_cache,
                        int64_t num_blocks, int64_t block_size, int64_t Hkv, int64_t D,
                        const int32_t *block_tables, int64_t table_stride,
                        int64_t table_width, const int32_t *seq_lens, int64_t B, int64_t Hq,
                        float scale, int64_t window, float cap, float *out, int nthreads) {
    const int G = (int)(Hq / Hkv);
    const kv_t c = {kv_cache, kv_cache + num_blocks * block_size * Hkv * D,
                    block_size * Hkv * D, Hkv * D, block_size, num_blocks, D, scale, cap};
    int64_t work = 0, seqs = 0;
    for (int64_t b = 0; b < B; ++b) { /* a length past its table row would read beyond it */
        if (seq_lens[b] < 0 || seq_lens[b] > table_width * block_size) return -2;
        work += seq_lens[b];
    }
    for (int64_t b = 0; b < B; ++b)
        seqs += new_sequence(b, block_tables, table_stride, table_width, seq_lens, window);
    const int64_t hk = seqs == B && seqs >= 2 * nthreads && Hq <= MAX_ITEM ? Hkv : 1;
    const int64_t share = (B + 2 * nthreads - 1) / (2 * nthreads), most = MAX_ITEM / (G * hk);
    const int64_t run_rows = share < most ? share : most;
    int64_t *runs = malloc(sizeof(int64_t) * (size_t)(B + 1)), num_runs = 0;
    if (!runs) return -3;
    for (int64_t b = 0; b < B; ++b)
        if (new_sequence(b, block_tables, table_stride, table_width, seq_lens, window) ||
            b - runs[num_runs - 1] >= run_rows)
            runs[num_runs++] = b;
    runs[num_runs] = B;
    const int64_t groups = Hkv / hk;
    int status = 0;
#pragma omp parallel for collapse(2) num_threads(nthreads) schedule(dynamic, 1) \
    if (work * Hq * D >= (1 << 15) && num_runs * groups > 1)
    for (int64_t i = 0; i < num_runs; ++i)
        for (int64_t kh = 0; kh < Hkv; kh += hk) {
            const int64_t first = runs[i], len = seq_lens[first];
            const int64_t start = window > 0 && len > window ? len - window : 0;
            if (attend_rows(query, q_stride, Hq, kh, hk, G, &c, block_tables, table_stride,
                            seq_lens, first, runs[i + 1], start, out)) {
#pragma omp atomic write
                status = -1;
            }
        }
    free(runs);
    return status;
}

/* key and value rows t (row floats each, token strides k_stride and v_stride) into slot
 * slots[t] of kv_cache's halves ([2, num_slots, row], contiguous); a negative slot is
 * padding, skipped. Every slot is checked before anything is written: -1 for one at or
 * past num_slots. */
int hwplug_cache_write(const float *key, int64_t k_stride, const float *value,
                       int64_t v_stride, float *kv_cache, int64_t num_slots, int64_t row,
                       const int64_t *slots, int64_t tokens) {
    for (int64_t t = 0; t < tokens; ++t)
        if (slots[t] >= num_slots) return -1;
    const size_t bytes = sizeof(float) * (size_t)row;
    for (int64_t t = 0; t < tokens; ++t) {
        if (slots[t] < 0) continue;
        memcpy(kv_cache + slots[t] * row, key + t * k_stride, bytes);
        memcpy(kv_cache + (num_slots + slots[t]) * row, value + t * v_stride, bytes);
    }
    return 0;
}

/* ---- linear: out[M, N] = x[M, K] @ w[N, K].T (+ bias), fp32, K a multiple of 8 ----
 * Every output is one dot product in one order: 8 lanes over k (lane l sums k = l mod 8 by
 * FMAs in k order), then hsum's fixed tree, so a row's outputs are the same whatever the
 * other rows of the call, their count and the thread count (batch-invariant: a token's row
 * is the same in a decode step of one, of many, or in a prefill). One row (decode at batch
 * 1) is bound by reading the weight: each thread streams its own contiguous range of weight
 * rows, TILE_N at a time, asking for the next TILE_N's. 2-8 rows whose activations fit in
 * L1: one pass of each weight row against all of them; more: TILE_N x TILE_M tiles of
 * weight rows by activation rows (from 9 rows ~1.1-1.4x the time of the outer-product
 * tiles this order replaced, SmolLM2's GEMMs at 32-512 rows on a loaded 2-core EPYC). */
enum { TILE_N = 4, TILE_M = 3, ONE_PASS_M = 8, L1_ACT_BYTES = 20 << 10, PREFETCH_FROM_M = 6 };
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
/* GCC's znver3 tuning (what -march=native picks on Zen 3) made the dot-product tiles ~20%
 * slower than its generic tuning (SmolLM2's GEMMs at 32 rows: 94 against 115 GFLOP/s) */
#pragma GCC push_options
#pragma GCC target("tune=generic")
#endif

/* a * b + c, one rounding where the CPU has FMA: GCC contracts a * b + c in most loops but
 * not all, and a sum must not depend on which loop computed it */
INLINE f32x8 fma8(f32x8 a, f32x8 b, f32x8 c) {
#ifdef __FMA__
    return (f32x8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
    return a * b + c;
#endif
}

/* out[m * ldo + r] = x[m] . w[r] for nr weight rows by mt activation rows (both K long);
 * with `prefetch`, the same columns of the next TILE_N weight rows are asked for */
INLINE void dot_tile(const float *x, const float *w, int64_t K, int nr, int mt, float *out,
                     int64_t ldo, int prefetch) {
    f32x8 acc[TILE_N][ONE_PASS_M], xs[ONE_PASS_M];
    _Pragma("GCC unroll 4") for (int r = 0; r < nr; ++r)
        _Pragma("GCC unroll 8") for (int m = 0; m < mt; ++m) acc[r][m] = splat(0.0f);
    for (int64_t k = 0; k < K; k += 8) {
        _Pragma("GCC unroll 8") for (int m = 0; m < mt; ++m) xs[m] = load8(x + m * K + k);
        _Pragma("GCC unroll 4") for (int r = 0; r < nr; ++r) {
            if (prefetch && !(k & 8)) __builtin_prefetch(w + (TILE_N + r) * K + k, 0, 0);
            const f32x8 wv = load8(w + r * K + k);
            _Pragma("GCC unroll 8") for (int m = 0; m < mt; ++m)
                acc[r][m] = fma8(wv, xs[m], acc[r][m]);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < nr; ++r)
        _Pragma("GCC unroll 8") for (int m = 0; m < mt; ++m) out[m * ldo + r] = hsum(acc[r][m]);
}

/* weight rows [n0, n0 + nr) against every activation row: one pass of a 1 x M tile when
 * the activations are few and fit in L1 (prefetching from PREFETCH_FROM_M rows, where the
 * pass is long enough to hide it), else TILE_N x TILE_M tiles, the first of which
 * prefetches the next weight rows */
static void weight_rows(const float *x, int64_t M, const float *w, float *out, int64_t N,
                        int64_t K, int64_t n0, int nr) {
    const float *wr = w + n0 * K;
    float *o = out + n0;
    if (M <= ONE_PASS_M && M * K * (int64_t)sizeof(float) <= L1_ACT_BYTES) {
        const int pf = M >= PREFETCH_FROM_M;
        for (int r = 0; r < nr; ++r)
            switch (M) { /* constant mt: the accumulators stay in registers */
            case 2: dot_tile(x, wr + r * K, K, 1, 2, o + r, N, pf); break;
            case 3: dot_tile(x, wr + r * K, K, 1, 3, o + r, N, pf); break;
            case 4: dot_tile(x, wr + r * K, K, 1, 4, o + r, N, pf); break;
            case 5: dot_tile(x, wr + r * K, K, 1, 5, o + r, N, pf); break;
            case 6: dot_tile(x, wr + r * K, K, 1, 6, o + r, N, pf); break;
            case 7: dot_tile(x, wr + r * K, K, 1, 7, o + r, N, pf); break;
            default: dot_tile(x, wr + r * K, K, 1, 8, o + r, N, pf); break;
            }
        return;
    }
    for (int64_t m0 = 0; m0 < M; m0 += TILE_M) {
        const int mt = M - m0 < TILE_M ? (int)(M - m0) : TILE_M, first = m0 == 0;
        const float *xm = x + m0 * K;
        float *om = o + m0 * N;
        if (nr < TILE_N) { /* the last rows of the weight */
            for (int r = 0; r < nr; ++r)
                for (int m = 0; m < mt; ++m)
                    dot_tile(xm + m * K, wr + r * K, K, 1, 1, om + m * N + r, N, 0);
        } else if (mt == TILE_M) {
            dot_tile(xm, wr, K, TILE_N, TILE_M, om, N, first);
        } else if (mt == 2) {
            dot_tile(xm, wr, K, TILE_N, 2, om, N, first);
        } else {
            dot_tile(xm, wr, K, TILE_N, 1, om, N, first);
        }
    }
}

/* out[M, N] = x[M, K] @ w[N, K].T (+ bias[N]); all contiguous, K a multiple of 8. Threads
 * take contiguous ranges of weight rows (in whole tiles). 0 (it cannot fail). */
int hwplug_linear_f32(const float *x, int64_t M, const float *w, const float *bias, float *out,
                      int64_t N, int64_t K, int nthreads) {
    if (M <= 0) return 0;
    const int64_t units = (N + TILE_N - 1) / TILE_N;
#pragma omp parallel num_threads(nthreads) if (N * K >= 65536)
    {
        int64_t t = 0, threads = 1;
#ifdef _OPENMP
        t = omp_get_thread_num();
        threads = omp_get_num_threads();
#endif
        const int64_t n0 = units * t / threads * TILE_N, end = units * (t + 1) / threads * TILE_N;
        const int64_t n1 = end < N ? end : N;
        if (M == 1) { /* TILE_N weight rows at a time (independent FMA chains) */
            int64_t n = n0;
            for (; n + TILE_N <= n1; n += TILE_N) dot_tile(x, w + n * K, K, TILE_N, 1, out + n, N, 1);
            for (; n < n1; ++n) dot_tile(x, w + n * K, K, 1, 1, out + n, N, 0);
        } else {
            for (int64_t n = n0; n < n1; n += TILE_N)
                weight_rows(x, M, w, out, N, K, n, n1 - n < TILE_N ? (int)(n1 - n) : TILE_N);
        }
        if (bias)
            for (int64_t m = 0; m < M; ++m)
                for (int64_t n = n0; n < n1; ++n) out[m * N + n] += bias[n];
    }
    return 0;
}
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
