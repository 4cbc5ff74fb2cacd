/* A pass's plain decode tokens in C: applied to their requests, drawn ahead, handed out.
 *
 * `Advancer`: `EngineCore._advance` (mocker/engine/core_pass.py) hands a pass's scheduled requests
 * to `Advancer.run`, which applies those whose token ends nothing (below) and hands every
 * other one to the Python body (`EngineCore._advance_one`). That body stays the reference:
 * with MOCKER_COMPILED=0, or when this was not built, it applies every request
 * (tests/engine/test_cpass.py compares the two pass by pass).
 *
 * Why: in a live server's steady decode the per-token bookkeeping of `_advance` (about 30
 * attribute reads and writes, an output object) was ~460 ns of the ~3 us of user CPU a
 * streamed token costs (500 streams); ~200 with this. Here the request's slots are read and
 * written at the offsets their member descriptors name, with no bytecode between them.
 *
 * A request takes the plain path when, with its scheduled tokens, it reaches the end of its
 * known tokens (it samples) and: the store policy hears of no block registered as scheduled
 * (not in `registered`), it has had its first token, its token is known without a draw (in
 * its drawn-ahead window; the replay column's next; or `token()`'s answer), that token is not
 * EOS, and it has no stop token ids and is below max_tokens after it. Nothing is changed
 * before all of that is known: otherwise the Python body does it all. A block that fills on
 * the way is registered and hashed by the same calls the Python body makes
 * (`EngineCore._cache_computed`, `chain.extend`), in its order.
 *
 * `Advancer.decodes`: the head of the scheduler's pass over its running requests, those that
 * decode one token, scheduled without bytecode (its Python loop goes on from where it stops).
 *
 * `deliver`: mocker.engine.stream's `deliver` loop (a pass's outputs to their streams), whose
 * plain tokens go to their streams' sinks (mocker/api/_ctext.c's Sink writes them to the
 * socket) without a Python frame; everything else goes to the Python `_hand`.
 *
 * `draws`: OutputTokenSampler.draws (a request's next tokens drawn ahead) without numpy's
 * fixed cost (11.5 us a window of 256 against 1.0 here), its list holding the palette's ints.
 */
#include "../_cslots.h"
#include <stdint.h>

/* The slots read or written, by name (the classes' member descriptors give the offsets). */
enum {
    R_NUM_COMPUTED, R_TOKENS, R_NUM_CACHED_BLOCKS, R_FIRST_TOKEN_TIME, R_SAMPLING,
    R_NUM_PROMPT, R_MAX_TOKENS, R_DRAWN, R_DRAWN_FROM, R_TOKEN_SEED, R_HASH_CHAIN,
    R_HASH_BLOCK_SIZE, R_LAST_TOKEN_TIME, R_REQUEST_ID, R_NUM_CACHED_TOKENS, R_TIER_HITS,
    R_BLOCK_HASHES, R_BLOCKS, R_KV_RECHECK, R_COUNT
};
static const char *const request_slots[R_COUNT] = {
    "num_computed_tokens", "all_token_ids", "num_cached_blocks", "first_token_time",
    "sampling", "num_prompt_tokens", "max_tokens", "drawn", "drawn_from", "token_seed",
    "hash_chain", "hash_block_size", "last_token_time", "request_id", "num_cached_tokens",
    "tier_hits", "block_hashes", "blocks", "kv_recheck",
};
enum { S_STOP_IDS, S_IGNORE_EOS, S_MIN_TOKENS, S_COUNT };
static const char *const sampling_slots[S_COUNT] = {"stop_token_ids", "ignore_eos", "min_tokens"};
enum {
    O_REQUEST_ID, O_NEW_IDS, O_TIME, O_FINISHED, O_FINISH_REASON, O_NUM_PROMPT,
    O_NUM_CACHED, O_TIER_HITS, O_FIRST, O_LATENCY, O_KV_PARAMS, O_COUNT
};
static const char *const output_slots[O_COUNT] = {
    "request_id", "new_token_ids", "time", "finished", "finish_reason", "num_prompt_tokens",
    "num_cached_tokens", "tier_hits", "first_token", "latency", "kv_transfer_params",
};

typedef struct {
    PyObject_HEAD
    PyTypeObject *request_type;
    PyTypeObject *sampling_type;
    PyTypeObject *output_type;
    Py_ssize_t r[R_COUNT];
    Py_ssize_t s[S_COUNT];
    Py_ssize_t o[O_COUNT];
    Py_ssize_t block_size;
    PyObject *eos;  /* an int, or None */
} Advancer;

/* Interned names */
static PyObject *str_extend, *str_request_id, *str_finished, *str_sink, *str_new_token_ids;

/* An attribute's truth, read at `off` if >= 0 (-1: an error is set). */
static int flag_of(PyObject *obj, Py_ssize_t off, PyObject *name)
{
    PyObject *v = read_slot(obj, off, name);
    if (v == NULL)
        return -1;
    int truth = PyObject_IsTrue(v);
    Py_DECREF(v);
    return truth;
}

/* Where `deliver` reads the outputs' and streams' attributes: the slot offsets of the last
 * type seen (held, so that its address is never another type's), -1 where it has no plain
 * slot of that name (then looked up). */
typedef struct {
    PyTypeObject *type;
    Py_ssize_t off[3];
} Layout;

static void layout_of(Layout *layout, PyTypeObject *type, PyObject *const *names, int n)
{
    if (layout->type == type)
        return;
    Py_INCREF(type);
    Py_XSETREF(layout->type, type);
    for (int i = 0; i < n; i++)
        layout->off[i] = slot_offset(type, PyUnicode_AsUTF8(names[i]));
}

static Layout out_layout, stream_layout;

/* Replace a slot's object (a new reference is stolen). */
static inline void set_slot(PyObject *obj, Py_ssize_t off, PyObject *value)
{
    PyObject *old = SLOT(obj, off);
    SLOT(obj, off) = value;
    Py_XDECREF(old);
}


