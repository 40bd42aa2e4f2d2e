/* edge-eagle's suffix index in C (edge_eagle/suffix.py's SuffixIndex, the native core).
 *
 * The same index as suffix.py's Python one (PySuffixIndex), operation for operation: every
 * n-gram (n in NGRAMS) of every indexed text maps, by a 64-bit hash, to its newest occurrences
 * (at most max_occurrences, newest first), a lookup compares the tokens themselves, and texts
 * are evicted whole, oldest first. suffix.py keeps the draft tree's selection; this file holds
 * what runs on every cycle: indexing the live text's new token, finding the longest earlier
 * suffix, and reading what followed its occurrences (continuations, split, first_path).
 *
 * Why C: in the live loop the Python index cost 50-70 us a cycle, most of it cache misses on
 * Python objects after llama.cpp's kernels have run (a cycle of the 135M target is 8-9 ms on a
 * 2-core EPYC). Here an n-gram is one probe into a flat table.
 *
 * Layout: a linear-probing table of slots {key, inline occurrence, chunk, count}; a key with two
 * or more occurrences keeps them in a chunk of max_occurrences ints from a pool (with a free
 * list). An occurrence is text id * 2^32 + end position. Deleting a key shifts the following
 * slots back (no tombstones). Texts are int32 arrays in an array indexed by id - base (ids only
 * grow; the history is evicted from the oldest).
 *
 * Hash collisions: two n-grams with one hash share a slot, as in the Python index (whose
 * hashes are Python's tuple hashes): a lookup checks the tokens, so a collision can only evict an
 * occurrence early. The two indexes' collisions differ, so on such a key they can differ.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NGRAMS 16
#define SHIFT 32
#define MAX_OCC 64 /* max_occurrences at most (suffix.py checks) */

typedef struct {
    uint64_t key; /* 0: empty */
    uint64_t occ; /* the occurrence when count == 1 */
    int32_t chunk; /* its occurrences (newest first) when count >= 2 */
    int32_t count;
} slot;

typedef struct {
    int32_t *tok;
    Py_ssize_t len, cap;
} text;

typedef struct {
    PyObject_HEAD
    int ngrams[MAX_NGRAMS];
    int n_ngrams, max_ngram, max_occ, extend_max, history;
    Py_ssize_t max_tokens;
    /* the table */
    slot *slots;
    uint64_t mask; /* capacity - 1 */
    Py_ssize_t used, entries;
    /* occurrence chunks */
    uint64_t *pool;
    int32_t pool_n, pool_cap, free_chunk;
    /* texts: texts[id - base], NULL where dropped */
    text **texts;
    Py_ssize_t n_texts, texts_cap;
    int64_t base, live_id;
    Py_ssize_t live_indexed, history_tokens, n_history;
} Index;

/* --- hashing ---------------------------------------------------------------------------------- */

