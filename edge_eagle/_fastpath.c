/* edge-eagle's native fast path: the speculative loop's per-cycle work in C. One call drafts a
 * greedy chain (the drafter's encoder and decoder batches, host norms, argmax over the draft
 * vocabulary) or runs a whole greedy cycle (that chain, the target's verify batch, greedy
 * verification, the KV cut and the accepted rows' captured features); the Python loop around it
 * keeps the policy, the stats and everything that is not a greedy chain.
 *
 * It links against nothing: the llama.cpp entry points come in as function pointers (ee_api,
 * filled from llama-cpp-python's own ctypes symbols by edge_eagle/_fast.py), so it builds with
 * any C99 compiler and never pins a llama.cpp library path. The math is the Python path's,
 * operation for operation (RMSNorm: a double sum of squares, then float32 scale, x * scale * w,
 * as ggml does), so both paths draft the same tokens; tests/test_fastpath.py checks that.
 *
 * It is built as an optional extension module (setup.py) and loaded with ctypes. With
 * EE_WITH_PYTHON (setup.py defines it) the chain and the cycle (on an ee_session) are also
 * CPython functions, `propose` and `cycle`, imported: a ctypes call and its conversions cost
 * more, with the caches that llama.cpp's kernels leave behind, than the rest of the cycle's host
 * work. Without Python's headers, ee_propose and ee_cycle through ctypes do the same
 * (edge_eagle/_fast.py picks).
 */

#ifdef EE_WITH_PYTHON
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#endif

#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 199309L /* clock_gettime under -std=c99 */
#endif
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(_WIN32)
#include <windows.h>
#else
#include <time.h>
#endif

#if defined(_WIN32)
#define EE_API __declspec(dllexport)
#else
#define EE_API __attribute__((visibility("default")))
#endif

#define EE_ABI_VERSION 5

struct llama_embd { /* include/llama.h of llama.cpp as vendored by llama-cpp-python 0.3.36 */
    const float *data;
    size_t n_rows;
    size_t n_embd;
};

struct llama_batch { /* the classic batch the target decodes (include/llama.h) */
    int32_t n_tokens;
    int32_t *token;
    float *embd;
    int32_t *pos;
    int32_t *n_seq_id;
    int32_t **seq_id;
    int8_t *logits;
};

typedef struct {
    void (*batch_clear)(void *batch);
    int32_t (*batch_add_token)(void *batch, int32_t seq_id, int32_t token);
    int32_t (*batch_add_embd)(void *batch, int32_t seq_id, struct llama_embd embd);
    bool (*batch_set_embd_token)(void *batch, int32_t idx, struct llama_embd embd);
    bool (*batch_set_output_logits)(void *batch, int32_t idx, bool value);
    bool (*batch_set_pos)(void *batch, int32_t idx, const int32_t *pos);
    int32_t (*process)(void *ctx, int32_t type, void *batch);
    float *(*get_logits_ith)(void *ctx, int32_t i);
    float *(*get_embd_nextn)(void *ctx);
    float *(*get_embd_nextn_ith)(void *ctx, int32_t i);
    int32_t (*decode)(void *ctx, struct llama_batch batch); /* the target's entry points (ee_cycle) */
    float *(*get_logits)(void *ctx);
    float *(*get_layer_inp)(void *ctx, uint32_t il);
    bool (*memory_seq_rm)(void *mem, int32_t seq_id, int32_t p0, int32_t p1);
    void (*memory_clear)(void *mem, bool data);
    int32_t encode_type;
    int32_t decode_type;
    int32_t timing;   /* when set, native_s accumulates the seconds spent inside llama.cpp calls */
    double native_s;  /* (scripts/bench_overhead.py counts them as native, the rest as host overhead) */
} ee_api;

static double now_s(void) {
#if defined(_WIN32)
    LARGE_INTEGER f, c;
    QueryPerformanceFrequency(&f);
    QueryPerformanceCounter(&c);
    return (double)c.QuadPart / (double)f.QuadPart;
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
#endif
}

/* NATIVE(api, statement): run a statement that calls into llama.cpp (a compute call, an output
 * getter, which synchronises with the backend, or a KV edit), adding its seconds to
 * api->native_s when api->timing is set */
#define NATIVE(api, statement)                                 \
    do {                                                       \
        const double native_t0_ = (api)->timing ? now_s() : 0.0; \
        statement;                                             \
        if ((api)->timing) (api)->native_s += now_s() - native_t0_; \
    } while (0)

