/* edge-eagle's native fast path: the drafter's per-row llama.cpp calls, host norms and argmax
 * in C, so a drafting cycle costs a few ctypes calls instead of dozens.
 *
 * It links against nothing: the llama.cpp entry points come in as function pointers (ee_api,
 * filled from llama-cpp-python's own ctypes symbols by edge_eagle/_fast.py), so it builds with
 * any C99 compiler and never pins a llama.cpp library path. The math is the Python path's,
 * operation for operation (RMSNorm: a double sum of squares, then float32 scale, x * scale * w,
 * as ggml does), so both paths draft the same tokens; tests/test_fastpath.py checks that.
 *
 * It is built as an optional extension module (setup.py) but loaded with ctypes, not imported:
 * PyInit__fastpath exists only because some platforms' linkers want that export.
 */

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

#define EE_ABI_VERSION 2

struct llama_embd { /* include/llama.h of llama.cpp as vendored by llama-cpp-python 0.3.36 */
    const float *data;
    size_t n_rows;
    size_t n_embd;
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

/* llama_process, timed when api->timing is set */
static int32_t process(ee_api *api, void *ctx, int32_t type, void *batch) {
    if (!api->timing) return api->process(ctx, type, batch);
    const double t0 = now_s();
    const int32_t rc = api->process(ctx, type, batch);
    api->native_s += now_s() - t0;
    return rc;
}

/* an output getter (it synchronises with the backend), timed when api->timing is set */
static const float *get_ith(ee_api *api, float *(*fn)(void *, int32_t), void *ctx, int32_t i) {
    if (!api->timing) return fn(ctx, i);
    const double t0 = now_s();
    const float *p = fn(ctx, i);
    api->native_s += now_s() - t0;
    return p;
}

EE_API int32_t ee_abi_version(void) { return EE_ABI_VERSION; }

EE_API void *PyInit__fastpath(void) { return NULL; }

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

/* numpy's argmax of a logit row: the first maximum, NaN counting as the maximum. With ids (the
 * drafter's draft vocabulary, ascending; every other entry is -inf) only those are read. */
static int32_t argmax_row(const float *row, const int64_t *ids, int32_t n_ids, int32_t n_vocab) {
    int32_t best = 0;
    float bv = -INFINITY;
    bool seen = false;
    if (ids) {
        for (int32_t j = 0; j < n_ids; j++) {
            const int32_t i = (int32_t)ids[j];
            const float v = row[i];
            if (v != v) return i;
            if (!seen || v > bv) { bv = v; best = i; seen = true; }
        }
        return bv == -INFINITY ? 0 : best; /* a row of -inf only: numpy answers its first entry */
    }
    for (int32_t i = 0; i < n_vocab; i++) {
        const float v = row[i];
        if (v != v) return i;
        if (!seen || v > bv) { bv = v; best = i; seen = true; }
    }
    return best;
}

EE_API void ee_argmax_rows(const float *logits, int32_t rows, int32_t n_vocab, int32_t *out) {
    for (int32_t r = 0; r < rows; r++) out[r] = argmax_row(logits + (size_t)r * n_vocab, NULL, 0, n_vocab);
}

/* The probability of the most probable token, 1 / sum(exp(l - max)) over the finite entries. */
static double top_prob(const float *row, const int64_t *ids, int32_t n_ids, int32_t n_vocab) {
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
        const double t0 = api->timing ? now_s() : 0.0;
        const float *g = api->get_embd_nextn(ctx);
        if (api->timing) api->native_s += now_s() - t0;
        if (!g) return -200;
        memcpy(out + (size_t)lo * n_embd, g, sizeof(float) * (size_t)(hi - lo) * n_embd);
    }
    return 0;
}

/* A greedy draft chain of up to k tokens from the drafter's last decoded row (logits, pre-norm h),
 * which sits at position pos: each step drafts the argmax (over ids if given), stops early when
 * p_min > 0 and the top probability is below it, and otherwise decodes (draft, carry(h)) at the
 * next position, where carry is norm(h) with out_norm_w (EAGLE-3.1) and h itself without.
 * gbuf holds n_embd floats. Returns the number of drafts written to drafts, or a negative code
 * (-1000 - llama_process's code) when a decode fails. */