static inline uint64_t mix(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

/* keys[i] = the hash of the ngrams[i]-gram of t ending at j (for those that fit); returns how many */
static int keys_at(const Index *ix, const int32_t *t, Py_ssize_t j, uint64_t *keys) {
    uint64_t h = 0x9e3779b97f4a7c15ULL;
    int done = 0, len = 0;
    for (int i = 0; i < ix->n_ngrams; i++) {
        const int n = ix->ngrams[i];
        if (n > j + 1) break;
        while (len < n) {
            h = (h ^ (uint64_t)(uint32_t)t[j - len]) * 0x100000001b3ULL;
            h = (h << 23 | h >> 41) + 0x9e3779b97f4a7c15ULL;
            len++;
        }
        uint64_t k = mix(h + (uint64_t)n);
        keys[done++] = k ? k : 1;
    }
    return done;
}

/* --- the table -------------------------------------------------------------------------------- */

static inline slot *find(const Index *ix, uint64_t key) {
    if (!ix->slots) return NULL;
    uint64_t i = key & ix->mask;
    for (;;) {
        slot *s = &ix->slots[i];
        if (s->key == key) return s;
        if (!s->key) return NULL;
        i = (i + 1) & ix->mask;
    }
}

static int grow(Index *ix) {
    const uint64_t old_cap = ix->slots ? ix->mask + 1 : 0, cap = old_cap ? 2 * old_cap : 1024;
    slot *fresh = calloc(cap, sizeof(slot));
    if (!fresh) return -1;
    for (uint64_t i = 0; i < old_cap; i++) {
        const slot *s = &ix->slots[i];
        if (!s->key) continue;
        uint64_t j = s->key & (cap - 1);
        while (fresh[j].key) j = (j + 1) & (cap - 1);
        fresh[j] = *s;
    }
    free(ix->slots);
    ix->slots = fresh;
    ix->mask = cap - 1;
    return 0;
}

static int32_t chunk_new(Index *ix) {
    if (ix->free_chunk >= 0) {
        const int32_t c = ix->free_chunk;
        ix->free_chunk = (int32_t)ix->pool[(size_t)c * ix->max_occ];
        return c;
    }
    if (ix->pool_n == ix->pool_cap) {
        const int32_t cap = ix->pool_cap ? 2 * ix->pool_cap : 256;
        uint64_t *p = realloc(ix->pool, (size_t)cap * ix->max_occ * sizeof(uint64_t));
        if (!p) return -1;
        ix->pool = p;
        ix->pool_cap = cap;
    }
    return ix->pool_n++;
}

static void chunk_free(Index *ix, int32_t c) {
    ix->pool[(size_t)c * ix->max_occ] = (uint64_t)(int64_t)ix->free_chunk;
    ix->free_chunk = c;
}

/* the newest occurrence of key becomes occ: 0, or -1 (out of memory) */
static int insert(Index *ix, uint64_t key, uint64_t occ) {
    if (!ix->slots || (ix->used + 1) * 10 > (Py_ssize_t)(ix->mask + 1) * 7) {
        if (grow(ix) != 0) return -1;
    }
    uint64_t i = key & ix->mask;
    while (ix->slots[i].key && ix->slots[i].key != key) i = (i + 1) & ix->mask;
    slot *s = &ix->slots[i];
    if (!s->key) {
        s->key = key;
        s->occ = occ;
        s->count = 1;
        s->chunk = -1;
        ix->used++;
        ix->entries++;
        return 0;
    }
    if (s->count == 1) {
        const int32_t c = chunk_new(ix);
        if (c < 0) return -1;
        uint64_t *o = &ix->pool[(size_t)c * ix->max_occ];
        o[0] = occ;
        o[1] = s->occ;
        s->chunk = c;
        s->count = 2;
        ix->entries++;
        return 0;
    }
    uint64_t *o = &ix->pool[(size_t)s->chunk * ix->max_occ];
    const int32_t keep = s->count < ix->max_occ ? s->count : ix->max_occ - 1;
    memmove(o + 1, o, (size_t)keep * sizeof(uint64_t));
    o[0] = occ;
    ix->entries += keep + 1 - s->count;
    s->count = keep + 1;
    return 0;
}

/* the slot at i is emptied; the slots after it shift back into the gap (linear probing) */
static void delete_at(Index *ix, uint64_t i) {
    slot *t = ix->slots;
    uint64_t j = i;
    t[i].key = 0;
    for (;;) {
        j = (j + 1) & ix->mask;
        if (!t[j].key) break;
        const uint64_t home = t[j].key & ix->mask;
        /* t[j] stays where its home lies cyclically in (i, j] */
        const int stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            t[i] = t[j];
            t[j].key = 0;
            i = j;
        }
    }
    ix->used--;
}