/* llama_process, timed when api->timing is set */
static int32_t process(ee_api *api, void *ctx, int32_t type, void *batch) {
    int32_t rc;
    NATIVE(api, rc = api->process(ctx, type, batch));
    return rc;
}

/* an output getter, timed when api->timing is set */
static const float *get_ith(ee_api *api, float *(*fn)(void *, int32_t), void *ctx, int32_t i) {
    const float *p;
    NATIVE(api, p = fn(ctx, i));
    return p;
}

EE_API int32_t ee_abi_version(void) { return EE_ABI_VERSION; }


/* RMSNorm of one row like ggml's CPU kernel: sum of squares in double (each float product is
 * exact in double), mean and scale in float, then (x * scale) * w. */
static void rms_norm_row(const float *x, const float *w, int32_t n, float eps, float *out) {
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) sum += (double)x[i] * (double)x[i];
    const float mean = (float)(sum / (double)n);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int32_t i = 0; i < n; i++) out[i] = (x[i] * scale) * w[i];
}

EE_API void ee_rms_norm(const float *x, const float *w, int32_t rows, int32_t n, float eps, float *out) {
    for (int32_t r = 0; r < rows; r++) rms_norm_row(x + (size_t)r * n, w, n, eps, out + (size_t)r * n);
}

/* numpy's argmax of a row, scalar: the first maximum, NaN counting as the maximum. */
static int32_t argmax_scalar(const float *row, int32_t n) {
    int32_t best = 0;
    float bv = -INFINITY;
    bool seen = false;
    for (int32_t i = 0; i < n; i++) {
        const float v = row[i];
        if (v != v) return i;
        if (!seen || v > bv) { bv = v; best = i; seen = true; }
    }
    return best;
}

#if defined(__GNUC__) || defined(__clang__)
/* The same with GCC/Clang vector extensions (SSE2 or NEON at W = 4, AVX2 at W = 8): per lane the
 * running maximum and the index of its first occurrence (a strict >, so earlier wins within a
 * lane); lanes are merged by value, then lowest index. A row with a NaN goes to the scalar
 * version, which answers the first NaN as numpy does. About 5 us for 49k floats with AVX2. */
#define EE_ARGMAX_VEC(NAME, W, ATTR)                                                                  \
    typedef float NAME##_vf __attribute__((vector_size(4 * W)));                                     \
    typedef int32_t NAME##_vi __attribute__((vector_size(4 * W)));                                   \
    ATTR static int32_t NAME(const float *row, int32_t n) {                                          \
        NAME##_vf m;                                                                                 \
        NAME##_vi idx, cur, nan;                                                                     \
        for (int l = 0; l < W; l++) { m[l] = -INFINITY; idx[l] = 0; cur[l] = l; nan[l] = 0; }        \
        int32_t i = 0;                                                                               \
        for (; i + W <= n; i += W) {                                                                 \
            NAME##_vf a;                                                                             \
            memcpy(&a, row + i, sizeof a);                                                           \
            const NAME##_vi gt = a > m;                                                              \
            m = (NAME##_vf)(((NAME##_vi)a & gt) | ((NAME##_vi)m & ~gt));                             \
            idx = (cur & gt) | (idx & ~gt);                                                          \
            nan |= a != a;                                                                           \
            cur += W;                                                                                \
        }                                                                                            \
        int32_t any_nan = 0;                                                                         \
        for (int l = 0; l < W; l++) any_nan |= nan[l];                                               \
        for (int32_t j = i; j < n; j++) any_nan |= row[j] != row[j];                                 \
        if (any_nan) return argmax_scalar(row, n);                                                   \
        float bv = -INFINITY;                                                                        \
        int32_t best = -1;                                                                           \
        for (int l = 0; l < W; l++)                                                                  \
            if (m[l] > bv || (m[l] == bv && best >= 0 && idx[l] < best)) { bv = m[l]; best = idx[l]; } \
        for (int32_t j = i; j < n; j++)                                                              \
            if (row[j] > bv) { bv = row[j]; best = j; }                                              \
        return best < 0 ? 0 : best; /* every entry -inf: numpy answers the first */                 \
    }
EE_ARGMAX_VEC(argmax_vec4, 4, )
#if defined(__x86_64__) || defined(__i386__)
EE_ARGMAX_VEC(argmax_vec8_avx2, 8, __attribute__((target("avx2"))))
#endif
#endif

static int32_t (*argmax_impl)(const float *, int32_t) = NULL;

static void choose_impls(void);

/* argmax over a whole row, by the fastest version this CPU runs */
static int32_t argmax_full(const float *row, int32_t n) {
    if (!argmax_impl) choose_impls();
    return argmax_impl(row, n);
}

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
/* argmax_row over a draft vocabulary with AVX2 gathers: per lane the maximum and its target id (ids
 * ascend, so a strict > keeps the first); lanes merge by value, then lowest id. About 3.5 us for
 * 8k ids in a 49k row that llama.cpp just wrote, against 6 us scalar. NaN: the scalar version. */
__attribute__((target("avx2"))) static int32_t argmax_ids_avx2(const float *row, const int32_t *ids, int32_t n_ids) {
    __m256 m = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps();
    __m256i idx = _mm256_setzero_si256();
    int32_t j = 0;
    for (; j + 8 <= n_ids; j += 8) {
        const __m256i ix = _mm256_loadu_si256((const __m256i *)(ids + j));
        const __m256 a = _mm256_i32gather_ps(row, ix, 4);
        const __m256 gt = _mm256_cmp_ps(a, m, _CMP_GT_OQ);
        m = _mm256_blendv_ps(m, a, gt);
        idx = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(idx), _mm256_castsi256_ps(ix), gt));
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    }
    float mv[8];
    int32_t iv[8];
    _mm256_storeu_ps(mv, m);
    _mm256_storeu_si256((__m256i *)iv, idx);
    int any_nan = _mm256_movemask_ps(nan);
    for (int32_t t = j; t < n_ids; t++) any_nan |= row[ids[t]] != row[ids[t]];
    if (any_nan) return -1;
    float bv = -INFINITY;
    int32_t best = -1;
    for (int l = 0; l < 8; l++)
        if (mv[l] > bv || (mv[l] == bv && best >= 0 && iv[l] < best)) { bv = mv[l]; best = iv[l]; }
    for (; j < n_ids; j++)
        if (row[ids[j]] > bv) { bv = row[ids[j]]; best = ids[j]; }
    return best < 0 ? 0 : best; /* every entry -inf: numpy answers the row's first */
}
#endif

