/* A pass's simple decode tokens in C: applied to their requests, drawn ahead, handed out.
 *
 * `DecodeApplier`: `EngineCore._advance` (mocker/engine/core_pass.py) hands a pass's scheduled requests
 * to `DecodeApplier.run`, which applies those whose token ends nothing (below) and hands every
 * other one to the Python body (`EngineCore._advance_one`). That body stays the reference:
 * with MOCKER_COMPILED=0, or when this was not built, it applies every request
 * (tests/engine/test_cpass.py compares the two pass by pass).
 *
 * Why: in a live server's steady decode the per-token bookkeeping of `_advance` (about 30
 * attribute reads and writes, an output object) is a large share of the Python work a
 * streamed token costs. Here the request's slots are read and written through their member
 * descriptors (mocker/_cfields.h), with no bytecode and no name lookup between them.
 *
 * A request takes the simple path when, with its scheduled tokens, it reaches the end of its
 * known tokens (it samples) and: the store policy hears of no block registered as scheduled
 * (not in `registered`), it has had its first token, its token is known without a draw (in
 * its drawn-ahead window; the replay column's next; or `token()`'s answer), that token is not
 * EOS, and it has no stop token ids and is below max_tokens after it. Nothing is changed
 * before all of that is known: otherwise the Python body does it all. A block that fills on
 * the way is registered and hashed by the same calls the Python body makes
 * (`EngineCore._cache_computed`, `chain.extend`), in its order.
 *
 * `DecodeApplier.decodes`: the head of the scheduler's pass over its running requests, those that
 * decode one token, scheduled without bytecode (its Python loop goes on from where it stops).
 *
 * `deliver`: mocker.engine.stream's `deliver` loop (a pass's outputs to their streams), whose
 * simple tokens go to their streams' sinks (mocker/api/_ctext.c's Sink writes them to the
 * socket) without a Python frame; everything else goes to the Python `hand`.
 *
 * `draws`: OutputTokenSampler.draws (a request's next tokens drawn ahead) without numpy's
 * fixed cost per call, its list holding the palette's ints.
 *
 * Kept for: bench/compiled_parts.py's `replay` and `stream` figure (what it buys: bench/README.md).
 */
#include "../_cfields.h"
#include "../_cmixing.h"
#include <stdint.h>

/* The slots read or written, by name (each class's member descriptors serve them). */
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
    Field r[R_COUNT];
    Field s[S_COUNT];
    Field o[O_COUNT];
    Py_ssize_t block_size;
    PyObject *eos;  /* an int, or None */
} DecodeApplier;

/* Interned names */
static PyObject *str_extend, *str_request_id, *str_finished, *str_sink, *str_new_token_ids;

/* Where `deliver` reads the outputs' and streams' attributes: the fields of the last type
 * seen (held), a field's descr NULL where that type has no plain slot of the name (then
 * looked up by name). */
enum { LAYOUT_FIELDS = 3 };
typedef struct {
    PyTypeObject *type;
    Field f[LAYOUT_FIELDS];
} Layout;

static Layout out_layout, stream_layout;

/* Make `layout` describe `type`: 0, or -1 with an error set. (Finding a field may run Python
 * code that calls `deliver` again: the layout is built aside, then installed whole.) */
static int layout_of(Layout *layout, PyTypeObject *type, PyObject *const *names, int n)
{
    if (layout->type == type)
        return 0;
    Layout fresh = {NULL, {{NULL, NULL, NULL}}};
    for (int i = 0; i < n; i++)
        if (field_find(&fresh.f[i], type, PyUnicode_AsUTF8(names[i]), 0) < 0) {
            fields_clear(fresh.f, LAYOUT_FIELDS);
            return -1;
        }
    Layout old = *layout;
    fresh.type = (PyTypeObject *)Py_NewRef(type);
    *layout = fresh; /* (installed before a release below can run code) */
    fields_clear(old.f, LAYOUT_FIELDS);
    Py_XDECREF(old.type);
    return 0;
}

/* A new reference to `obj`'s attribute `name`, the layout's field `i` (NULL: an error). */
static inline PyObject *layout_get(const Layout *layout, int i, PyObject *obj, PyObject *name)
{
    if (layout->f[i].descr != NULL)
        return field_get(&layout->f[i], obj);
    return PyObject_GetAttr(obj, name);
}