/* every occurrence in [lo, hi) of key goes */
static void remove_range(Index *ix, uint64_t key, uint64_t lo, uint64_t hi) {
    if (!ix->slots) return;
    uint64_t i = key & ix->mask;
    while (ix->slots[i].key != key) {
        if (!ix->slots[i].key) return;
        i = (i + 1) & ix->mask;
    }
    slot *s = &ix->slots[i];
    if (s->count == 1) {
        if (lo <= s->occ && s->occ < hi) {
            ix->entries--;
            delete_at(ix, i);
        }
        return;
    }
    uint64_t *o = &ix->pool[(size_t)s->chunk * ix->max_occ];
    int32_t kept = 0;
    for (int32_t k = 0; k < s->count; k++)
        if (!(lo <= o[k] && o[k] < hi)) o[kept++] = o[k];
    ix->entries -= s->count - kept;
    if (kept == 0) {
        chunk_free(ix, s->chunk);
        delete_at(ix, i);
    } else if (kept == 1) {
        s->occ = o[0];
        chunk_free(ix, s->chunk);
        s->chunk = -1;
        s->count = 1;
    } else {
        s->count = kept;
    }
}

/* --- texts ------------------------------------------------------------------------------------ */

static inline text *text_get(const Index *ix, int64_t id) {
    const int64_t i = id - ix->base;
    return i >= 0 && i < ix->n_texts ? ix->texts[i] : NULL;
}

/* a new empty text with id (the next one: ids only grow) */
static int text_open(Index *ix, int64_t id) {
    if (ix->n_texts == 0) ix->base = id;
    if (id - ix->base != ix->n_texts) {
        PyErr_SetString(PyExc_RuntimeError, "suffix index: text ids must grow one by one");
        return -1;
    }
    if (ix->n_texts == ix->texts_cap) {
        const Py_ssize_t cap = ix->texts_cap ? 2 * ix->texts_cap : 16;
        text **p = realloc(ix->texts, (size_t)cap * sizeof(text *));
        if (!p) {
            PyErr_NoMemory();
            return -1;
        }
        ix->texts = p;
        ix->texts_cap = cap;
    }
    text *t = calloc(1, sizeof(text));
    if (!t) {
        PyErr_NoMemory();
        return -1;
    }
    ix->texts[ix->n_texts++] = t;
    return 0;
}

static void text_drop(Index *ix, int64_t id) {
    const int64_t i = id - ix->base;
    if (i < 0 || i >= ix->n_texts || !ix->texts[i]) return;
    free(ix->texts[i]->tok);
    free(ix->texts[i]);
    ix->texts[i] = NULL;
    Py_ssize_t lead = 0; /* dropped texts at the front go (amortised: moved once half are gone) */
    while (lead < ix->n_texts && !ix->texts[lead]) lead++;
    if (lead == ix->n_texts) {
        ix->base += lead;
        ix->n_texts = 0;
    } else if (lead > 0 && 2 * lead >= ix->n_texts) {
        memmove(ix->texts, ix->texts + lead, (size_t)(ix->n_texts - lead) * sizeof(text *));
        ix->n_texts -= lead;
        ix->base += lead;
    }
}

static int text_extend(text *t, Py_ssize_t extra) {
    if (t->len + extra <= t->cap) return 0;
    Py_ssize_t cap = t->cap ? t->cap : 64;
    while (cap < t->len + extra) cap *= 2;
    int32_t *p = realloc(t->tok, (size_t)cap * sizeof(int32_t));
    if (!p) return -1;
    t->tok = p;
    t->cap = cap;
    return 0;
}

/* --- indexing --------------------------------------------------------------------------------- */

static int add(Index *ix, int64_t id, Py_ssize_t start, Py_ssize_t end) {
    const text *t = text_get(ix, id);
    uint64_t keys[MAX_NGRAMS];
    for (Py_ssize_t j = start; j < end; j++) {
        const int n = keys_at(ix, t->tok, j, keys);
        const uint64_t occ = ((uint64_t)id << SHIFT) + (uint64_t)j;
        for (int i = 0; i < n; i++)
            if (insert(ix, keys[i], occ) != 0) {
                PyErr_NoMemory();
                return -1;
            }
    }
    return 0;
}

static void unindex(Index *ix, int64_t id) {
    const text *t = text_get(ix, id);
    if (!t) return;
    uint64_t keys[MAX_NGRAMS];
    const uint64_t lo = (uint64_t)id << SHIFT, hi = (uint64_t)(id + 1) << SHIFT;
    for (Py_ssize_t j = 0; j < t->len; j++) {
        const int n = keys_at(ix, t->tok, j, keys);
        for (int i = 0; i < n; i++) remove_range(ix, keys[i], lo, hi);
    }
}