static int32_t argmax_ids_scalar(const float *row, const int32_t *ids, int32_t n_ids) {
    int32_t best = 0;
    float bv = -INFINITY;
    bool seen = false;
    for (int32_t j = 0; j < n_ids; j++) {
        const int32_t i = ids[j];
        const float v = row[i];
        if (v != v) return i;
        if (!seen || v > bv) { bv = v; best = i; seen = true; }
    }
    return bv == -INFINITY ? 0 : best; /* a row of -inf only: numpy answers its first entry */
}

/* the draft vocabulary's argmax (NULL until argmax_full chooses: the scalar loop) */
static int32_t (*argmax_ids_impl)(const float *, const int32_t *, int32_t) = NULL;

/* numpy's argmax of a logit row: the first maximum, NaN counting as the maximum. With ids (the
 * drafter's draft vocabulary, ascending; every other entry is -inf) only those are read. */
static int32_t argmax_row(const float *row, const int32_t *ids, int32_t n_ids, int32_t n_vocab) {
    if (!ids) return argmax_full(row, n_vocab);
    if (!argmax_impl) choose_impls();
    if (argmax_ids_impl) {
        const int32_t i = argmax_ids_impl(row, ids, n_ids);
        if (i >= 0) return i;
    }
    return argmax_ids_scalar(row, ids, n_ids);
}

/* the fastest versions this CPU runs */
static void choose_impls(void) {
    argmax_impl = argmax_scalar;
    argmax_ids_impl = NULL;
#if defined(__GNUC__) || defined(__clang__)
    argmax_impl = argmax_vec4;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) {
        argmax_impl = argmax_vec8_avx2;
        argmax_ids_impl = argmax_ids_avx2;
    }
#endif
#endif
}

/* Which argmax runs, after choosing again: 1 scalar, 4 or 8 lanes (8: AVX2, with gathers over a
 * draft vocabulary); force = 1 or 4 picks that one instead (the tests check each against numpy). */
EE_API int32_t ee_argmax_lanes(int32_t force) {
    choose_impls();
    if (force == 1 || force == 4) argmax_ids_impl = NULL;
    if (force == 1) argmax_impl = argmax_scalar;
#if defined(__GNUC__) || defined(__clang__)
    if (force == 4) argmax_impl = argmax_vec4;
    if (argmax_impl == argmax_vec4) return 4;
#endif
    return argmax_impl == argmax_scalar ? 1 : 8;
}