static void advancer_dealloc(Advancer *self)
{
    Py_XDECREF(self->request_type);
    Py_XDECREF(self->sampling_type);
    Py_XDECREF(self->output_type);
    Py_XDECREF(self->eos);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Advancer(request_type, sampling_type, output_type, block_size, eos_token_id) */
static PyObject *advancer_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"request_type", "sampling_type", "output_type", "block_size",
                             "eos_token_id", NULL};
    PyTypeObject *rt, *st, *ot;
    Py_ssize_t bs;
    PyObject *eos;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!O!nO:Advancer", kwlist, &PyType_Type, &rt,
                                     &PyType_Type, &st, &PyType_Type, &ot, &bs, &eos))
        return NULL;
    if (bs <= 0) {
        PyErr_SetString(PyExc_ValueError, "Advancer: block_size must be > 0");
        return NULL;
    }
    if (eos != Py_None && !PyLong_CheckExact(eos)) {
        PyErr_SetString(PyExc_TypeError, "Advancer: eos_token_id must be an int or None");
        return NULL;
    }
    Advancer *self = (Advancer *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    if (slot_offsets(rt, request_slots, self->r, R_COUNT, "Advancer") < 0 ||
        slot_offsets(st, sampling_slots, self->s, S_COUNT, "Advancer") < 0 ||
        slot_offsets(ot, output_slots, self->o, O_COUNT, "Advancer") < 0) {
        Py_DECREF(self);
        return NULL;
    }
    Py_INCREF(rt);
    Py_INCREF(st);
    Py_INCREF(ot);
    Py_INCREF(eos);
    self->request_type = rt;
    self->sampling_type = st;
    self->output_type = ot;
    self->block_size = bs;
    self->eos = eos;
    return (PyObject *)self;
}

/* An int slot as a C value; -1 with *ok = 0 when it is not a small exact int. */
static inline Py_ssize_t int_slot(PyObject *obj, Py_ssize_t off, int *ok)
{
    PyObject *v = SLOT(obj, off);
    if (v == NULL || !PyLong_CheckExact(v)) {
        *ok = 0;
        return -1;
    }
    Py_ssize_t x = PyLong_AsSsize_t(v);
    if (x == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        *ok = 0;
    }
    return x;
}

enum { PLAIN_NO = 0, PLAIN_YES = 1, PLAIN_ERROR = -1 };