static int finish_live(Index *ix, int keep) {
    text *live = text_get(ix, ix->live_id);
    if (live->len && ix->history && keep) {
        if (add(ix, ix->live_id, ix->live_indexed, live->len) != 0) return -1;
        ix->n_history++;
        ix->history_tokens += live->len;
    } else {
        unindex(ix, ix->live_id);
        text_drop(ix, ix->live_id);
    }
    ix->live_id++;
    if (text_open(ix, ix->live_id) != 0) return -1;
    ix->live_indexed = 0;
    while (ix->history_tokens > ix->max_tokens && ix->n_history > 0) {
        int64_t id = ix->base;
        while (id < ix->live_id && !text_get(ix, id)) id++;
        ix->history_tokens -= text_get(ix, id)->len;
        ix->n_history--;
        unindex(ix, id);
        text_drop(ix, id);
    }
    return 0;
}

static int token_at(PyObject *seq, Py_ssize_t i, int32_t *out) {
    const long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
    if (v == -1 && PyErr_Occurred()) return -1;
    *out = (int32_t)v;
    return 0;
}

/* the live text becomes the sequence seq (a PySequence_Fast): see PySuffixIndex.observe */
static int observe(Index *ix, PyObject *seq) {
    text *live = text_get(ix, ix->live_id);
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), n_old = live->len;
    if (n_old) {
        int32_t a, b, c;
        if (n < n_old || token_at(seq, 0, &a) || token_at(seq, n_old / 2, &b) || token_at(seq, n_old - 1, &c) ||
            a != live->tok[0] || b != live->tok[n_old / 2] || c != live->tok[n_old - 1]) {
            if (PyErr_Occurred()) return -1;
            if (finish_live(ix, 1) != 0) return -1;
            live = text_get(ix, ix->live_id);
        }
    }
    const Py_ssize_t from = live->len;
    if (n > from) {
        if (text_extend(live, n - from) != 0) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = from; i < n; i++)
            if (token_at(seq, i, &live->tok[i]) != 0) return -1;
        live->len = n;
    }
    const Py_ssize_t end = live->len - 1;
    if (end > ix->live_indexed) {
        if (add(ix, ix->live_id, ix->live_indexed, end) != 0) return -1;
        ix->live_indexed = end;
    }
    return 0;
}

/* --- reading what followed -------------------------------------------------------------------- */

/* A match: its length n, its occurrences (text id, end), the live text's id and size then. */
typedef struct {
    int n;
    Py_ssize_t n_occ;
    int64_t ids[MAX_OCC];
    Py_ssize_t ends[MAX_OCC];
    Py_ssize_t size;
    int64_t live_id;
} match_t;

/* parse a match's n (NULL: 0), occ, size and live_id into m: 0, or -1 with an exception */
static int parse_match(PyObject *n, PyObject *occ, PyObject *size, PyObject *live_id, match_t *m) {
    m->n = n ? (int)PyLong_AsLong(n) : 0;
    m->size = PyLong_AsSsize_t(size);
    m->live_id = PyLong_AsLongLong(live_id);
    if (PyErr_Occurred()) return -1;
    if (!PyTuple_Check(occ)) {
        PyErr_SetString(PyExc_TypeError, "a match's occurrences are a tuple of (text id, end)");
        return -1;
    }
    m->n_occ = PyTuple_GET_SIZE(occ);
    if (m->n_occ > MAX_OCC) {
        PyErr_SetString(PyExc_ValueError, "a match has at most 64 occurrences here");
        return -1;
    }
    for (Py_ssize_t i = 0; i < m->n_occ; i++) {
        PyObject *o = PyTuple_GET_ITEM(occ, i);
        if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 2) {
            PyErr_SetString(PyExc_TypeError, "a match's occurrences are a tuple of (text id, end)");
            return -1;
        }
        m->ids[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(o, 0));
        m->ends[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(o, 1));
        if (PyErr_Occurred()) return -1;
    }
    return 0;
}