/* argmax of each row (over ids, ascending, when given: the draft vocabulary) */
EE_API void ee_argmax_rows(const float *logits, int32_t rows, int32_t n_vocab, const int32_t *ids, int32_t n_ids,
                           int32_t *out) {
    for (int32_t r = 0; r < rows; r++) out[r] = argmax_row(logits + (size_t)r * n_vocab, ids, n_ids, n_vocab);
}

/* The probability of the most probable token, 1 / sum(exp(l - max)) over the finite entries. */
static double top_prob(const float *row, const int32_t *ids, int32_t n_ids, int32_t n_vocab) {
    float m = -INFINITY;
    const int32_t n = ids ? n_ids : n_vocab;
    for (int32_t j = 0; j < n; j++) {
        const float v = row[ids ? ids[j] : j];
        if (v > m) m = v;
    }
    double s = 0.0;
    for (int32_t j = 0; j < n; j++) {
        const float z = row[ids ? ids[j] : j] - m;
        if (isfinite(z)) s += exp((double)z);
    }
    return s > 0.0 ? 1.0 / s : 0.0;
}

/* One drafter decoder batch: row i is (tokens[i], g[i]) at positions[i] in sequence seqs[i]
 * (NULL: sequence 0), every row an output when outputs is set. Returns llama_process's code. */
EE_API int32_t ee_decode_rows(ee_api *api, void *ctx, void *batch, const int32_t *tokens, const float *g,
                              const int32_t *positions, const int32_t *seqs, int32_t n, int32_t n_embd,
                              int32_t outputs) {
    api->batch_clear(batch);
    for (int32_t i = 0; i < n; i++) {
        const int32_t idx = api->batch_add_token(batch, seqs ? seqs[i] : 0, tokens[i]);
        if (idx < 0) return -100 + idx;
        api->batch_set_pos(batch, idx, &positions[i]);
        const struct llama_embd e = {g + (size_t)i * n_embd, 1, (size_t)n_embd};
        api->batch_set_embd_token(batch, idx, e);
        if (outputs) api->batch_set_output_logits(batch, idx, true);
    }
    return process(api, ctx, api->decode_type, batch);
}

/* The drafter's encoder (fc) over n feature rows of width floats, n_batch rows per call; with
 * fc_norm_w (3 weights of width / 3) each third of a row is RMS-normed first, into scratch.
 * g rows go to out [n, n_embd]. Each chunk's positions restart at pos0 (they must continue
 * the drafter's memory, which the encoder does not change). Returns 0 or llama_process's code. */
EE_API int32_t ee_encode(ee_api *api, void *ctx, void *batch, const float *feats, int32_t n, int32_t width,
                         int32_t pos0, const float *fc_norm_w, float eps, float *scratch, int32_t n_batch,
                         float *out, int32_t n_embd) {
    const float *src = feats;
    if (fc_norm_w) {
        const int32_t h = width / 3;
        for (int32_t r = 0; r < n; r++)
            for (int32_t l = 0; l < 3; l++)
                rms_norm_row(feats + (size_t)r * width + (size_t)l * h, fc_norm_w + (size_t)l * h, h, eps,
                             scratch + (size_t)r * width + (size_t)l * h);
        src = scratch;
    }
    for (int32_t lo = 0; lo < n; lo += n_batch) {
        const int32_t hi = lo + n_batch < n ? lo + n_batch : n;
        api->batch_clear(batch);
        for (int32_t i = lo; i < hi; i++) {
            const struct llama_embd e = {src + (size_t)i * width, 1, (size_t)width};
            const int32_t idx = api->batch_add_embd(batch, 0, e);
            if (idx < 0) return -100 + idx;
            const int32_t pos = pos0 + i - lo;
            api->batch_set_pos(batch, idx, &pos);
            api->batch_set_output_logits(batch, idx, true);
        }
        const int32_t rc = process(api, ctx, api->encode_type, batch);
        if (rc != 0) return rc;
        const float *g;
        NATIVE(api, g = api->get_embd_nextn(ctx));
        if (!g) return -200;
        memcpy(out + (size_t)lo * n_embd, g, sizeof(float) * (size_t)(hi - lo) * n_embd);
    }
    return 0;
}

/* The target, for a cycle: its context, classic batch (every row in sequence 0), KV memory,
 * vocabulary and the captured layers (llama_get_embeddings_layer_inp). */
typedef struct {
    void *ctx;
    struct llama_batch *batch;
    void *mem;
    int32_t n_vocab;
    int32_t n_embd;
    int32_t n_layers;
    uint32_t layers[3];
} ee_target;