/* Apply one request's plain token, or answer PLAIN_NO having changed nothing. */
static int plain(Advancer *self, PyObject *req, Py_ssize_t n, PyObject *end, double end_s,
                 int emit, PyObject *column, PyObject *registered, PyObject *token,
                 PyObject *cache, PyObject *outputs)
{
    const Py_ssize_t *r = self->r;
    int ok = 1;
    if (Py_TYPE(req) != self->request_type)
        return PLAIN_NO;
    Py_ssize_t computed = int_slot(req, r[R_NUM_COMPUTED], &ok) + n;
    PyObject *tokens = SLOT(req, r[R_TOKENS]);
    if (!ok || tokens == NULL)
        return PLAIN_NO;
    Py_ssize_t num_tokens = PyList_CheckExact(tokens) ? PyList_GET_SIZE(tokens)
                                                        : PyObject_Size(tokens);
    if (num_tokens < 0) {
        PyErr_Clear();
        return PLAIN_NO;
    }
    if (computed != num_tokens) /* a prefill chunk short of the prompt's end */
        return PLAIN_NO;
    if (registered != Py_None) {
        int in = PyDict_Contains(registered, req);
        if (in != 0)
            return in < 0 ? PLAIN_ERROR : PLAIN_NO;
    }
    Py_ssize_t cached = int_slot(req, r[R_NUM_CACHED_BLOCKS], &ok);
    if (!ok)
        return PLAIN_NO;
    int fills = computed / self->block_size > cached; /* a block is full: registered */
    if (SLOT(req, r[R_FIRST_TOKEN_TIME]) == Py_None)
        return PLAIN_NO; /* its first token */
    PyObject *last = SLOT(req, r[R_LAST_TOKEN_TIME]);
    PyObject *sp = SLOT(req, r[R_SAMPLING]);
    if (last == NULL || !PyFloat_CheckExact(last) || sp == NULL ||
        Py_TYPE(sp) != self->sampling_type)
        return PLAIN_NO;
    PyObject *stops = SLOT(sp, self->s[S_STOP_IDS]);
    if (stops == NULL || !PyTuple_CheckExact(stops) || PyTuple_GET_SIZE(stops) != 0)
        return PLAIN_NO; /* stop ids: the Python body checks them */
    Py_ssize_t k = num_tokens - int_slot(req, r[R_NUM_PROMPT], &ok);
    Py_ssize_t max_tokens = int_slot(req, r[R_MAX_TOKENS], &ok);
    if (!ok || k + 1 >= max_tokens)
        return PLAIN_NO; /* its last token */
    PyObject *chain = SLOT(req, r[R_HASH_CHAIN]);
    if (chain == NULL)
        return PLAIN_NO;
    int hashes = 0; /* the token fills a block to hash */
    if (chain != Py_None) {
        Py_ssize_t hbs = int_slot(req, r[R_HASH_BLOCK_SIZE], &ok);
        if (!ok || hbs <= 0 || SLOT(req, r[R_BLOCK_HASHES]) == NULL)
            return PLAIN_NO;
        hashes = (num_tokens + 1) % hbs == 0;
    }
    /* The token (a new reference). */
    PyObject *tok;
    if (emit) {
        PyObject *drawn = SLOT(req, r[R_DRAWN]);
        if (drawn == NULL || !PyList_CheckExact(drawn))
            return PLAIN_NO;
        Py_ssize_t j = k - int_slot(req, r[R_DRAWN_FROM], &ok);
        if (!ok || j < 0 || j >= PyList_GET_SIZE(drawn))
            return PLAIN_NO; /* past its window: `draw` */
        tok = PyList_GET_ITEM(drawn, j);
        Py_INCREF(tok);
    } else if (column != Py_None) {
        Py_ssize_t m = PyList_GET_SIZE(column);
        if (m == 0)
            return PLAIN_NO;
        tok = PyList_GET_ITEM(column, m - 1);
        Py_INCREF(tok);
    } else {
        Py_ssize_t min_tokens = int_slot(sp, self->s[S_MIN_TOKENS], &ok);
        PyObject *ignore = SLOT(sp, self->s[S_IGNORE_EOS]);
        if (!ok || ignore == NULL)
            return PLAIN_NO;
        int ignored = PyObject_IsTrue(ignore);
        if (ignored < 0)
            return PLAIN_ERROR;
        PyObject *seed = SLOT(req, r[R_TOKEN_SEED]);
        if (seed == NULL)
            return PLAIN_NO;
        PyObject *kk = PyLong_FromSsize_t(k);
        if (kk == NULL)
            return PLAIN_ERROR;
        PyObject *argv[3] = {seed, kk, (!ignored && k >= min_tokens) ? Py_True : Py_False};
        tok = PyObject_Vectorcall(token, argv, 3, NULL);
        Py_DECREF(kk);
        if (tok == NULL)
            return PLAIN_ERROR;
    }
    if (!PyLong_CheckExact(tok)) {
        Py_DECREF(tok);
        return PLAIN_NO;
    }
    if (self->eos != Py_None) {
        int same = PyObject_RichCompareBool(tok, self->eos, Py_EQ);
        if (same != 0) {
            Py_DECREF(tok);
            return same < 0 ? PLAIN_ERROR : PLAIN_NO; /* EOS ends it (unless ignored) */
        }
    }
    /* Everything is known: apply it (as `_advance_one` would, in its order). */
    double last_s = PyFloat_AS_DOUBLE(last); /* (read before `cache` runs Python code) */
    PyObject *latency = NULL;
    PyObject *computed_obj = PyLong_FromSsize_t(computed);
    if (computed_obj == NULL)
        goto fail;
    set_slot(req, r[R_NUM_COMPUTED], computed_obj);
    computed_obj = NULL;
    if (fills) {
        PyObject *done = PyObject_Vectorcall(cache, &req, 1, NULL);
        if (done == NULL)
            goto fail;
        Py_DECREF(done);
        tokens = SLOT(req, r[R_TOKENS]);
        if (tokens == NULL) {
            PyErr_SetString(PyExc_AttributeError, "Advancer: a request slot is unset");
            goto fail;
        }
    }
    latency = PyFloat_FromDouble(end_s - last_s);
    if (latency == NULL)
        goto fail;
    if (PyList_CheckExact(tokens)) {
        if (PyList_Append(tokens, tok) < 0)
            goto fail;
    } else {
        PyObject *done = PyObject_CallMethod(tokens, "append", "O", tok);
        if (done == NULL)
            goto fail;
        Py_DECREF(done);
    }
    if (!emit && column != Py_None) {
        /* (the column's last item is `tok`: dropped as `pop` would) */
        if (PyList_SetSlice(column, PyList_GET_SIZE(column) - 1, PyList_GET_SIZE(column),
                            NULL) < 0)
            goto fail;
    }
    if (hashes) {
        /* chain.extend(block_hashes, tokens, hash_block_size) (the slots read again: `cache`
         * ran Python code in between) */
        PyObject *argv[4] = {SLOT(req, r[R_HASH_CHAIN]), SLOT(req, r[R_BLOCK_HASHES]),
                             tokens, SLOT(req, r[R_HASH_BLOCK_SIZE])};
        if (argv[0] == NULL || argv[1] == NULL || argv[3] == NULL) {
            PyErr_SetString(PyExc_AttributeError, "Advancer: a request slot is unset");
            goto fail;
        }
        PyObject *done = PyObject_VectorcallMethod(str_extend, argv, 4, NULL);
        if (done == NULL)
            goto fail;
        Py_DECREF(done);
    }
    Py_INCREF(end);
    set_slot(req, r[R_LAST_TOKEN_TIME], end);
    if (!emit) {
        Py_DECREF(tok);
        Py_DECREF(latency);
        return PLAIN_YES;
    }
    PyTypeObject *ot = self->output_type;
    PyObject *out = ot->tp_alloc(ot, 0);
    PyObject *ids = PyList_New(1);
    if (out == NULL || ids == NULL) {
        Py_XDECREF(out);
        Py_XDECREF(ids);
        goto fail;
    }
    PyList_SET_ITEM(ids, 0, tok); /* (steals it) */
    tok = NULL;
    const Py_ssize_t *o = self->o;
    PyObject *rid = SLOT(req, r[R_REQUEST_ID]);
    PyObject *nprompt = SLOT(req, r[R_NUM_PROMPT]);
    PyObject *ncached = SLOT(req, r[R_NUM_CACHED_TOKENS]);
    PyObject *hits = SLOT(req, r[R_TIER_HITS]);
    if (rid == NULL || ncached == NULL || hits == NULL) {
        Py_DECREF(ids);
        Py_DECREF(out);
        PyErr_SetString(PyExc_AttributeError, "Advancer: a request slot is unset");
        goto fail;
    }
    Py_INCREF(rid);
    Py_INCREF(nprompt);
    Py_INCREF(ncached);
    Py_INCREF(hits);
    Py_INCREF(end);
    SLOT(out, o[O_REQUEST_ID]) = rid;
    SLOT(out, o[O_NEW_IDS]) = ids;
    SLOT(out, o[O_TIME]) = end;
    SLOT(out, o[O_FINISHED]) = Py_NewRef(Py_False);
    SLOT(out, o[O_FINISH_REASON]) = Py_NewRef(Py_None);
    SLOT(out, o[O_NUM_PROMPT]) = nprompt;
    SLOT(out, o[O_NUM_CACHED]) = ncached;
    SLOT(out, o[O_TIER_HITS]) = hits;
    SLOT(out, o[O_FIRST]) = Py_NewRef(Py_False);
    SLOT(out, o[O_LATENCY]) = latency;
    SLOT(out, o[O_KV_PARAMS]) = Py_NewRef(Py_None);
    int appended = PyList_Append(outputs, out);
    Py_DECREF(out);
    return appended < 0 ? PLAIN_ERROR : PLAIN_YES;
fail:
    Py_XDECREF(tok);
    Py_XDECREF(computed_obj);
    Py_XDECREF(latency);
    return PLAIN_ERROR;
}

/* Prefetching a pass's requests ahead of the one being advanced. With hundreds of streams,
 * everything a request's token touches has left the caches since the last pass (the other
 * requests' objects and the kernel's socket writes came between), and the token waited on
 * each object in turn: the request's slots (on all five of its cache lines: CPython lays
 * `__slots__` out by name), then its sampling parameters, its lists, their items. So the
 * loop asks for the request FAR_AHEAD entries on and, once that has had time to arrive, for
 * the objects its slots name NEAR_AHEAD entries on; the loads then overlap other requests'
 * work. A prefetch never faults and changes nothing; a slot not of the expected type is
 * simply not followed. */