/* occurrence i's match length (extended backwards) and up to depth tokens that followed it, into
 * follow; returns how many, or -1 where its text is gone (PySuffixIndex._continuations) */
static Py_ssize_t continuation(const Index *ix, const match_t *m, Py_ssize_t i, int depth, int *len,
                               int32_t *follow) {
    const text *live = text_get(ix, m->live_id), *t = text_get(ix, m->ids[i]);
    if (!live || !t || m->size > live->len) return -1;
    const Py_ssize_t end = m->ends[i], size = m->size;
    if (end < 0 || end >= t->len) return -1;
    const int is_live = m->ids[i] == m->live_id;
    int k = m->n;
    if (m->n == ix->max_ngram)
        while (k < ix->extend_max && end - k >= 0 && size - 1 - k >= 0 && t->tok[end - k] == live->tok[size - 1 - k])
            k++;
    *len = k;
    const Py_ssize_t stop = is_live ? size : t->len;
    Py_ssize_t got = 0;
    for (int j = 0; j < depth; j++) {
        const Py_ssize_t pos = end + 1 + j;
        if (pos >= stop) {
            if (!is_live) break;
            const Py_ssize_t period = size - (end + 1);
            if (period <= 0) break;
            follow[got++] = t->tok[end + 1 + j % period];
        } else {
            follow[got++] = t->tok[pos];
        }
    }
    return got;
}

/* --- the Python type -------------------------------------------------------------------------- */

/* whether __init__ ran (else a TypeError) */
static int ready(const Index *ix) {
    if (text_get(ix, ix->live_id)) return 1;
    PyErr_SetString(PyExc_TypeError, "suffix index: call Index(...) to make one");
    return 0;
}

static void index_clear(Index *ix) {
    for (Py_ssize_t i = 0; i < ix->n_texts; i++)
        if (ix->texts[i]) {
            free(ix->texts[i]->tok);
            free(ix->texts[i]);
        }
    free(ix->texts);
    free(ix->slots);
    free(ix->pool);
    ix->texts = NULL;
    ix->slots = NULL;
    ix->pool = NULL;
    ix->n_texts = ix->texts_cap = 0;
    ix->mask = 0;
    ix->used = ix->entries = 0;
    ix->pool_n = ix->pool_cap = 0;
    ix->free_chunk = -1;
    ix->history_tokens = ix->n_history = ix->live_indexed = 0;
}

static void Index_dealloc(Index *ix) {
    index_clear(ix);
    Py_TYPE(ix)->tp_free((PyObject *)ix);
}

/* Index(ngrams: tuple, max_occurrences, extend_max, max_tokens, history, live_id) */
static int Index_init(Index *ix, PyObject *args, PyObject *kwds) {
    (void)kwds;
    PyObject *ngrams;
    Py_ssize_t max_tokens;
    long long live_id;
    if (!PyArg_ParseTuple(args, "O!iinpL", &PyTuple_Type, &ngrams, &ix->max_occ, &ix->extend_max, &max_tokens,
                          &ix->history, &live_id))
        return -1;
    const Py_ssize_t n = PyTuple_GET_SIZE(ngrams);
    if (n < 1 || n > MAX_NGRAMS || ix->max_occ < 2 || ix->max_occ > MAX_OCC) {
        PyErr_SetString(PyExc_ValueError, "suffix index: 1 to 16 n-gram lengths and 2 to 64 occurrences");
        return -1;
    }
    index_clear(ix);
    for (Py_ssize_t i = 0; i < n; i++) {
        const long v = PyLong_AsLong(PyTuple_GET_ITEM(ngrams, i));
        if (v < 1 || (i && v <= ix->ngrams[i - 1])) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "suffix index: n-gram lengths must grow");
            return -1;
        }
        ix->ngrams[i] = (int)v;
    }
    ix->n_ngrams = (int)n;
    ix->max_ngram = ix->ngrams[n - 1];
    ix->max_tokens = max_tokens;
    ix->live_id = live_id;
    return text_open(ix, live_id);
}