/* A drafter's state for proposals and cycles, filled by edge_eagle/_fast.py (Session mirrors it)
 * with the drafter's buffers: the pending rows' features (feats, feats_rows rows of width floats)
 * and their tokens (tokens; rows rows, as g and scratch), the drafter's context, batch and KV
 * memory, its norms and draft vocabulary (ids ascending, or NULL: the whole vocabulary), the
 * chain's buffers (gbuf: n_embd floats; drafts_cap drafts) and, for cycles, the target. */
typedef struct {
    ee_api *api;
    void *ctx;
    void *batch;
    void *mem;
    float *feats;
    int32_t feats_rows;
    int32_t width;
    const float *fc_norm_w;
    float eps;
    float *scratch;
    int32_t n_batch;
    float *g;
    int32_t *tokens;
    int32_t rows;
    int32_t all_outputs_max;
    const int32_t *ids;
    int32_t n_ids;
    int32_t n_vocab;
    int32_t n_embd;
    const float *out_norm_w;
    float *gbuf;
    int32_t *drafts;
    int32_t drafts_cap;
    ee_target target;
} ee_session;

/* A greedy draft chain of up to k tokens from the drafter's last decoded row (logits, pre-norm h),
 * which sits at position pos: each step drafts the argmax (over the draft vocabulary), stops early
 * when p_min > 0 and the top probability is below it, and otherwise decodes (draft, carry(h)) at
 * the next position, where carry is norm(h) with out_norm_w (EAGLE-3.1) and h itself without.
 * Returns the number of drafts written to s->drafts, or a negative code (-1000 - llama_process's
 * code) when a decode fails. */
static int32_t chain(ee_session *s, const float *logits, const float *h, int32_t pos, int32_t k, float p_min) {
    ee_api *api = s->api;
    int32_t n = 0;
    while (k > 0) {
        if (p_min > 0.0f && top_prob(logits, s->ids, s->n_ids, s->n_vocab) < (double)p_min) break;
        const int32_t d = argmax_row(logits, s->ids, s->n_ids, s->n_vocab);
        s->drafts[n++] = d;
        if (n == k) break;
        pos += 1;
        if (s->out_norm_w) rms_norm_row(h, s->out_norm_w, s->n_embd, s->eps, s->gbuf);
        else memcpy(s->gbuf, h, sizeof(float) * (size_t)s->n_embd);
        const int32_t rc = ee_decode_rows(api, s->ctx, s->batch, &d, s->gbuf, &pos, NULL, 1, s->n_embd, 1);
        if (rc != 0) return -1000 - (rc < 0 ? -rc : rc);
        logits = get_ith(api, api->get_logits_ith, s->ctx, 0);
        h = get_ith(api, api->get_embd_nextn_ith, s->ctx, 0);
        if (!logits || !h) return -2000;
    }
    return n;
}

/* One drafting step of the loop: the drafter's KV cut back to pos0 (the last proposal's chain
 * rows; or cleared), the n pending true rows (s->feats at pos0.., their next tokens s->tokens)
 * through the encoder into s->g (s->scratch: fc_norm rows), then through the decoder (up to
 * all_outputs_max rows in one batch with every row an output, since the eagle3 graph copies its
 * first n_outputs rows; longer: n_batch chunks without outputs, then the last row alone), then
 * the chain from the last row. Returns the number of drafts, or a negative code. */
