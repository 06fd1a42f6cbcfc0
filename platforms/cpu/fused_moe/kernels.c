/* hwplug's mixture-of-experts CPU kernels: each op is ONE C call, so no routing is read back
 * into Python and a decode step of a MoE model can be replayed as a step graph.
 *
 * hwplug_moe_topk_softmax: router logits [T, E] fp32 -> the top k softmax scores per token
 *   (descending; the lower expert index first on equal scores), renormalised on request,
 *   times a scaling factor; ids int64.
 * hwplug_moe_experts_f32: fp32 experts w13 [E, 2I, H] / w2 [E, H, I]: the T * k (token,
 *   slot) pairs grouped by expert (counting sort), each active expert's weight rows read
 *   once for all of its pairs (OpenMP over the (active expert, output row) pairs), the gated
 *   activation, the down rows likewise, then each token's k rows summed in slot order.
 *   Experts no token chose cost nothing. Every output is a dot product in one fixed order
 *   and each token's sum runs over its own slots only, so a token's output does not depend
 *   on the other tokens of the call (batch invariance).
 * hwplug_moe_experts_ggml: the same over GGUF block stacks, the rows of each active expert
 *   gathered into one run and multiplied by the ggml library's hwplug_ggml_linear (passed
 *   as a function pointer): one call for gate and up, one for down.
 * Status: 0, or -1 for an expert id outside [0, E), -2 when out of memory, -3 when
 * hwplug_ggml_linear refused a call (a type or activation width it does not serve).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC optimize("fp-contract=fast") /* a * b + c as one FMA where the CPU has it */

typedef float f32x8 __attribute__((vector_size(32)));
static inline f32x8 load8(const float *p) { f32x8 v; memcpy(&v, p, sizeof v); return v; }

/* sum_i a[i] * b[i], in one order for every call of the same K */
static inline float dot(const float *a, const float *b, int64_t K) {
    f32x8 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    int64_t i = 0;
    for (; i + 32 <= K; i += 32) {
        s0 += load8(a + i) * load8(b + i);
        s1 += load8(a + i + 8) * load8(b + i + 8);
        s2 += load8(a + i + 16) * load8(b + i + 16);
        s3 += load8(a + i + 24) * load8(b + i + 24);
    }
    for (; i + 8 <= K; i += 8) s0 += load8(a + i) * load8(b + i);
    f32x8 s = (s0 + s1) + (s2 + s3);
    float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < K; ++i) r += a[i] * b[i];
    return r;
}

/* ---- moe_topk ---- */
int hwplug_moe_topk_softmax(const float *logits, int64_t ld, int64_t T, int64_t E, int64_t k,
                            int renormalize, float scale, float *weights, int64_t *ids,
                            int nthreads) {
    int status = 0;
#pragma omp parallel for num_threads(nthreads) if (T >= 16)
    for (int64_t t = 0; t < T; ++t) {
        const float *l = logits + t * ld;
        float *score = malloc(sizeof(float) * (size_t)E);
        if (!score) { status = -2; continue; }
        float top = l[0], sum = 0.0f;
        for (int64_t e = 1; e < E; ++e) top = l[e] > top ? l[e] : top;
        for (int64_t e = 0; e < E; ++e) sum += score[e] = expf(l[e] - top);
        for (int64_t e = 0; e < E; ++e) score[e] /= sum;
        float chosen = 0.0f;
        for (int64_t j = 0; j < k; ++j) {
            int64_t best = -1;
            for (int64_t e = 0; e < E; ++e)
                if (score[e] >= 0.0f && (best < 0 || score[e] > score[best])) best = e;
            ids[t * k + j] = best;
            weights[t * k + j] = score[best];
            chosen += score[best];
            score[best] = -1.0f; /* taken */
        }
        for (int64_t j = 0; j < k; ++j)
            weights[t * k + j] = (renormalize ? weights[t * k + j] / chosen
                                              : weights[t * k + j]) * scale;
        free(score);
    }
    return status;
}

/* ---- grouping (token, slot) pairs by expert ---- */
typedef struct {
    int64_t *order;   /* [P]: the pairs (t * k + j), by expert, in pair order within one */
    int64_t *start;   /* [E + 1]: expert e's pairs are order[start[e] .. start[e + 1]) */
    int64_t *active;  /* [A]: the experts with pairs, ascending */
    int64_t *where;   /* [P]: pair -> its position in order */
    int64_t A;
} groups_t;

static void groups_free(groups_t *g) { free(g->order); free(g->start); free(g->active); free(g->where); }

static int group_pairs(const int64_t *ids, int64_t P, int64_t E, groups_t *g) {
    g->order = malloc(sizeof(int64_t) * (size_t)P);
    g->where = malloc(sizeof(int64_t) * (size_t)P);
    g->start = calloc((size_t)E + 1, sizeof(int64_t));
    g->active = malloc(sizeof(int64_t) * (size_t)(P < E ? P : E));
    g->A = 0;
    if (!g->order || !g->where || !g->start || !g->active) return -2;
    for (int64_t p = 0; p < P; ++p) {
        if (ids[p] < 0 || ids[p] >= E) return -1;
        ++g->start[ids[p] + 1];
    }
    for (int64_t e = 0; e < E; ++e) {
        if (g->start[e + 1]) g->active[g->A++] = e;
        g->start[e + 1] += g->start[e];
    }
    int64_t *fill = malloc(sizeof(int64_t) * (size_t)E);
    if (!fill) return -2;
    memcpy(fill, g->start, sizeof(int64_t) * (size_t)E);
    for (int64_t p = 0; p < P; ++p) {
        g->where[p] = fill[ids[p]];
        g->order[fill[ids[p]]++] = p;
    }
    free(fill);
    return 0;
}