/* observe() on any sequence: 0, or -1 with an exception */
static int observe_tokens(Index *ix, PyObject *tokens) {
    if (!ready(ix)) return -1;
    PyObject *seq = PySequence_Fast(tokens, "tokens must be a sequence of ints");
    if (!seq) return -1;
    const int rc = observe(ix, seq);
    Py_DECREF(seq);
    return rc;
}

static PyObject *Index_observe(Index *ix, PyObject *tokens) {
    if (observe_tokens(ix, tokens) != 0) return NULL;
    Py_RETURN_NONE;
}

/* finish(tokens or None, keep) */
static PyObject *Index_finish(Index *ix, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "finish(tokens or None, keep)");
        return NULL;
    }
    if (!ready(ix) || (args[0] != Py_None && observe_tokens(ix, args[0]) != 0)) return NULL;
    const int keep = PyObject_IsTrue(args[1]);
    if (keep < 0 || finish_live(ix, keep) != 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Index_reset(Index *ix, PyObject *unused) {
    (void)unused;
    const int64_t live_id = ix->live_id;
    index_clear(ix);
    if (text_open(ix, live_id) != 0) return NULL;
    Py_RETURN_NONE;
}

/* match(tokens) -> (n, ((text id, end), ...), size, live id) or None */
static PyObject *Index_match(Index *ix, PyObject *tokens) {
    if (observe_tokens(ix, tokens) != 0) return NULL;
    const text *live = text_get(ix, ix->live_id);
    const Py_ssize_t size = live->len;
    uint64_t keys[MAX_NGRAMS];
    const int have = size ? keys_at(ix, live->tok, size - 1, keys) : 0;
    for (int g = have - 1; g >= 0; g--) {
        const int n = ix->ngrams[g];
        const slot *s = find(ix, keys[g]);
        if (!s) continue;
        const uint64_t *o = s->count == 1 ? &s->occ : &ix->pool[(size_t)s->chunk * ix->max_occ];
        PyObject *occ = PyTuple_New(s->count);
        if (!occ) return NULL;
        Py_ssize_t found = 0;
        for (int32_t k = 0; k < s->count; k++) {
            const int64_t id = (int64_t)(o[k] >> SHIFT);
            const Py_ssize_t end = (Py_ssize_t)(o[k] & 0xffffffffULL);
            const text *t = text_get(ix, id);
            if (!t || end < n - 1 || end >= t->len ||
                memcmp(t->tok + end - n + 1, live->tok + size - n, (size_t)n * sizeof(int32_t)) != 0)
                continue;
            PyObject *pair = Py_BuildValue("(Ln)", (long long)id, end);
            if (!pair) {
                Py_DECREF(occ);
                return NULL;
            }
            PyTuple_SET_ITEM(occ, found++, pair);
        }
        if (!found) {
            Py_DECREF(occ);
            continue;
        }
        if (found < s->count && _PyTuple_Resize(&occ, found) != 0) return NULL;
        return Py_BuildValue("(iNnL)", n, occ, size, (long long)ix->live_id);
    }
    Py_RETURN_NONE;
}

/* parse the arguments (n, occ, size, live_id, depth) of `name` into m and depth: 0, or -1 with an
 * exception */
static int parse_depth_call(Index *ix, PyObject *const *args, Py_ssize_t nargs, const char *name, match_t *m,
                            long *depth) {
    if (!ready(ix)) return -1;
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "%s(n, occ, size, live_id, depth)", name);
        return -1;
    }
    if (parse_match(args[0], args[1], args[2], args[3], m) != 0) return -1;
    *depth = PyLong_AsLong(args[4]);
    return *depth == -1 && PyErr_Occurred() ? -1 : 0;
}

/* a new list of the n tokens at v, or NULL with an exception */
static PyObject *token_list(const int32_t *v, Py_ssize_t n) {
    PyObject *list = PyList_New(n);
    for (Py_ssize_t j = 0; list && j < n; j++) {
        PyObject *tok = PyLong_FromLong(v[j]);
        if (!tok) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, j, tok);
    }
    return list;
}