enum { FAR_AHEAD = 16, NEAR_AHEAD = 8, ITEM_AHEAD = 4, TOKEN_AHEAD = 2, REQUEST_LINES = 6 };
/* Smaller passes (a replay's engines run a few requests each) stay in the caches from one
 * pass to the next, and the cursors' walk would cost them more than it could save. */
enum { PREFETCH_FROM = 32 };

static inline void prefetch_request(PyObject *req)
{
    const char *at = (const char *)req;
    for (int line = 0; line < REQUEST_LINES; line++)
        __builtin_prefetch(at + 64 * line);
}

static inline void prefetch_parts(Advancer *self, PyObject *req)
{
    const Py_ssize_t *r = self->r;
    if (Py_TYPE(req) != self->request_type)
        return;
    PyObject *sp = SLOT(req, r[R_SAMPLING]);
    if (sp != NULL) {
        __builtin_prefetch(sp);
        __builtin_prefetch((char *)sp + self->s[S_STOP_IDS]);
    }
    PyObject *v = SLOT(req, r[R_LAST_TOKEN_TIME]);
    if (v != NULL)
        __builtin_prefetch(v);
    v = SLOT(req, r[R_NUM_COMPUTED]);
    if (v != NULL)
        __builtin_prefetch(v);
    PyObject *tokens = SLOT(req, r[R_TOKENS]);
    if (tokens != NULL && PyList_CheckExact(tokens)) /* (its header: size, items) */
        __builtin_prefetch(tokens);
    PyObject *drawn = SLOT(req, r[R_DRAWN]);
    if (drawn != NULL && PyList_CheckExact(drawn))
        __builtin_prefetch(drawn);
}

/* Where the request's next drawn token is (&drawn[j], as `plain` finds it), or NULL. */
static inline PyObject **next_drawn(Advancer *self, PyObject *req)
{
    const Py_ssize_t *r = self->r;
    if (Py_TYPE(req) != self->request_type)
        return NULL;
    PyObject *tokens = SLOT(req, r[R_TOKENS]), *drawn = SLOT(req, r[R_DRAWN]);
    PyObject *prompt = SLOT(req, r[R_NUM_PROMPT]), *from = SLOT(req, r[R_DRAWN_FROM]);
    if (tokens == NULL || drawn == NULL || prompt == NULL || from == NULL ||
        !PyList_CheckExact(tokens) || !PyList_CheckExact(drawn) || !PyLong_CheckExact(prompt) ||
        !PyLong_CheckExact(from))
        return NULL;
    Py_ssize_t p = PyLong_AsSsize_t(prompt), f = p == -1 ? -1 : PyLong_AsSsize_t(from);
    if (p < 0 || f < 0) { /* (what `plain` would refuse: nothing to fetch) */
        if (PyErr_Occurred())
            PyErr_Clear();
        return NULL;
    }
    Py_ssize_t j = PyList_GET_SIZE(tokens) - p; /* (a list's size is far from the bounds) */
    if (j < f)
        return NULL;
    j -= f;
    return j < PyList_GET_SIZE(drawn) ? &PyList_GET_ITEM(drawn, j) : NULL;
}

/* A cursor `ahead` entries past the loop's in `scheduled` (0 once past the end). */
typedef struct {
    Py_ssize_t pos;
    int live;
} Cursor;

static inline void cursor_start(Cursor *c, PyObject *scheduled, int ahead)
{
    PyObject *key, *value;
    c->pos = 0;
    c->live = 1;
    for (int i = 0; i < ahead && c->live; i++)
        c->live = PyDict_Next(scheduled, &c->pos, &key, &value);
}

static inline PyObject *cursor_next(Cursor *c, PyObject *scheduled)
{
    PyObject *key, *value;
    if (c->live && (c->live = PyDict_Next(scheduled, &c->pos, &key, &value)))
        return key;
    return NULL;
}

/* run(scheduled, end, emit, column, registered, token, cache, outputs, slow) -> partial
 *
 * scheduled: {request: tokens scheduled} in pass order; end: the pass's end (a float);
 * emit: build outputs; column: a replay pass's tokens listed last first, or None; registered:
 * the requests whose blocks were registered as scheduled (the store policy hears of them),
 * or None; token: the sampler's `token(seed, k, eos_allowed)` (a replay pass without a
 * column); cache: `EngineCore._cache_computed`, for a request whose block is full; outputs:
 * where outputs go. Every other request goes to slow(request, n), which
 * answers 1 for a prefill chunk short of its prompt's end, else 0. Returns how many answered
 * 1. */