static inline float gated(float gate, float up, int gelu) {
    return (gelu ? 0.5f * gate * (1.0f + erff(gate * 0.70710678118654752f))
                 : gate / (1.0f + expf(-gate))) * up;
}

/* out[t] = sum_j weights[t, j] * rows[where[t * k + j]] (rows [P, H]), slot order */
static void weighted_sum(const float *rows, const int64_t *where, const float *weights,
                         int64_t T, int64_t k, int64_t H, float *out) {
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
        float *o = out + t * H;
        for (int64_t h = 0; h < H; ++h) o[h] = 0.0f;
        for (int64_t j = 0; j < k; ++j) {
            const float *r = rows + where[t * k + j] * H, w = weights[t * k + j];
            for (int64_t h = 0; h < H; ++h) o[h] += w * r[h];
        }
    }
}

/* ---- fp32 experts ---- */
int hwplug_moe_experts_f32(const float *x, int64_t T, int64_t H, const float *w13,
                           const float *w2, int64_t E, int64_t I, const float *weights,
                           const int64_t *ids, int64_t k, int gelu, float *out, float *up,
                           float *act, float *down, int nthreads) {
    /* up [P, 2I], act [P, I], down [P, H]: scratch, rows in the grouped order */
    const int64_t P = T * k;
    groups_t g;
    int status = group_pairs(ids, P, E, &g);
    if (status == 0) {
#pragma omp parallel num_threads(nthreads)
        {
#pragma omp for schedule(static)
            for (int64_t i = 0; i < g.A * 2 * I; ++i) {
                const int64_t e = g.active[i / (2 * I)], n = i % (2 * I);
                const float *w = w13 + (e * 2 * I + n) * H;
                for (int64_t q = g.start[e]; q < g.start[e + 1]; ++q)
                    up[q * 2 * I + n] = dot(w, x + g.order[q] / k * H, H);
            }
#pragma omp for schedule(static)
            for (int64_t q = 0; q < P; ++q)
                for (int64_t n = 0; n < I; ++n)
                    act[q * I + n] = gated(up[q * 2 * I + n], up[q * 2 * I + I + n], gelu);
#pragma omp for schedule(static)
            for (int64_t i = 0; i < g.A * H; ++i) {
                const int64_t e = g.active[i / H], n = i % H;
                const float *w = w2 + (e * H + n) * I;
                for (int64_t q = g.start[e]; q < g.start[e + 1]; ++q)
                    down[q * H + n] = dot(w, act + q * I, I);
            }
            weighted_sum(down, g.where, weights, T, k, H, out);
        }
    }
    groups_free(&g);
    return status;
}

/* ---- GGUF experts ---- */
typedef int (*ggml_linear_t)(int type, const uint8_t *w, int64_t row_bytes, int64_t N, int64_t K,
                             const float *x, int64_t M, float *out, int64_t ldo,
                             const float *bias, int act_bits, int nthreads);

int hwplug_moe_experts_ggml(void *linear_fn, const float *x, int64_t T, int64_t H,
                            const uint8_t *w13, int type13, int64_t bytes13, int bits13,
                            const uint8_t *w2, int type2, int64_t bytes2, int bits2, int64_t E,
                            int64_t I, const float *weights, const int64_t *ids, int64_t k,
                            int gelu, float *out, float *rows, float *up, float *act,
                            float *down, int nthreads) {
    /* rows [P, H], up [P, 2I], act [P, I], down [P, H]: scratch in the grouped order */
    ggml_linear_t linear = (ggml_linear_t)linear_fn;
    const int64_t P = T * k;
    groups_t g;
    int status = group_pairs(ids, P, E, &g);
    if (status == 0) {
        for (int64_t q = 0; q < P; ++q)
            memcpy(rows + q * H, x + g.order[q] / k * H, sizeof(float) * (size_t)H);
        for (int64_t a = 0; a < g.A && status == 0; ++a) {
            const int64_t e = g.active[a], s = g.start[e], n = g.start[e + 1] - s;
            status = linear(type13, w13 + e * 2 * I * bytes13, bytes13, 2 * I, H, rows + s * H,
                            n, up + s * 2 * I, 2 * I, NULL, bits13, nthreads) ? -3 : 0;
        }
        for (int64_t q = 0; q < P && status == 0; ++q)
            for (int64_t n = 0; n < I; ++n)
                act[q * I + n] = gated(up[q * 2 * I + n], up[q * 2 * I + I + n], gelu);
        for (int64_t a = 0; a < g.A && status == 0; ++a) {
            const int64_t e = g.active[a], s = g.start[e], n = g.start[e + 1] - s;
            status = linear(type2, w2 + e * H * bytes2, bytes2, H, I, act + s * I, n,
                            down + s * H, H, NULL, bits2, nthreads) ? -3 : 0;
        }
        if (status == 0) {
#pragma omp parallel num_threads(nthreads)
            weighted_sum(down, g.where, weights, T, k, H, out);
        }
    }
    groups_free(&g);
    return status;
}