/* continuations(n, occ, size, live_id, depth) -> [(match length, [tokens that followed]), ...] */
static PyObject *Index_continuations(Index *ix, PyObject *const *args, Py_ssize_t nargs) {
    match_t m;
    long depth;
    if (parse_depth_call(ix, args, nargs, "continuations", &m, &depth) != 0) return NULL;
    PyObject *out = PyList_New(0);
    if (!out || !text_get(ix, m.live_id) || depth < 0) return out;
    int32_t *follow = malloc(((size_t)depth + 1) * sizeof(int32_t));
    if (!follow) {
        Py_DECREF(out);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < m.n_occ; i++) {
        int len;
        const Py_ssize_t got = continuation(ix, &m, i, (int)depth, &len, follow);
        if (got < 0) continue;
        PyObject *list = token_list(follow, got);
        PyObject *pair = list ? Py_BuildValue("(iN)", len, list) : NULL;
        if (!pair || PyList_Append(out, pair) != 0) {
            Py_XDECREF(pair);
            Py_DECREF(out);
            free(follow);
            return NULL;
        }
        Py_DECREF(pair);
    }
    free(follow);
    return out;
}

/* split(occ, size, live_id) -> whether the occurrences disagree on the next token */
static PyObject *Index_split(Index *ix, PyObject *const *args, Py_ssize_t nargs) {
    match_t m;
    if (!ready(ix)) return NULL;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "split(occ, size, live_id)");
        return NULL;
    }
    if (parse_match(NULL, args[0], args[1], args[2], &m) != 0) return NULL;
    const text *live = text_get(ix, m.live_id);
    int32_t first = -1;
    for (Py_ssize_t i = 0; live && i < m.n_occ; i++) {
        const text *t = text_get(ix, m.ids[i]);
        if (!t) continue;
        const Py_ssize_t end = m.ends[i];
        if (end < 0 || end + 1 >= (m.ids[i] == m.live_id ? m.size : t->len) || end + 1 >= t->len) continue;
        const int32_t token = t->tok[end + 1];
        if (first < 0)
            first = token;
        else if (token != first)
            Py_RETURN_TRUE;
    }
    Py_RETURN_FALSE;
}

/* first_path(n, occ, size, live_id, depth) -> the first-choice path (PySuffixIndex.first_path) */
static PyObject *Index_first_path(Index *ix, PyObject *const *args, Py_ssize_t nargs) {
    match_t m;
    long depth;
    if (parse_depth_call(ix, args, nargs, "first_path", &m, &depth) != 0) return NULL;
    if (depth < 0 || !text_get(ix, m.live_id)) return PyList_New(0);
    if (depth > 4096) depth = 4096;
    int32_t *follow = malloc((size_t)(m.n_occ ? m.n_occ : 1) * ((size_t)depth + 1) * sizeof(int32_t));
    int32_t *path = malloc(((size_t)depth + 1) * sizeof(int32_t));
    if (!follow || !path) {
        free(follow);
        free(path);
        return PyErr_NoMemory();
    }
    int lens[MAX_OCC], alive[MAX_OCC], weight_of[MAX_OCC];
    Py_ssize_t got[MAX_OCC], runs = 0;
    for (Py_ssize_t i = 0; i < m.n_occ; i++) {
        const Py_ssize_t g = continuation(ix, &m, i, (int)depth, &lens[runs], follow + (size_t)runs * (depth + 1));
        if (g < 0) continue;
        got[runs] = g;
        alive[runs] = 1;
        runs++;
    }
    long out = 0;
    for (long j = 0; j < depth; j++) {
        /* the weight of each distinct next token, in order of first appearance (ties: the newest) */
        int32_t toks[MAX_OCC];
        long long weights[MAX_OCC];
        int distinct = 0;
        for (Py_ssize_t r = 0; r < runs; r++) {
            if (!alive[r] || j >= got[r]) continue;
            const int32_t tok = follow[(size_t)r * (depth + 1) + j];
            int d = 0;
            while (d < distinct && toks[d] != tok) d++;
            if (d == distinct) {
                toks[distinct] = tok;
                weights[distinct++] = 0;
            }
            weights[d] += lens[r];
            weight_of[r] = d;
        }
        if (!distinct) break;
        int best = 0;
        for (int d = 1; d < distinct; d++)
            if (weights[d] > weights[best]) best = d;
        path[out++] = toks[best];
        for (Py_ssize_t r = 0; r < runs; r++)
            alive[r] = alive[r] && j < got[r] && weight_of[r] == best;
    }
    free(follow);
    PyObject *list = token_list(path, out);
    free(path);
    return list;
}