static PyObject *advancer_run(Advancer *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "run() takes 9 arguments");
        return NULL;
    }
    PyObject *scheduled = args[0], *end = args[1], *column = args[3], *registered = args[4];
    PyObject *token = args[5], *cache = args[6], *outputs = args[7], *slow = args[8];
    int emit = PyObject_IsTrue(args[2]);
    if (emit < 0)
        return NULL;
    if (!PyDict_Check(scheduled) || !PyList_CheckExact(outputs) ||
        (column != Py_None && !PyList_CheckExact(column)) ||
        (registered != Py_None && !PyDict_Check(registered))) {
        PyErr_SetString(PyExc_TypeError,
                        "run(dict, end, emit, list | None, dict | None, token, cache, list, slow)");
        return NULL;
    }
    /* An end that is not a float (a test's int): every request takes the Python body. */
    int floats = PyFloat_CheckExact(end);
    double end_s = floats ? PyFloat_AS_DOUBLE(end) : 0.0;
    Py_ssize_t pos = 0, partial = 0;
    PyObject *req, *num;
    /* Cursors ahead of this one, each fetching the next link of a request's chain (see
     * `prefetch_request`); the first few requests are fetched as the cursors start. */
    Cursor far = {0, 0}, near = {0, 0}, item = {0, 0}, tok_at = {0, 0};
    PyObject *ahead;
    if (PyDict_GET_SIZE(scheduled) >= PREFETCH_FROM) {
        cursor_start(&far, scheduled, 0);
        for (int i = 0; i < FAR_AHEAD; i++)
            if ((ahead = cursor_next(&far, scheduled)) != NULL)
                prefetch_request(ahead);
        cursor_start(&near, scheduled, NEAR_AHEAD);
        cursor_start(&item, scheduled, ITEM_AHEAD);
        cursor_start(&tok_at, scheduled, TOKEN_AHEAD);
    }
    while (PyDict_Next(scheduled, &pos, &req, &num)) {
        if ((ahead = cursor_next(&far, scheduled)) != NULL)
            prefetch_request(ahead);
        if ((ahead = cursor_next(&near, scheduled)) != NULL)
            prefetch_parts(self, ahead);
        PyObject **next;
        if ((ahead = cursor_next(&item, scheduled)) != NULL && (next = next_drawn(self, ahead)))
            __builtin_prefetch(next);
        if ((ahead = cursor_next(&tok_at, scheduled)) != NULL && (next = next_drawn(self, ahead)))
            __builtin_prefetch(*next);
        int done = PLAIN_NO;
        if (floats && PyLong_CheckExact(num)) {
            Py_ssize_t n = PyLong_AsSsize_t(num);
            if (n == -1 && PyErr_Occurred())
                PyErr_Clear();
            else
                done = plain(self, req, n, end, end_s, emit, column, registered, token, cache,
                             outputs);
        }
        if (done == PLAIN_ERROR)
            return NULL;
        if (done == PLAIN_YES)
            continue;
        /* (The slow body may not change `scheduled`: the pass's requests are fixed.) */
        PyObject *argv[2] = {req, num};
        PyObject *res = PyObject_Vectorcall(slow, argv, 2, NULL);
        if (res == NULL)
            return NULL;
        Py_ssize_t p = PyLong_AsSsize_t(res);
        Py_DECREF(res);
        if (p == -1 && PyErr_Occurred())
            return NULL;
        partial += p;
    }
    return PyLong_FromSsize_t(partial);
}

/* splitmix64 (mocker.mixing) */
static inline uint64_t mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* mocker.output_tokens.palette_rank: an octave of the palette from the low 32 bits, then an
 * entry inside it from the high 32, each by a multiply-shift (a Zipf-like law; see there).
 * (A palette is below 2**32 entries, token ids being uint32: the products fit 64 bits.) */
static inline uint64_t rank(uint64_t m, uint64_t n, uint64_t octaves)
{
    uint64_t e = ((m & 0xFFFFFFFFu) * octaves) >> 32;
    uint64_t first = ((uint64_t)1 << e) - 1;
    uint64_t end = e + 1 == octaves ? n : 2 * first + 1; /* the last octave runs to n */
    return first + (((m >> 32) * (end - first)) >> 32);
}

static uint64_t octaves_of(uint64_t n)
{
    uint64_t octaves = 0; /* (n + 1).bit_length() - 1 */
    for (uint64_t v = n + 1; v > 1; v >>= 1)
        octaves++;
    return octaves;
}

/* draws(seed, start, count, eos_from, palette, eos_token_id, eos_threshold) -> list
 *
 * OutputTokenSampler.draws (its numpy code is the reference): token k for k in start ..
 * start+count-1 is palette[palette_rank(m, len(palette))] with m = splitmix64(seed + k mod 2**64),
 * or EOS where k >= eos_from and (splitmix64(m) >> 11) < eos_threshold. The list holds the
 * palette's own int objects (no int is made per token). */
static PyObject *draws(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "draws(seed, start, count, eos_from, palette, eos_token_id, threshold)");
        return NULL;
    }
    PyObject *palette = args[4], *eos = args[5];
    if (!PyLong_Check(args[0]) || !PyList_CheckExact(palette) || PyList_GET_SIZE(palette) == 0) {
        PyErr_SetString(PyExc_TypeError, "draws: an int seed and a non-empty palette list");
        return NULL;
    }
    uint64_t seed = PyLong_AsUnsignedLongLongMask(args[0]);
    if (seed == (uint64_t)-1 && PyErr_Occurred())
        return NULL;
    long long start = PyLong_AsLongLong(args[1]);
    Py_ssize_t count = PyLong_AsSsize_t(args[2]);
    long long eos_from = PyLong_AsLongLong(args[3]);
    unsigned long long threshold = PyLong_AsUnsignedLongLong(args[6]);
    if (PyErr_Occurred())
        return NULL;
    if (start < 0) {
        PyErr_SetString(PyExc_ValueError, "draws: start must be >= 0");
        return NULL;
    }
    if (count < 0)
        count = 0;
    uint64_t n = (uint64_t)PyList_GET_SIZE(palette), octaves = octaves_of(n);
    PyObject *out = PyList_New(count);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        long long k = start + i;
        uint64_t m = mix(seed + (uint64_t)k);
        PyObject *tok = (threshold && k >= eos_from && (mix(m) >> 11) < threshold)
                            ? eos
                            : PyList_GET_ITEM(palette, (Py_ssize_t)rank(m, n, octaves));
        Py_INCREF(tok);
        PyList_SET_ITEM(out, i, tok);
    }
    return out;
}

/* A list of ints' values masked to 64 bits (seed + index wraps as numpy's uint64 does), in a
 * new buffer of `n`; NULL with an error set. */
static uint64_t *u64s(PyObject *list, Py_ssize_t n, const char *who)
{
    if (!PyList_CheckExact(list) || PyList_GET_SIZE(list) != n) {
        PyErr_Format(PyExc_TypeError, "%s: lists of %zd ints", who, n);
        return NULL;
    }
    uint64_t *out = PyMem_Malloc((n ? n : 1) * sizeof(uint64_t));
    if (out == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(list, i);
        if (!PyLong_Check(v)) {
            PyMem_Free(out);
            PyErr_Format(PyExc_TypeError, "%s: lists of %zd ints", who, n);
            return NULL;
        }
        out[i] = PyLong_AsUnsignedLongLongMask(v);
        if (out[i] == (uint64_t)-1 && PyErr_Occurred()) {
            PyMem_Free(out);
            return NULL;
        }
    }
    return out;
}

/* rows(seeds, starts, count, palette_ids) -> bytes
 *
 * OutputTokenSampler.token_rows (its numpy code is the reference): for each request i, the
 * ids palette_ids[palette_rank(splitmix64(seeds[i] + starts[i] + k))] for k < count, row
 * after row, as native uint32 (an array('I')'s bytes). `palette_ids`: a buffer of uint32. */