static int32_t propose(ee_session *s, int32_t n, int32_t pos0, int32_t k, float p_min, int32_t clear_kv) {
    ee_api *api = s->api;
    if (clear_kv) NATIVE(api, api->memory_clear(s->mem, true));
    else NATIVE(api, api->memory_seq_rm(s->mem, 0, pos0, -1));
    int32_t rc = ee_encode(api, s->ctx, s->batch, s->feats, n, s->width, pos0, s->fc_norm_w, s->eps, s->scratch,
                           s->n_batch, s->g, s->n_embd);
    if (rc != 0) return -3000 - (rc < 0 ? -rc : rc);
    const size_t e = (size_t)s->n_embd;
    int32_t last;
    int32_t pos[512];
    if (n <= s->all_outputs_max && n <= 512) {
        for (int32_t i = 0; i < n; i++) pos[i] = pos0 + i;
        rc = ee_decode_rows(api, s->ctx, s->batch, s->tokens, s->g, pos, NULL, n, s->n_embd, 1);
        last = n - 1;
    } else {
        const int32_t step = s->n_batch < 512 ? s->n_batch : 512;
        for (int32_t lo = 0; lo < n - 1 && rc == 0; lo += step) {
            const int32_t hi = lo + step < n - 1 ? lo + step : n - 1;
            for (int32_t i = lo; i < hi; i++) pos[i - lo] = pos0 + i;
            rc = ee_decode_rows(api, s->ctx, s->batch, s->tokens + lo, s->g + (size_t)lo * e, pos, NULL, hi - lo,
                                s->n_embd, 0);
        }
        if (rc == 0) {
            pos[0] = pos0 + n - 1;
            rc = ee_decode_rows(api, s->ctx, s->batch, s->tokens + n - 1, s->g + (size_t)(n - 1) * e, pos, NULL, 1,
                                s->n_embd, 1);
        }
        last = 0;
    }
    if (rc != 0) return -1000 - (rc < 0 ? -rc : rc);
    const float *logits = get_ith(api, api->get_logits_ith, s->ctx, last);
    const float *h = get_ith(api, api->get_embd_nextn_ith, s->ctx, last);
    if (!logits || !h) return -2000;
    return chain(s, logits, h, pos0 + n - 1, k, p_min);
}

/* A whole greedy cycle of the loop: propose()'s chain of up to k drafts, then the target's verify
 * batch (last, drafts...) at n_past = pos0 + n, greedy verification (accept while a draft equals
 * the target's argmax; the first mismatch, or the row after the last draft, gives the bonus
 * token), the target's KV cut back to what was accepted, and the accepted rows' captured
 * features written to s->feats rows 0..acc (the next cycle's pending rows).
 * out: drafts, accepted, bonus; secs: seconds drafting, verifying and copying features.
 * Returns 0, or a negative code (propose()'s, or -4000 - llama_decode's, or -5000 when an
 * output is missing). */
static int32_t cycle(ee_session *s, int32_t n, int32_t pos0, int32_t k, float p_min, int32_t last, int32_t clear_kv,
                     int32_t *out, double *secs) {
    ee_api *api = s->api;
    const double t0 = now_s();
    const int32_t got = propose(s, n, pos0, k, p_min, clear_kv);
    if (got < 0) return got;
    const double t1 = now_s();
    const ee_target *t = &s->target;
    const int32_t n_past = pos0 + n; /* the last committed token's position (the pending rows end before it) */
    struct llama_batch *b = t->batch;
    for (int32_t i = 0; i <= got; i++) {
        b->token[i] = i ? s->drafts[i - 1] : last;
        b->pos[i] = n_past + i;
        b->logits[i] = 1;
    }
    b->n_tokens = got + 1;
    int32_t rc;
    const float *logits;
    NATIVE(api, rc = api->decode(t->ctx, *b); logits = rc == 0 ? api->get_logits(t->ctx) : NULL);
    if (rc != 0) return -4000 - (rc < 0 ? -rc : rc);
    if (!logits) return -5000;
    int32_t acc = 0, bonus;
    for (;;) {
        bonus = argmax_full(logits + (size_t)acc * t->n_vocab, t->n_vocab);
        if (acc == got || bonus != s->drafts[acc]) break;
        acc++;
    }
    if (acc < got) NATIVE(api, api->memory_seq_rm(t->mem, 0, n_past + acc + 1, -1));
    const double t2 = now_s();
    for (int32_t l = 0; l < t->n_layers; l++) {
        const float *src;
        NATIVE(api, src = api->get_layer_inp(t->ctx, t->layers[l]));
        if (!src) return -5000;
        for (int32_t r = 0; r <= acc; r++)
            memcpy(s->feats + (size_t)r * s->width + (size_t)l * t->n_embd, src + (size_t)r * t->n_embd,
                   sizeof(float) * (size_t)t->n_embd);
    }
    out[0] = got;
    out[1] = acc;
    out[2] = bonus;
    secs[0] = t1 - t0;
    secs[1] = t2 - t1;
    secs[2] = now_s() - t2;
    return 0;
}

/* The layouts Python mirrors with ctypes (edge_eagle/_fast.py checks them when it loads this
 * library): each struct's size and its fields' names and offsets. The llama.h structs are
 * checked against llama-cpp-python's own mirrors of them. One X-macro list per struct. */