static PyObject *Index_stats(Index *ix, PyObject *unused) {
    (void)unused;
    if (!ready(ix)) return NULL;
    const text *live = text_get(ix, ix->live_id);
    Py_ssize_t text_bytes = 0;
    for (Py_ssize_t i = 0; i < ix->n_texts; i++)
        if (ix->texts[i]) text_bytes += (Py_ssize_t)sizeof(text) + ix->texts[i]->cap * (Py_ssize_t)sizeof(int32_t);
    const Py_ssize_t bytes = (ix->slots ? (Py_ssize_t)(ix->mask + 1) * (Py_ssize_t)sizeof(slot) : 0) +
                             (Py_ssize_t)ix->pool_cap * ix->max_occ * (Py_ssize_t)sizeof(uint64_t) + text_bytes +
                             ix->texts_cap * (Py_ssize_t)sizeof(text *);
    return Py_BuildValue("{s:n,s:n,s:n,s:n,s:n,s:n}", "history_tokens", ix->history_tokens, "live_tokens",
                         live ? live->len : 0, "texts", ix->n_history, "keys", ix->used, "entries", ix->entries,
                         "approx_bytes", bytes);
}

static PyObject *Index_get_live_id(Index *ix, void *closure) {
    (void)closure;
    return PyLong_FromLongLong(ix->live_id);
}

static PyObject *Index_get_history(Index *ix, void *closure) {
    (void)closure;
    return PyBool_FromLong(ix->history);
}

static int Index_set_history(Index *ix, PyObject *value, void *closure) {
    (void)closure;
    const int on = value ? PyObject_IsTrue(value) : -1;
    if (on < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "history cannot be deleted");
        return -1;
    }
    ix->history = on;
    return 0;
}

static PyMethodDef Index_methods[] = {
    {"observe", (PyCFunction)Index_observe, METH_O, "The live text becomes tokens (indexed incrementally)."},
    {"finish", (PyCFunction)(void (*)(void))Index_finish, METH_FASTCALL, "finish(tokens or None, keep)."},
    {"reset", (PyCFunction)Index_reset, METH_NOARGS, "Forget the history and the live text."},
    {"match", (PyCFunction)Index_match, METH_O, "(n, occ, size, live_id) of the longest earlier suffix, or None."},
    {"continuations", (PyCFunction)(void (*)(void))Index_continuations, METH_FASTCALL,
     "[(match length, followed), ...] per occurrence."},
    {"split", (PyCFunction)(void (*)(void))Index_split, METH_FASTCALL, "Whether occurrences disagree on the next token."},
    {"first_path", (PyCFunction)(void (*)(void))Index_first_path, METH_FASTCALL, "The first-choice path."},
    {"stats", (PyCFunction)Index_stats, METH_NOARGS, "Counts and bytes."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Index_getset[] = {
    {"live_id", (getter)Index_get_live_id, NULL, "The live text's id.", NULL},
    {"history", (getter)Index_get_history, (setter)Index_set_history, "Whether finished texts are kept.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject IndexType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "edge_eagle._suffixcore.Index",
    .tp_basicsize = sizeof(Index),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The suffix index's native core (see edge_eagle/_suffix.c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Index_init,
    .tp_dealloc = (destructor)Index_dealloc,
    .tp_methods = Index_methods,
    .tp_getset = Index_getset,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_suffixcore", NULL, -1, NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__suffixcore(void) {
    if (PyType_Ready(&IndexType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&IndexType);
    if (PyModule_AddObject(m, "Index", (PyObject *)&IndexType) < 0) {
        Py_DECREF(&IndexType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