static int32_t ee_chain(ee_api *api, void *ctx, void *batch, const float *logits, const float *h, int32_t pos,
                        int32_t k, float p_min, const int64_t *ids, int32_t n_ids, int32_t n_vocab, int32_t n_embd,
                        const float *out_norm_w, float eps, float *gbuf, int32_t *drafts) {
    int32_t n = 0;
    while (k > 0) {
        if (p_min > 0.0f && top_prob(logits, ids, n_ids, n_vocab) < (double)p_min) break;
        const int32_t d = argmax_row(logits, ids, n_ids, n_vocab);
        drafts[n++] = d;
        if (n == k) break;
        pos += 1;
        if (out_norm_w) rms_norm_row(h, out_norm_w, n_embd, eps, gbuf);
        else memcpy(gbuf, h, sizeof(float) * (size_t)n_embd);
        const int32_t rc = ee_decode_rows(api, ctx, batch, &d, gbuf, &pos, NULL, 1, n_embd, 1);
        if (rc != 0) return -1000 - (rc < 0 ? -rc : rc);
        logits = get_ith(api, api->get_logits_ith, ctx, 0);
        h = get_ith(api, api->get_embd_nextn_ith, ctx, 0);
        if (!logits || !h) return -2000;
    }
    return n;
}

/* One drafting step of the loop: the pending true rows (features [n, width] at pos0.., their
 * next tokens) through the encoder into g (scratch: fc_norm rows), then through the decoder
 * (up to all_outputs_max rows in one batch with every row an output, since the eagle3 graph
 * copies its first n_outputs rows; longer: n_batch chunks without outputs, then the last row
 * alone), then ee_chain from the last row. Returns the number of drafts, or a negative code. */
EE_API int32_t ee_propose(ee_api *api, void *ctx, void *batch, const float *feats, int32_t n, int32_t width,
                          int32_t pos0, const float *fc_norm_w, float eps, float *scratch, int32_t n_batch, float *g,
                          const int32_t *tokens, int32_t all_outputs_max, int32_t k, float p_min, const int64_t *ids,
                          int32_t n_ids, int32_t n_vocab, int32_t n_embd, const float *out_norm_w, float *gbuf,
                          int32_t *drafts) {
    int32_t rc = ee_encode(api, ctx, batch, feats, n, width, pos0, fc_norm_w, eps, scratch, n_batch, g, n_embd);
    if (rc != 0) return -3000 - (rc < 0 ? -rc : rc);
    int32_t last;
    int32_t pos[512];
    if (n <= all_outputs_max && n <= 512) {
        for (int32_t i = 0; i < n; i++) pos[i] = pos0 + i;
        rc = ee_decode_rows(api, ctx, batch, tokens, g, pos, NULL, n, n_embd, 1);
        last = n - 1;
    } else {
        const int32_t step = n_batch < 512 ? n_batch : 512;
        for (int32_t lo = 0; lo < n - 1 && rc == 0; lo += step) {
            const int32_t hi = lo + step < n - 1 ? lo + step : n - 1;
            for (int32_t i = lo; i < hi; i++) pos[i - lo] = pos0 + i;
            rc = ee_decode_rows(api, ctx, batch, tokens + lo, g + (size_t)lo * n_embd, pos, NULL, hi - lo, n_embd, 0);
        }
        if (rc == 0) {
            pos[0] = pos0 + n - 1;
            rc = ee_decode_rows(api, ctx, batch, tokens + n - 1, g + (size_t)(n - 1) * n_embd, pos, NULL, 1, n_embd, 1);
        }
        last = 0;
    }
    if (rc != 0) return -1000 - (rc < 0 ? -rc : rc);
    const float *logits = get_ith(api, api->get_logits_ith, ctx, last);
    const float *h = get_ith(api, api->get_embd_nextn_ith, ctx, last);
    if (!logits || !h) return -2000;
    return ee_chain(api, ctx, batch, logits, h, pos0 + n - 1, k, p_min, ids, n_ids, n_vocab, n_embd, out_norm_w, eps,
                    gbuf, drafts);
}