#define EE_FIELDS_API(X)                                                                                          \
    X(ee_api, batch_clear) X(ee_api, batch_add_token) X(ee_api, batch_add_embd) X(ee_api, batch_set_embd_token)  \
    X(ee_api, batch_set_output_logits) X(ee_api, batch_set_pos) X(ee_api, process) X(ee_api, get_logits_ith)    \
    X(ee_api, get_embd_nextn) X(ee_api, get_embd_nextn_ith) X(ee_api, decode) X(ee_api, get_logits)            \
    X(ee_api, get_layer_inp) X(ee_api, memory_seq_rm) X(ee_api, memory_clear) X(ee_api, encode_type)            \
    X(ee_api, decode_type) X(ee_api, timing) X(ee_api, native_s)
#define EE_FIELDS_TARGET(X)                                                                                       \
    X(ee_target, ctx) X(ee_target, batch) X(ee_target, mem) X(ee_target, n_vocab) X(ee_target, n_embd)          \
    X(ee_target, n_layers) X(ee_target, layers)
#define EE_FIELDS_SESSION(X)                                                                                      \
    X(ee_session, api) X(ee_session, ctx) X(ee_session, batch) X(ee_session, mem) X(ee_session, feats)          \
    X(ee_session, feats_rows) X(ee_session, width) X(ee_session, fc_norm_w) X(ee_session, eps)                   \
    X(ee_session, scratch) X(ee_session, n_batch) X(ee_session, g) X(ee_session, tokens) X(ee_session, rows)    \
    X(ee_session, all_outputs_max) X(ee_session, ids) X(ee_session, n_ids) X(ee_session, n_vocab)               \
    X(ee_session, n_embd) X(ee_session, out_norm_w) X(ee_session, gbuf) X(ee_session, drafts)                   \
    X(ee_session, drafts_cap) X(ee_session, target)
#define EE_FIELDS_BATCH(X)                                                                                        \
    X(struct llama_batch, n_tokens) X(struct llama_batch, token) X(struct llama_batch, embd)                     \
    X(struct llama_batch, pos) X(struct llama_batch, n_seq_id) X(struct llama_batch, seq_id)                     \
    X(struct llama_batch, logits)
#define EE_FIELDS_EMBD(X) X(struct llama_embd, data) X(struct llama_embd, n_rows) X(struct llama_embd, n_embd)

#define EE_OFFSET(T, f) (int64_t) offsetof(T, f),
#define EE_NAME(T, f) #f ","
#define EE_LAYOUT(NAME, T, FIELDS)                                                \
    if (strcmp(name, NAME) == 0) {                                                \
        static const int64_t table[] = {(int64_t)sizeof(T), FIELDS(EE_OFFSET)};   \
        *n = (int32_t)(sizeof(table) / sizeof(table[0]));                         \
        *fields = FIELDS(EE_NAME);                                                \
        return table;                                                             \
    }

/* The layout of struct `name` (ee_api, ee_target, ee_session, llama_batch, llama_embd): *n
 * numbers, its size then each field's offset, the fields named in *fields (comma-terminated);
 * NULL for an unknown name. */
EE_API const int64_t *ee_layout(const char *name, int32_t *n, const char **fields) {
    EE_LAYOUT("ee_api", ee_api, EE_FIELDS_API)
    EE_LAYOUT("ee_target", ee_target, EE_FIELDS_TARGET)
    EE_LAYOUT("ee_session", ee_session, EE_FIELDS_SESSION)
    EE_LAYOUT("llama_batch", struct llama_batch, EE_FIELDS_BATCH)
    EE_LAYOUT("llama_embd", struct llama_embd, EE_FIELDS_EMBD)
    *n = 0;
    *fields = "";
    return NULL;
}

/* ctypes' entry points, for builds without Python's headers: the pending rows' tokens are in
 * s->tokens already. ee_propose returns the number of drafts (in s->drafts) or a negative code. */
EE_API int32_t ee_propose(ee_session *s, int32_t n, int32_t pos0, int32_t k, float p_min, int32_t clear_kv) {
    return propose(s, n, pos0, k, p_min, clear_kv);
}

EE_API int32_t ee_cycle(ee_session *s, int32_t n, int32_t pos0, int32_t k, float p_min, int32_t last,
                        int32_t clear_kv, int32_t *out, double *secs) {
    return cycle(s, n, pos0, k, p_min, last, clear_kv, out, secs);
}

#ifdef EE_WITH_PYTHON
/* The arguments both CPython functions take, (session, pending, last, pos0, k, p_min, clear_kv):
 * the session's address, the pending rows' tokens but the last row's (a list of ints), which is
 * `last`, then as for propose(). */
typedef struct {
    ee_session *s;
    int32_t n; /* pending rows, the last one's included */
    int32_t last;
    int32_t pos0;
    int32_t k;
    float p_min;
    int clear_kv;
} call_args;