static PyObject *rows(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyList_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "rows(seeds, starts, count, palette_ids)");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(args[0]), count = PyLong_AsSsize_t(args[2]);
    if (count == -1 && PyErr_Occurred())
        return NULL;
    if (count < 0)
        count = 0;
    Py_buffer ids;
    if (PyObject_GetBuffer(args[3], &ids, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    PyObject *out = NULL;
    uint64_t *seeds = NULL, *starts = NULL;
    const char *format = ids.format == NULL ? "B" : ids.format;
    if (*format == '@' || *format == '=' || (*format == '<' && PY_LITTLE_ENDIAN))
        format++; /* (native or standard order: this machine's) */
    if (ids.itemsize != 4 || ids.len == 0 || strcmp(format, "I") != 0) {
        PyErr_SetString(PyExc_TypeError, "rows: palette_ids must be a non-empty uint32 buffer");
        goto done;
    }
    if ((seeds = u64s(args[0], n, "rows")) == NULL || (starts = u64s(args[1], n, "rows")) == NULL)
        goto done;
    if (count > 0 && n > PY_SSIZE_T_MAX / 4 / count) {
        PyErr_NoMemory();
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, n * count * 4);
    if (out == NULL)
        goto done;
    const uint32_t *palette = ids.buf;
    uint64_t size = (uint64_t)(ids.len / 4), octaves = octaves_of(size);
    uint32_t *to = (uint32_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t x = seeds[i] + starts[i];
        for (Py_ssize_t k = 0; k < count; k++)
            *to++ = palette[rank(mix(x + (uint64_t)k), size, octaves)];
    }
done:
    PyMem_Free(seeds);
    PyMem_Free(starts);
    PyBuffer_Release(&ids);
    return out;
}

/* column(seeds, indexes, palette) -> list
 *
 * OutputTokenSampler.token_column (its numpy code is the reference): for each pair,
 * palette[palette_rank(splitmix64(seeds[i] + indexes[i]))], the palette's own ints. */
static PyObject *column(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[2]) ||
        PyList_GET_SIZE(args[2]) == 0) {
        PyErr_SetString(PyExc_TypeError, "column(seeds, indexes, palette): lists");
        return NULL;
    }
    PyObject *palette = args[2];
    Py_ssize_t n = PyList_GET_SIZE(args[0]);
    uint64_t *seeds = u64s(args[0], n, "column"), *indexes = NULL;
    if (seeds == NULL || (indexes = u64s(args[1], n, "column")) == NULL) {
        PyMem_Free(seeds);
        return NULL;
    }
    uint64_t size = (uint64_t)PyList_GET_SIZE(palette), octaves = octaves_of(size);
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *tok = PyList_GET_ITEM(palette, rank(mix(seeds[i] + indexes[i]), size, octaves));
        PyList_SET_ITEM(out, i, Py_NewRef(tok));
    }
    PyMem_Free(seeds);
    PyMem_Free(indexes);
    return out;
}

/* deliver(streams, outputs, hand) -> the kept outputs, or None when every one was kept
 *
 * mocker.engine.stream's `deliver` loop (its Python loop is the reference): each output goes
 * to its open stream (streams[out.request_id], not finished): a one-token output that ends
 * nothing to the stream's `sink` when it has one and the sink takes it (returns True), every
 * other one to hand(streams, stream, out). Outputs whose stream is gone or finished are not
 * kept. */
/* Prefetching the outputs ahead of the one handed out, as `advancer_run` does its requests:
 * each output's stream, its sink and what the sink touches have left the caches since the
 * stream's last token (the other streams' writes came between). An output `stage` entries
 * ahead goes through one stage a step, each reading what the one before fetched: the output
 * and its request id's string (whose hash the lookup reads), its stream, its sink, the
 * sink's own parts, then what those point to (the Warmable protocol, mocker/_cslots.h).
 * Prefetching changes nothing: the hand-out below reads everything again as before.
 *
 * What a stage found is kept for the next in `Ahead`: the stream held from the stage that
 * finds it (nothing public proves a borrowed one alive later), the sink first kept borrowed
 * while the held stream still names it, then held. */
enum { STAGES = 6, RING = STAGES + 1 };

typedef struct {
    PyObject *stream; /* a new reference, or NULL */
    PyObject *named;  /* the stream's sink, borrowed (alive while `stream` names it) */
    PyObject *sink;   /* a new reference, or NULL */
    Py_ssize_t id;    /* the token id, -1 if none */
} Ahead;

static PyTypeObject *warmable; /* the last type found to be a Warmable (held) */

static Py_ssize_t warm_calls; /* sinks warmed (`_warm_calls`: tests see the path run) */

/* Whether `type` is the Warmable: its name, and what only a C extension's static type can
 * have (a Python class can take any name, not this layout), checked once per type. */
static int is_warmable(PyTypeObject *type)
{
    if (type == warmable)
        return 1;
    if ((type->tp_flags & Py_TPFLAGS_HEAPTYPE) || strcmp(type->tp_name, WARMABLE_TYPE) != 0 ||
        type->tp_basicsize < (Py_ssize_t)sizeof(Warmable) ||
        type->tp_vectorcall_offset != offsetof(Warmable, vectorcall))
        return 0;
    Py_INCREF(type);
    Py_XSETREF(warmable, type);
    return 1;
}

static void release(Ahead *a)
{
    Py_CLEAR(a->stream);
    Py_CLEAR(a->sink);
    a->named = NULL;
    a->id = -1;
}