/* An attribute's truth (-1: an error is set). */
static int flag_of(const Layout *layout, int i, PyObject *obj, PyObject *name)
{
    PyObject *v = layout_get(layout, i, obj, name);
    if (v == NULL)
        return -1;
    int truth = PyObject_IsTrue(v);
    Py_DECREF(v);
    return truth;
}

static void applier_dealloc(DecodeApplier *self)
{
    Py_XDECREF(self->request_type);
    Py_XDECREF(self->sampling_type);
    Py_XDECREF(self->output_type);
    Py_XDECREF(self->eos);
    fields_clear(self->r, R_COUNT);
    fields_clear(self->s, S_COUNT);
    fields_clear(self->o, O_COUNT);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* DecodeApplier(request_type, sampling_type, output_type, block_size, eos_token_id) */
static PyObject *applier_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"request_type", "sampling_type", "output_type", "block_size",
                             "eos_token_id", NULL};
    PyTypeObject *rt, *st, *ot;
    Py_ssize_t bs;
    PyObject *eos;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!O!nO:DecodeApplier", kwlist, &PyType_Type, &rt,
                                     &PyType_Type, &st, &PyType_Type, &ot, &bs, &eos))
        return NULL;
    if (bs <= 0) {
        PyErr_SetString(PyExc_ValueError, "DecodeApplier: block_size must be > 0");
        return NULL;
    }
    if (eos != Py_None && !PyLong_CheckExact(eos)) {
        PyErr_SetString(PyExc_TypeError, "DecodeApplier: eos_token_id must be an int or None");
        return NULL;
    }
    DecodeApplier *self = (DecodeApplier *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    if (fields_find(self->r, rt, request_slots, R_COUNT, 1, "DecodeApplier") < 0 ||
        fields_find(self->s, st, sampling_slots, S_COUNT, 0, "DecodeApplier") < 0 ||
        fields_find(self->o, ot, output_slots, O_COUNT, 1, "DecodeApplier") < 0) {
        Py_DECREF(self);
        return NULL;
    }
    self->request_type = (PyTypeObject *)Py_NewRef(rt);
    self->sampling_type = (PyTypeObject *)Py_NewRef(st);
    self->output_type = (PyTypeObject *)Py_NewRef(ot);
    self->block_size = bs;
    self->eos = Py_NewRef(eos);
    return (PyObject *)self;
}

/* An int field as a C value; -1 with *ok = 0 (no error set) when it is not a small exact
 * int or cannot be read. */