/* Parse them into a, the tokens into s->tokens; 0, or -1 with an exception set. */
static int parse(PyObject *const *args, Py_ssize_t nargs, call_args *a) {
    if (nargs != 7 || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "expected (session, pending: list, last, pos0, k, p_min, clear_kv)");
        return -1;
    }
    long v;
    double p;
    ee_session *s = (ee_session *)PyLong_AsVoidPtr(args[0]);
    if (!s && PyErr_Occurred()) return -1;
    if ((v = PyLong_AsLong(args[2])) == -1 && PyErr_Occurred()) return -1;
    a->last = (int32_t)v;
    if ((v = PyLong_AsLong(args[3])) == -1 && PyErr_Occurred()) return -1;
    a->pos0 = (int32_t)v;
    if ((v = PyLong_AsLong(args[4])) == -1 && PyErr_Occurred()) return -1;
    const long k = v;
    if ((p = PyFloat_AsDouble(args[5])) == -1.0 && PyErr_Occurred()) return -1;
    a->p_min = (float)p;
    if ((a->clear_kv = PyObject_IsTrue(args[6])) < 0) return -1;
    const Py_ssize_t n_pend = PyList_GET_SIZE(args[1]);
    if (!s || n_pend + 1 > s->rows || n_pend + 1 > s->feats_rows || k < 1 || k > s->drafts_cap ||
        k >= s->feats_rows) {
        PyErr_SetString(PyExc_ValueError, "the session's buffers are too small for these rows or k");
        return -1;
    }
    for (Py_ssize_t i = 0; i < n_pend; i++) { /* the list holds ints: converting them runs no Python code */
        if ((v = PyLong_AsLong(PyList_GET_ITEM(args[1], i))) == -1 && PyErr_Occurred()) return -1;
        s->tokens[i] = (int32_t)v;
    }
    s->tokens[n_pend] = a->last;
    a->s = s;
    a->n = (int32_t)n_pend + 1;
    a->k = (int32_t)k;
    return 0;
}

/* a new list of the first n drafts */
static PyObject *drafts_list(const ee_session *s, int32_t n) {
    PyObject *list = PyList_New(n);
    for (int32_t i = 0; list && i < n; i++) {
        PyObject *v = PyLong_FromLong(s->drafts[i]);
        if (!v) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, v);
    }
    return list;
}

/* propose(session, pending, last, pos0, k, p_min, clear_kv) -> the drafts (a list), or a negative
 * int (an error code). The GIL is released while llama.cpp computes. */
static PyObject *py_propose(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    call_args a;
    if (parse(args, nargs, &a) != 0) return NULL;
    int32_t got;
    Py_BEGIN_ALLOW_THREADS
    got = propose(a.s, a.n, a.pos0, a.k, a.p_min, a.clear_kv);
    Py_END_ALLOW_THREADS
    return got < 0 ? PyLong_FromLong(got) : drafts_list(a.s, got);
}

/* cycle(session, pending, last, pos0, k, p_min, clear_kv) -> (drafted, accepted, bonus, draft_s,
 * verify_s, copy_s), or a negative int (an error code). The GIL is released while llama.cpp
 * computes. */
static PyObject *py_cycle(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    call_args a;
    if (parse(args, nargs, &a) != 0) return NULL;
    int32_t out[3] = {0, 0, 0}, rc;
    double secs[3] = {0.0, 0.0, 0.0};
    Py_BEGIN_ALLOW_THREADS
    rc = cycle(a.s, a.n, a.pos0, a.k, a.p_min, a.last, a.clear_kv, out, secs);
    Py_END_ALLOW_THREADS
    if (rc != 0) return PyLong_FromLong(rc);
    PyObject *accepted = drafts_list(a.s, out[1]);
    return accepted ? Py_BuildValue("(iNiddd)", out[0], accepted, out[2], secs[0], secs[1], secs[2]) : NULL;
}

static PyMethodDef methods[] = {
    {"propose", (PyCFunction)(void (*)(void))py_propose, METH_FASTCALL, "A greedy draft chain (see _fastpath.c)."},
    {"cycle", (PyCFunction)(void (*)(void))py_cycle, METH_FASTCALL, "One greedy speculative cycle (see _fastpath.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastpath", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fastpath(void) { return PyModule_Create(&module); }
#else
EE_API void *PyInit__fastpath(void) { return NULL; } /* not importable: _fast.py uses ee_cycle */
#endif