/* Output `j`, `stage` steps before it is handed out (stages STAGES .. 1). */
static void look_ahead(PyObject *streams, PyObject *outputs, Py_ssize_t j, int stage,
                       Ahead *ahead)
{
    if (j >= PyList_GET_SIZE(outputs))
        return;
    PyObject *out = PyList_GET_ITEM(outputs, j);
    if (stage == STAGES) {
        __builtin_prefetch(out);
        return;
    }
    if (Py_TYPE(out) != out_layout.type || out_layout.off[0] < 0)
        return;
    PyObject *rid = SLOT(out, out_layout.off[0]);
    if (stage == STAGES - 1) {
        __builtin_prefetch(rid); /* (a prefetch never faults: checked at the next stage) */
        return;
    }
    if (rid == NULL || !PyUnicode_CheckExact(rid))
        return;
    Ahead *a = &ahead[j % RING];
    switch (stage) {
    case STAGES - 2: {
        PyObject *stream = PyDict_GetItemWithError(streams, rid);
        if (stream == NULL) {
            PyErr_Clear();
            return;
        }
        Py_XSETREF(a->stream, Py_NewRef(stream));
        __builtin_prefetch(stream, 1); /* (for the reference taken next) */
        if (Py_TYPE(stream) == stream_layout.type && stream_layout.off[1] >= 0)
            __builtin_prefetch((char *)stream + stream_layout.off[1]);
        /* and the token's int, read two stages on */
        PyObject *ids = out_layout.off[2] >= 0 ? SLOT(out, out_layout.off[2]) : NULL;
        if (ids != NULL && PyList_CheckExact(ids) && PyList_GET_SIZE(ids) == 1)
            __builtin_prefetch(PyList_GET_ITEM(ids, 0));
        return;
    }
    case STAGES - 3: {
        PyObject *stream = a->stream;
        if (stream == NULL || Py_TYPE(stream) != stream_layout.type || stream_layout.off[1] < 0)
            return;
        PyObject *sink = SLOT(stream, stream_layout.off[1]);
        if (sink != NULL) {
            a->named = sink;
            __builtin_prefetch(sink, 1);
            __builtin_prefetch((char *)sink + 64);
        }
        return;
    }
    case STAGES - 4: {
        PyObject *stream = a->stream;
        if (stream == NULL || a->named == NULL || Py_TYPE(stream) != stream_layout.type ||
            SLOT(stream, stream_layout.off[1]) != a->named || !is_warmable(Py_TYPE(a->named)))
            return;
        Py_XSETREF(a->sink, Py_NewRef(a->named));
        PyObject *ids = out_layout.off[2] >= 0 ? SLOT(out, out_layout.off[2]) : NULL;
        a->id = -1;
        if (ids != NULL && PyList_CheckExact(ids) && PyList_GET_SIZE(ids) == 1 &&
            PyLong_CheckExact(PyList_GET_ITEM(ids, 0))) {
            a->id = PyLong_AsSsize_t(PyList_GET_ITEM(ids, 0));
            if (a->id == -1 && PyErr_Occurred())
                PyErr_Clear();
        }
        ((Warmable *)a->sink)->warm(a->sink, a->id, 0);
        warm_calls++;
        return;
    }
    default: /* the last: what the sink's parts point to */
        if (a->sink != NULL)
            ((Warmable *)a->sink)->warm(a->sink, a->id, 1);
    }
}

static PyObject *deliver(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "deliver(streams, outputs, hand)");
        return NULL;
    }
    PyObject *streams = args[0], *outputs = args[1], *hand = args[2];
    if (!PyDict_Check(streams) || !PyList_CheckExact(outputs)) {
        PyErr_SetString(PyExc_TypeError, "deliver(dict, list, hand)");
        return NULL;
    }
    PyObject *kept = NULL;
    PyObject *const out_names[3] = {str_request_id, str_finished, str_new_token_ids};
    PyObject *const stream_names[2] = {str_finished, str_sink};
    Ahead ahead[RING] = {{NULL, NULL, NULL, -1}};
    for (int k = 1; k < RING; k++)
        ahead[k] = ahead[0];
    int warm = PyList_GET_SIZE(outputs) >= PREFETCH_FROM;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(outputs); i++) {
        PyObject *out = Py_NewRef(PyList_GET_ITEM(outputs, i));
        PyObject *stream = NULL, *sink = NULL;
        layout_of(&out_layout, Py_TYPE(out), out_names, 3);
        if (warm) {
            if (i == 0) /* the first outputs: the stages they had no steps for, at once */
                for (Py_ssize_t j = 0; j < STAGES; j++)
                    for (int stage = STAGES; stage > j; stage--)
                        look_ahead(streams, outputs, j, stage, ahead);
            for (int stage = STAGES; stage >= 1; stage--)
                look_ahead(streams, outputs, i + stage, stage, ahead);
            release(&ahead[i % RING]);
        }
        const Py_ssize_t *o = out_layout.off;
        PyObject *rid = read_slot(out, o[0], str_request_id);
        if (rid == NULL)
            goto fail;
        stream = Py_XNewRef(PyDict_GetItemWithError(streams, rid));
        Py_DECREF(rid);
        int open = 0;
        if (stream != NULL) {
            layout_of(&stream_layout, Py_TYPE(stream), stream_names, 2);
            int ended = flag_of(stream, stream_layout.off[0], str_finished);
            if (ended < 0)
                goto fail;
            open = !ended;
        } else if (PyErr_Occurred()) {
            goto fail;
        }
        if (!open) {
            if (kept == NULL && (kept = PyList_GetSlice(outputs, 0, i)) == NULL)
                goto fail;
            Py_DECREF(out);
            Py_XDECREF(stream);
            continue;
        }
        int taken = 0;
        sink = read_slot(stream, stream_layout.off[1], str_sink);
        if (sink == NULL)
            goto fail;
        if (sink != Py_None) {
            int finished = flag_of(out, o[1], str_finished);
            if (finished < 0)
                goto fail;
            PyObject *ids = finished ? NULL : read_slot(out, o[2], str_new_token_ids);
            if (!finished && ids == NULL)
                goto fail;
            if (ids != NULL && PyList_CheckExact(ids) && PyList_GET_SIZE(ids) == 1) {
                PyObject *tok = PyList_GET_ITEM(ids, 0);
                PyObject *took = PyObject_Vectorcall(sink, &tok, 1, NULL);
                if (took == NULL) {
                    Py_DECREF(ids);
                    goto fail;
                }
                taken = PyObject_IsTrue(took);
                Py_DECREF(took);
            }
            Py_XDECREF(ids);
            if (taken < 0)
                goto fail;
        }
        if (!taken) {
            PyObject *argv[3] = {streams, stream, out};
            PyObject *done = PyObject_Vectorcall(hand, argv, 3, NULL);
            if (done == NULL)
                goto fail;
            Py_DECREF(done);
        }
        if (kept != NULL && PyList_Append(kept, out) < 0)
            goto fail;
        Py_DECREF(out);
        Py_DECREF(stream);
        Py_DECREF(sink);
        continue;
    fail:
        Py_DECREF(out);
        Py_XDECREF(stream);
        Py_XDECREF(sink);
        Py_XDECREF(kept);
        for (int k = 0; k < RING; k++)
            release(&ahead[k]);
        return NULL;
    }
    for (int k = 0; k < RING; k++)
        release(&ahead[k]);
    if (kept == NULL)
        Py_RETURN_NONE;
    return kept;
}