static inline Py_ssize_t int_field(const Field *f, PyObject *obj, int *ok)
{
    PyObject *v = field_borrow(f, obj); /* (an exact int's conversion runs no Python code) */
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

/* Whether `obj`'s field is `value` (by identity): 1, 0, or -1 when it is unset. */
static inline int field_is(const Field *f, PyObject *obj, PyObject *value)
{
    PyObject *v = field_borrow(f, obj);
    return v == NULL ? -1 : v == value;
}

enum { NOT_APPLIED = 0, APPLIED = 1, APPLY_FAILED = -1 };

/* The request's output for its simple token `ids` (stolen), appended to `outputs`: 0, or -1
 * with an error set. */
static int emit_output(DecodeApplier *self, PyObject *req, PyObject *ids, PyObject *end,
                       PyObject *latency, PyObject *outputs)
{
    const Field *r = self->r;
    PyTypeObject *ot = self->output_type;
    PyObject *out = ot->tp_alloc(ot, 0);
    PyObject *rid = NULL, *nprompt = NULL, *ncached = NULL, *hits = NULL;
    int result = -1;
    if (out == NULL || (rid = field_get(&r[R_REQUEST_ID], req)) == NULL ||
        (nprompt = field_get(&r[R_NUM_PROMPT], req)) == NULL ||
        (ncached = field_get(&r[R_NUM_CACHED_TOKENS], req)) == NULL ||
        (hits = field_get(&r[R_TIER_HITS], req)) == NULL)
        goto done;
    PyObject *values[O_COUNT] = {
        [O_REQUEST_ID] = rid, [O_NEW_IDS] = ids, [O_TIME] = end, [O_FINISHED] = Py_False,
        [O_FINISH_REASON] = Py_None, [O_NUM_PROMPT] = nprompt, [O_NUM_CACHED] = ncached,
        [O_TIER_HITS] = hits, [O_FIRST] = Py_False, [O_LATENCY] = latency,
        [O_KV_PARAMS] = Py_None,
    };
    for (int i = 0; i < O_COUNT; i++)
        if (field_set(&self->o[i], out, values[i]) < 0)
            goto done;
    result = PyList_Append(outputs, out);
done:
    Py_XDECREF(out);
    Py_DECREF(ids);
    Py_XDECREF(rid);
    Py_XDECREF(nprompt);
    Py_XDECREF(ncached);
    Py_XDECREF(hits);
    return result;
}

/* chain.extend(block_hashes, tokens, hash_block_size), the fields read when called (Python
 * code ran since they were checked): 0, or -1 with an error set. */
static int extend_chain(DecodeApplier *self, PyObject *req, PyObject *tokens)
{
    const Field *r = self->r;
    PyObject *chain = NULL, *hashes = NULL, *size = NULL;
    int result = -1;
    if ((chain = field_get(&r[R_HASH_CHAIN], req)) != NULL &&
        (hashes = field_get(&r[R_BLOCK_HASHES], req)) != NULL &&
        (size = field_get(&r[R_HASH_BLOCK_SIZE], req)) != NULL) {
        PyObject *argv[4] = {chain, hashes, tokens, size};
        PyObject *done = PyObject_VectorcallMethod(str_extend, argv, 4, NULL);
        if (done != NULL) {
            Py_DECREF(done);
            result = 0;
        }
    }
    Py_XDECREF(chain);
    Py_XDECREF(hashes);
    Py_XDECREF(size);
    return result;
}

/* The request's token, known without a draw (a new reference), or NULL: NOT_APPLIED (no error
 * set) or, with an error set, APPLY_FAILED. `k`: its index among the generated tokens. */
static PyObject *known_token(DecodeApplier *self, PyObject *req, PyObject *sp, Py_ssize_t k,
                             int emit, PyObject *column, PyObject *token)
{
    const Field *r = self->r, *s = self->s;
    int ok = 1;
    if (emit) { /* its drawn-ahead window (past it: `draw`) */
        PyObject *drawn = field_peek(&r[R_DRAWN], req), *tok = NULL;
        Py_ssize_t j = k - int_field(&r[R_DRAWN_FROM], req, &ok);
        if (ok && drawn != NULL && PyList_CheckExact(drawn) && j >= 0 &&
            j < PyList_GET_SIZE(drawn))
            tok = Py_NewRef(PyList_GET_ITEM(drawn, j));
        Py_XDECREF(drawn);
        return tok;
    }
    if (column != Py_None) {
        Py_ssize_t m = PyList_GET_SIZE(column);
        return m == 0 ? NULL : Py_NewRef(PyList_GET_ITEM(column, m - 1));
    }
    Py_ssize_t min_tokens = int_field(&s[S_MIN_TOKENS], sp, &ok);
    PyObject *ignore = ok ? field_peek(&s[S_IGNORE_EOS], sp) : NULL;
    if (ignore == NULL)
        return NULL;
    int ignored = PyObject_IsTrue(ignore);
    Py_DECREF(ignore);
    if (ignored < 0)
        return NULL;
    PyObject *seed = field_peek(&r[R_TOKEN_SEED], req);
    if (seed == NULL)
        return NULL;
    PyObject *kk = PyLong_FromSsize_t(k), *tok = NULL;
    if (kk != NULL) {
        PyObject *argv[3] = {seed, kk, (!ignored && k >= min_tokens) ? Py_True : Py_False};
        tok = PyObject_Vectorcall(token, argv, 3, NULL);
        Py_DECREF(kk);
    }
    Py_DECREF(seed);
    return tok;
}

/* Apply one request's simple token, or answer NOT_APPLIED having changed nothing. */
static int apply_simple(DecodeApplier *self, PyObject *req, Py_ssize_t n, PyObject *end, double end_s,
                 int emit, PyObject *column, PyObject *registered, PyObject *token,
                 PyObject *cache, PyObject *outputs)
{
    const Field *r = self->r, *s = self->s;
    int ok = 1, answer = NOT_APPLIED;
    PyObject *tokens = NULL, *sp = NULL, *tok = NULL, *latency = NULL;
    if (Py_TYPE(req) != self->request_type)
        return NOT_APPLIED;
    Py_ssize_t computed = int_field(&r[R_NUM_COMPUTED], req, &ok) + n;
    if (!ok || (tokens = field_peek(&r[R_TOKENS], req)) == NULL)
        return NOT_APPLIED;
    Py_ssize_t num_tokens = PyList_CheckExact(tokens) ? PyList_GET_SIZE(tokens)
                                                        : PyObject_Size(tokens);
    if (num_tokens < 0) {
        PyErr_Clear();
        goto done;
    }
    if (computed != num_tokens) /* a prefill chunk short of the prompt's end */
        goto done;
    if (registered != Py_None) {
        int in = PyDict_Contains(registered, req);
        if (in != 0) {
            answer = in < 0 ? APPLY_FAILED : NOT_APPLIED;
            goto done;
        }
    }
    Py_ssize_t cached = int_field(&r[R_NUM_CACHED_BLOCKS], req, &ok);
    if (!ok || field_is(&r[R_FIRST_TOKEN_TIME], req, Py_None) != 0)
        goto done; /* (or its first token) */
    int fills = computed / self->block_size > cached; /* a block is full: registered */
    PyObject *last = field_peek(&r[R_LAST_TOKEN_TIME], req);
    if (last == NULL)
        goto done;
    int timed = PyFloat_CheckExact(last);
    double last_s = timed ? PyFloat_AS_DOUBLE(last) : 0.0; /* (before `cache` runs) */
    Py_DECREF(last);
    sp = field_peek(&r[R_SAMPLING], req);
    if (!timed || sp == NULL || Py_TYPE(sp) != self->sampling_type)
        goto done;
    PyObject *stops = field_peek(&s[S_STOP_IDS], sp);
    int stopless = stops != NULL && PyTuple_CheckExact(stops) && PyTuple_GET_SIZE(stops) == 0;
    Py_XDECREF(stops);
    if (!stopless)
        goto done; /* stop ids: the Python body checks them */
    Py_ssize_t k = num_tokens - int_field(&r[R_NUM_PROMPT], req, &ok);
    Py_ssize_t max_tokens = int_field(&r[R_MAX_TOKENS], req, &ok);
    if (!ok || k + 1 >= max_tokens)
        goto done; /* its last token */
    int hashes = 0; /* the token fills a block to hash */
    int chained = field_is(&r[R_HASH_CHAIN], req, Py_None);
    if (chained < 0)
        goto done;
    if (!chained) {
        Py_ssize_t hbs = int_field(&r[R_HASH_BLOCK_SIZE], req, &ok);
        PyObject *known = ok && hbs > 0 ? field_peek(&r[R_BLOCK_HASHES], req) : NULL;
        if (known == NULL)
            goto done;
        Py_DECREF(known);
        hashes = (num_tokens + 1) % hbs == 0;
    }
    tok = known_token(self, req, sp, k, emit, column, token);
    if (tok == NULL) {
        answer = PyErr_Occurred() ? APPLY_FAILED : NOT_APPLIED;
        goto done;
    }
    if (!PyLong_CheckExact(tok))
        goto done;
    if (self->eos != Py_None) {
        int same = PyObject_RichCompareBool(tok, self->eos, Py_EQ);
        if (same != 0) {
            answer = same < 0 ? APPLY_FAILED : NOT_APPLIED; /* EOS ends it (unless ignored) */
            goto done;
        }
    }
    /* Everything is known: apply it (as `_advance_one` would, in its order). */
    answer = APPLY_FAILED;
    PyObject *computed_obj = PyLong_FromSsize_t(computed);
    if (computed_obj == NULL || field_put(&r[R_NUM_COMPUTED], req, computed_obj) < 0)
        goto done;
    if (fills) {
        PyObject *cached_now = PyObject_Vectorcall(cache, &req, 1, NULL);
        if (cached_now == NULL)
            goto done;
        Py_DECREF(cached_now);
        Py_SETREF(tokens, field_get(&r[R_TOKENS], req));
        if (tokens == NULL)
            goto done;
    }
    if ((latency = PyFloat_FromDouble(end_s - last_s)) == NULL)
        goto done;
    if (PyList_CheckExact(tokens)) {
        if (PyList_Append(tokens, tok) < 0)
            goto done;
    } else {
        PyObject *appended = PyObject_CallMethod(tokens, "append", "O", tok);
        if (appended == NULL)
            goto done;
        Py_DECREF(appended);
    }
    if (!emit && column != Py_None) {
        /* (the column's last item is `tok`: dropped as `pop` would) */
        if (PyList_SetSlice(column, PyList_GET_SIZE(column) - 1, PyList_GET_SIZE(column),
                            NULL) < 0)
            goto done;
    }
    if (hashes && extend_chain(self, req, tokens) < 0)
        goto done;
    if (field_set(&r[R_LAST_TOKEN_TIME], req, end) < 0)
        goto done;
    if (emit) {
        PyObject *ids = PyList_New(1);
        if (ids == NULL)
            goto done;
        PyList_SET_ITEM(ids, 0, tok); /* (steals it) */
        tok = NULL;
        if (emit_output(self, req, ids, end, latency, outputs) < 0)
            goto done;
    }
    answer = APPLIED;
done:
    Py_XDECREF(tokens);
    Py_XDECREF(sp);
    Py_XDECREF(tok);
    Py_XDECREF(latency);
    return answer;
}

/* Prefetching a pass's requests ahead of the one being advanced. With hundreds of streams,
 * everything a request's token touches has left the caches since the last pass (the other
 * requests' objects and the kernel's socket writes came between), and the token waited on
 * each object in turn: the request's slots, then its sampling parameters, its lists, their
 * items. So the loop asks for the request FAR_AHEAD entries on and, once that has had time
 * to arrive, for the objects its slots name NEAR_AHEAD entries on, and so on down the chain;
 * the loads then overlap other requests' work. A prefetch never faults and changes nothing;
 * a slot not of the expected type is simply not followed. */
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

static inline void prefetch_parts(DecodeApplier *self, PyObject *req)
{
    const Field *r = self->r;
    if (Py_TYPE(req) != self->request_type)
        return;
    PyObject *v;
    if ((v = field_borrow(&r[R_SAMPLING], req)) != NULL)
        __builtin_prefetch(v);
    if ((v = field_borrow(&r[R_LAST_TOKEN_TIME], req)) != NULL)
        __builtin_prefetch(v);
    if ((v = field_borrow(&r[R_NUM_COMPUTED], req)) != NULL)
        __builtin_prefetch(v);
    if ((v = field_borrow(&r[R_TOKENS], req)) != NULL) /* (a list's header: size, items) */
        __builtin_prefetch(v);
    if ((v = field_borrow(&r[R_DRAWN], req)) != NULL)
        __builtin_prefetch(v);
}

/* Where the request's next drawn token is (&drawn[j], as `known_token` finds it), or NULL. */
static inline PyObject **next_drawn(DecodeApplier *self, PyObject *req)
{
    const Field *r = self->r;
    if (Py_TYPE(req) != self->request_type)
        return NULL;
    PyObject *tokens = field_borrow(&r[R_TOKENS], req), *drawn = field_borrow(&r[R_DRAWN], req);
    if (tokens == NULL || drawn == NULL || !PyList_CheckExact(tokens) || !PyList_CheckExact(drawn))
        return NULL;
    int ok = 1;
    Py_ssize_t p = int_field(&r[R_NUM_PROMPT], req, &ok);
    Py_ssize_t f = int_field(&r[R_DRAWN_FROM], req, &ok);
    if (!ok || p < 0 || f < 0)
        return NULL;
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
static PyObject *applier_run(DecodeApplier *self, PyObject *const *args, Py_ssize_t nargs)
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
    PyObject *req, *num, *ahead;
    /* Cursors ahead of this one, each fetching the next link of a request's chain (see
     * `prefetch_request`); the first few requests are fetched as the cursors start. */
    Cursor far = {0, 0}, near = {0, 0}, item = {0, 0}, tok_at = {0, 0};
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
        /* (held: the calls below run Python code; `scheduled` keeps them, by the contract
         * that nothing changes it during the pass, but that is not to be relied on here) */
        Py_INCREF(req);
        Py_INCREF(num);
        int done = NOT_APPLIED;
        if (floats && PyLong_CheckExact(num)) {
            Py_ssize_t n = PyLong_AsSsize_t(num);
            if (n == -1 && PyErr_Occurred())
                PyErr_Clear();
            else
                done = apply_simple(self, req, n, end, end_s, emit, column, registered, token,
                                    cache, outputs);
        }
        Py_ssize_t p = 0;
        if (done == NOT_APPLIED) {
            PyObject *argv[2] = {req, num};
            PyObject *res = PyObject_Vectorcall(slow, argv, 2, NULL);
            if (res == NULL) {
                done = APPLY_FAILED;
            } else {
                p = PyLong_AsSsize_t(res);
                Py_DECREF(res);
                if (p == -1 && PyErr_Occurred())
                    done = APPLY_FAILED;
            }
        }
        Py_DECREF(req);
        Py_DECREF(num);
        if (done == APPLY_FAILED)
            return NULL;
        partial += p;
    }
    return PyLong_FromSsize_t(partial);
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
        uint64_t m = splitmix64(seed + (uint64_t)k);
        PyObject *tok = (threshold && k >= eos_from && (splitmix64(m) >> 11) < threshold)
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
            *to++ = palette[rank(splitmix64(x + (uint64_t)k), size, octaves)];
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
        PyObject *tok = PyList_GET_ITEM(palette, rank(splitmix64(seeds[i] + indexes[i]), size, octaves));
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
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(outputs); i++) {
        PyObject *out = Py_NewRef(PyList_GET_ITEM(outputs, i));
        PyObject *stream = NULL, *sink = NULL;
        if (layout_of(&out_layout, Py_TYPE(out), out_names, 3) < 0)
            goto fail;
        PyObject *rid = layout_get(&out_layout, 0, out, str_request_id);
        if (rid == NULL)
            goto fail;
        stream = Py_XNewRef(PyDict_GetItemWithError(streams, rid));
        Py_DECREF(rid);
        int open = 0;
        if (stream != NULL) {
            if (layout_of(&stream_layout, Py_TYPE(stream), stream_names, 2) < 0)
                goto fail;
            int ended = flag_of(&stream_layout, 0, stream, str_finished);
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
        /* (the layouts are read again: the calls between may have run Python code) */
        if (layout_of(&stream_layout, Py_TYPE(stream), stream_names, 2) < 0 ||
            (sink = layout_get(&stream_layout, 1, stream, str_sink)) == NULL)
            goto fail;
        if (sink != Py_None) {
            if (layout_of(&out_layout, Py_TYPE(out), out_names, 3) < 0)
                goto fail;
            int finished = flag_of(&out_layout, 1, out, str_finished);
            if (finished < 0)
                goto fail;
            PyObject *ids = NULL;
            if (!finished && (layout_of(&out_layout, Py_TYPE(out), out_names, 3) < 0 ||
                              (ids = layout_get(&out_layout, 2, out, str_new_token_ids)) == NULL))
                goto fail;
            if (ids != NULL && PyList_CheckExact(ids) && PyList_GET_SIZE(ids) == 1) {
                PyObject *tok = Py_NewRef(PyList_GET_ITEM(ids, 0)); /* (across the sink) */
                PyObject *took = PyObject_Vectorcall(sink, &tok, 1, NULL);
                Py_DECREF(tok);
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
        return NULL;
    }
    if (kept == NULL)
        Py_RETURN_NONE;
    return kept;
}

static PyMethodDef module_methods[] = {
    {"draws", (PyCFunction)(void (*)(void))draws, METH_FASTCALL,
     "draws(seed, start, count, eos_from, palette, eos_token_id, eos_threshold) -> list"},
    {"rows", (PyCFunction)(void (*)(void))rows, METH_FASTCALL,
     "rows(seeds, starts, count, palette_ids) -> bytes of uint32"},
    {"column", (PyCFunction)(void (*)(void))column, METH_FASTCALL,
     "column(seeds, indexes, palette) -> list"},
    {"deliver", (PyCFunction)(void (*)(void))deliver, METH_FASTCALL,
     "deliver(streams, outputs, hand) -> the kept outputs, or None when every one was kept"},
    {NULL, NULL, 0, NULL},
};

/* Schedule `req` for one decode token if it decodes one and has (or gets) room for it: 1,
 * 0 (nothing changed for it: the Python loop goes on from it), -1 with an error set. */
static int decode_one(DecodeApplier *self, PyObject *req, PyObject *one, Py_ssize_t bs,
                      PyObject *scheduled, PyObject *allocate)
{
    const Field *r = self->r;
    int ok = 1;
    PyObject *tokens = field_peek(&r[R_TOKENS], req), *blocks = field_peek(&r[R_BLOCKS], req);
    Py_ssize_t num_tokens = -1, num_blocks = -1;
    if (tokens != NULL && blocks != NULL && PyList_CheckExact(blocks)) {
        num_blocks = PyList_GET_SIZE(blocks);
        num_tokens = PyList_CheckExact(tokens) ? PyList_GET_SIZE(tokens) : PyObject_Size(tokens);
        if (num_tokens < 0)
            PyErr_Clear();
    }
    Py_XDECREF(tokens);
    Py_XDECREF(blocks);
    if (num_tokens < 0)
        return 0;
    Py_ssize_t computed = int_field(&r[R_NUM_COMPUTED], req, &ok);
    Py_ssize_t prompt = int_field(&r[R_NUM_PROMPT], req, &ok);
    Py_ssize_t recheck = int_field(&r[R_KV_RECHECK], req, &ok);
    if (!ok || computed != num_tokens - 1 || num_tokens <= prompt || computed >= recheck)
        return 0;
    if (computed + 1 > num_blocks * bs) {
        PyObject *argv[2] = {req, one};
        PyObject *got = PyObject_Vectorcall(allocate, argv, 2, NULL);
        if (got == NULL)
            return -1;
        int room = PyObject_IsTrue(got);
        Py_DECREF(got);
        if (room <= 0)
            return room;
    }
    return PyDict_SetItem(scheduled, req, one) < 0 ? -1 : 1;
}

/* decodes(running, start, budget, scheduled, allocate) -> (index, budget, decodes)
 *
 * The head of running.py's schedule_running (its Python loop is the reference, and goes on
 * from the index returned): from running[start] on, while the budget lasts, each request
 * that decodes one token (its computed tokens one short of its tokens, past its prompt) and
 * has room for it in its blocks, or gets it from allocate(request, 1), is scheduled for 1
 * token (scheduled[request] = 1). Stops, changing nothing for it, at the first request
 * that does not (a prefill, a hybrid group's recheck) or whose allocation fails (the
 * Python loop then preempts; only given an `allocate` that changes nothing when it fails). */
static PyObject *applier_decodes(DecodeApplier *self, PyObject *const *args, Py_ssize_t nargs)
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
    Py_ssize_t bs = self->block_size, count = 0;
    PyObject *one = PyLong_FromLong(1);
    if (one == NULL)
        return NULL;
    while (i < PyList_GET_SIZE(running) && budget > 0) {
        PyObject *req = PyList_GET_ITEM(running, i);
        if (Py_TYPE(req) != self->request_type)
            break;
        Py_INCREF(req); /* (held across `allocate`, which runs Python code) */
        int scheduled_it = decode_one(self, req, one, bs, scheduled, allocate);
        Py_DECREF(req);
        if (scheduled_it < 0) {
            Py_DECREF(one);
            return NULL;
        }
        if (!scheduled_it)
            break;
        budget--;
        count++;
        i++;
    }
    Py_DECREF(one);
    return Py_BuildValue("(nnn)", i, budget, count);
}

static PyMethodDef applier_methods[] = {
    {"decodes", (PyCFunction)(void (*)(void))applier_decodes, METH_FASTCALL,
     "decodes(running, start, budget, scheduled, allocate) -> (index, budget, decodes)"},
    {"run", (PyCFunction)(void (*)(void))applier_run, METH_FASTCALL,
     "run(scheduled, end, emit, column, registered, token, cache, outputs, slow) -> partial"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject DecodeApplierType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mocker.engine._cpass.DecodeApplier",
    .tp_basicsize = sizeof(DecodeApplier),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A pass's simple decode tokens applied in C (EngineCore._advance).",
    .tp_new = applier_new,
    .tp_dealloc = (destructor)applier_dealloc,
    .tp_methods = applier_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "mocker.engine._cpass",
    "A pass's simple decode tokens applied, and output tokens drawn ahead, in C.", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__cpass(void)
{
    if (PyType_Ready(&DecodeApplierType) < 0)
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
    Py_INCREF(&DecodeApplierType);
    if (PyModule_AddObject(m, "DecodeApplier", (PyObject *)&DecodeApplierType) < 0) {
        Py_DECREF(&DecodeApplierType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