static PyObject *warm_count(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromSsize_t(warm_calls);
}

static PyMethodDef module_methods[] = {
    {"draws", (PyCFunction)(void (*)(void))draws, METH_FASTCALL,
     "draws(seed, start, count, eos_from, palette, eos_token_id, eos_threshold) -> list"},
    {"rows", (PyCFunction)(void (*)(void))rows, METH_FASTCALL,
     "rows(seeds, starts, count, palette_ids) -> bytes of uint32"},
    {"column", (PyCFunction)(void (*)(void))column, METH_FASTCALL,
     "column(seeds, indexes, palette) -> list"},
    {"_warm_calls", (PyCFunction)warm_count, METH_NOARGS,
     "How many sinks `deliver` has warmed ahead (for tests)."},
    {"deliver", (PyCFunction)(void (*)(void))deliver, METH_FASTCALL,
     "deliver(streams, outputs, hand) -> the kept outputs, or None when every one was kept"},
    {NULL, NULL, 0, NULL},
};

/* decodes(running, start, budget, scheduled, allocate) -> (index, budget, decodes)
 *
 * The head of running.py's schedule_running (its Python loop is the reference, and goes on
 * from the index returned): from running[start] on, while the budget lasts, each request
 * that decodes one token (its computed tokens one short of its tokens, past its prompt) and
 * has room for it in its blocks, or gets it from allocate(request, 1), is scheduled for 1
 * token (scheduled[request] = 1). Stops, changing nothing for it, at the first request
 * that does not (a prefill, a hybrid group's recheck) or whose allocation fails (the
 * Python loop then preempts; only given an `allocate` that changes nothing when it fails). */
static PyObject *advancer_decodes(Advancer *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "decodes() takes 5 arguments");
        return NULL;
    }
    PyObject *running = args[0], *scheduled = args[3], *allocate = args[4];
    Py_ssize_t i = PyLong_AsSsize_t(args[1]), budget = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred())
        return NULL;
    if (!PyList_CheckExact(running) || !PyDict_Check(scheduled) || i < 0) {
        PyErr_SetString(PyExc_TypeError, "decodes(list, start >= 0, budget, dict, allocate)");
        return NULL;
    }
    const Py_ssize_t *r = self->r;
    Py_ssize_t bs = self->block_size, count = 0;
    PyObject *one = PyLong_FromLong(1);
    if (one == NULL)
        return NULL;
    while (i < PyList_GET_SIZE(running) && budget > 0) {
        PyObject *req = PyList_GET_ITEM(running, i);
        if (Py_TYPE(req) != self->request_type)
            break;
        int ok = 1;
        PyObject *tokens = SLOT(req, r[R_TOKENS]), *blocks = SLOT(req, r[R_BLOCKS]);
        if (tokens == NULL || blocks == NULL || !PyList_CheckExact(blocks))
            break;
        Py_ssize_t num_tokens = PyList_CheckExact(tokens) ? PyList_GET_SIZE(tokens)
                                                            : PyObject_Size(tokens);
        if (num_tokens < 0) {
            PyErr_Clear();
            break;
        }
        Py_ssize_t computed = int_slot(req, r[R_NUM_COMPUTED], &ok);
        Py_ssize_t prompt = int_slot(req, r[R_NUM_PROMPT], &ok);
        Py_ssize_t recheck = int_slot(req, r[R_KV_RECHECK], &ok);
        if (!ok || computed != num_tokens - 1 || num_tokens <= prompt || computed >= recheck)
            break;
        if (computed + 1 > PyList_GET_SIZE(blocks) * bs) {
            PyObject *argv[2] = {req, one};
            PyObject *got = PyObject_Vectorcall(allocate, argv, 2, NULL);
            if (got == NULL) {
                Py_DECREF(one);
                return NULL;
            }
            int room = PyObject_IsTrue(got);
            Py_DECREF(got);
            if (room < 0) {
                Py_DECREF(one);
                return NULL;
            }
            if (!room)
                break;
        }
        if (PyDict_SetItem(scheduled, req, one) < 0) {
            Py_DECREF(one);
            return NULL;
        }
        budget--;
        count++;
        i++;
    }
    Py_DECREF(one);
    return Py_BuildValue("(nnn)", i, budget, count);
}

static PyMethodDef advancer_methods[] = {
    {"decodes", (PyCFunction)(void (*)(void))advancer_decodes, METH_FASTCALL,
     "decodes(running, start, budget, scheduled, allocate) -> (index, budget, decodes)"},
    {"run", (PyCFunction)(void (*)(void))advancer_run, METH_FASTCALL,
     "run(scheduled, end, emit, column, registered, token, cache, outputs, slow) -> partial"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject AdvancerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mocker.engine._cpass.Advancer",
    .tp_basicsize = sizeof(Advancer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A pass's plain decode tokens applied in C (EngineCore._advance).",
    .tp_new = advancer_new,
    .tp_dealloc = (destructor)advancer_dealloc,
    .tp_methods = advancer_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "mocker.engine._cpass",
    "A pass's plain decode tokens applied, and output tokens drawn ahead, in C.", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__cpass(void)
{
    if (PyType_Ready(&AdvancerType) < 0)
        return NULL;
    str_extend = PyUnicode_InternFromString("extend");
    str_request_id = PyUnicode_InternFromString("request_id");
    str_finished = PyUnicode_InternFromString("finished");
    str_sink = PyUnicode_InternFromString("sink");
    str_new_token_ids = PyUnicode_InternFromString("new_token_ids");
    if (!str_extend || !str_request_id || !str_finished || !str_sink || !str_new_token_ids)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&AdvancerType);
    if (PyModule_AddObject(m, "Advancer", (PyObject *)&AdvancerType) < 0) {
        Py_DECREF(&AdvancerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
