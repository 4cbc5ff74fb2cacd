/* The device block pool over packed arrays: mocker.kv.block_pool.BlockPool's semantics for a
 * dense model with LRU eviction and no write-back tier (mocker.kv.compiled_pool says when it
 * serves, and builds the KV events from what this records when asked).
 *
 * Why it exists: in a long replay the Python pool's per-block work is bound by memory, not
 * bytecode. A block's life touches its 144-byte object, its hash's int object and two slots
 * of a map as large as the pool, in an order the LRU scatters. Here a block is an index into
 * one array of small structs (reference count, hash, parent hash, its id object, its place in
 * the free queue, itself a ring of ids), and the prefix map is an open-addressing table of
 * (hash, block) pairs. Blocks cross into Python as the ints 0..n-1, one object each made
 * once, so handing a block out allocates nothing.
 *
 * The Python pool stays the reference: every operation here does exactly what it does, in
 * the same order (the same ids handed out, the same free order, the same map), which
 * tests/kv/test_compiled_pool.py checks operation by operation on random workloads.
 * Kept for: bench/compiled_parts.py's `replay` figure (what it buys: bench/README.md).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>


#define F_HASHED 1u
#define F_PARENT 2u
#define F_FREE 4u

/* One block's state in one place, the fields a hand-out reads first: a block's life touches
 * one cache line or two, not one per field (the pool is larger than the caches, and the LRU
 * scatters the blocks). */
typedef struct {
    uint64_t hash;
    PyObject *id;  /* the int object of this block's id: handed out with it */
    int32_t ref;
    uint8_t flags;
    int64_t pos;   /* its entry in the free queue while free */
    uint64_t parent;
    uint64_t seq;  /* when it was last registered: the Python pool's map order */
} Block;

/* A map entry: key and value on one cache line. */
typedef struct {
    uint64_t key;
    int32_t val; /* -1: empty */
} Slot;

typedef struct {
    PyObject_HEAD
    Py_ssize_t n;          /* blocks */
    Py_ssize_t block_size;
    int enable_caching;
    /* Recording for KV events (mocker.kv.compiled_pool.CompiledEventPool builds them): the
     * hashes of blocks that stopped being cached, in order, until taken. */
    int record;
    PyObject *evicted;
    PyObject *stored; /* and the (start, end) runs cache_full_blocks newly stored */
    Py_ssize_t num_used;   /* referenced blocks */
    Py_ssize_t free_len;   /* blocks in the free queue */
    Block *blk;
    uint64_t next_seq;
    /* The free queue (the LRU order, next to be reused first): a ring of block ids, -1 where
     * a block left from the middle (revived by a prefix hit). Positions [qhead, qtail) are
     * the entries, at index position & qmask in the ring; a free block's `pos` is its
     * entry's position (a compaction moves entries and updates it). A ring and not a linked
     * list: a hand-out reads the next ids in a row and asks for their blocks ahead, instead
     * of following one block's link to the next, a cache miss at a time. */
    int32_t *q;
    int64_t qhead, qtail, qmask;
    /* hash -> block: linear probing, backward-shift deletion, at most half full */
    Slot *slots;
    Py_ssize_t mask;
    int shift;
    Py_ssize_t count;
    int ready; /* __init__ ran to its end */
} Pool;

/* -- hashes -------------------------------------------------------------------------------- */

/* A hash (an int in [0, 2**64)) as a uint64. */
static inline int hash_of(PyObject *obj, uint64_t *out)
{
    unsigned long long h = PyLong_AsUnsignedLongLong(obj);
    if (h == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = (uint64_t)h;
    return 0;
}

/* An int's value, for a block id. */
static inline Py_ssize_t id_value(PyObject *obj)
{
    return PyLong_AsSsize_t(obj);
}

/* A sequence of hashes as a walk reads it: a list or tuple of ints, or a buffer of native
 * unsigned 64-bit words (array('Q'), a numpy uint64 vector: replay's prompts), read in place
 * without an int object per hash. */
typedef struct {
    PyObject *seq; /* the list or tuple (PySequence_Fast), or NULL for a buffer */
    PyObject *const *items;
    const uint64_t *words;
    Py_buffer view;
    Py_ssize_t len;
} Hashes;

static int is_u64(const Py_buffer *view)
{
    const char *f = view->format;
    if (view->ndim != 1 || view->itemsize != 8 || f == NULL)
        return 0;
    if (*f == '@' || *f == '=')
        f++;
    return (f[0] == 'Q' || (f[0] == 'L' && sizeof(unsigned long) == 8)) && f[1] == '\0';
}

static int hashes_open(PyObject *obj, Hashes *hs, const char *what)
{
    hs->seq = NULL;
    hs->items = NULL;
    hs->words = NULL;
    if (!PyList_CheckExact(obj) && !PyTuple_CheckExact(obj) && PyObject_CheckBuffer(obj)) {
        if (PyObject_GetBuffer(obj, &hs->view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) == 0) {
            if (is_u64(&hs->view)) {
                hs->words = (const uint64_t *)hs->view.buf;
                hs->len = hs->view.len / 8;
                return 0;
            }
            PyBuffer_Release(&hs->view);
        } else {
            PyErr_Clear(); /* (not a plain vector: read as a sequence) */
        }
    }
    hs->seq = PySequence_Fast(obj, what);
    if (hs->seq == NULL)
        return -1;
    hs->items = PySequence_Fast_ITEMS(hs->seq);
    hs->len = PySequence_Fast_GET_SIZE(hs->seq);
    return 0;
}

static void hashes_close(Hashes *hs)
{
    if (hs->seq == NULL)
        PyBuffer_Release(&hs->view);
    else
        Py_DECREF(hs->seq);
}

static inline int hashes_get(const Hashes *hs, Py_ssize_t k, uint64_t *out)
{
    if (hs->words != NULL) {
        *out = hs->words[k];
        return 0;
    }
    return hash_of(hs->items[k], out);
}

/* -- the map ----------------------------------------------------------------------------- */

static inline Py_ssize_t slot_of(const Pool *p, uint64_t h)
{
    /* Fibonacci hashing: hashes from any of the algorithms are spread already, but a
     * user's own (or a test's small ints) need not be. */
    return (Py_ssize_t)((h * 0x9E3779B97F4A7C15ull) >> p->shift);
}

static inline int32_t map_get(const Pool *p, uint64_t h)
{
    Py_ssize_t i = slot_of(p, h);
    for (;;) {
        int32_t v = p->slots[i].val;
        if (v < 0)
            return -1;
        if (p->slots[i].key == h)
            return v;
        i = (i + 1) & p->mask;
    }
}

/* The block of h, or -1 after mapping h to `block` (one probe for a lookup and an insert). */
static inline int32_t map_get_or_put(Pool *p, uint64_t h, int32_t block)
{
    Py_ssize_t i = slot_of(p, h);
    while (p->slots[i].val >= 0) {
        if (p->slots[i].key == h)
            return p->slots[i].val;
        i = (i + 1) & p->mask;
    }
    p->slots[i].key = h;
    p->slots[i].val = block;
    p->count++;
    return -1;
}

/* Prefetching: the blocks and hashes a walk will reach are known before it reaches them,
 * and a block's struct, its id object and a map slot each miss the caches (the pool, the
 * ids and the map are larger than they are); asking for them a few entries ahead overlaps
 * those misses instead of waiting for each in turn. A walk asks in stages: first for what
 * an entry points to, then (once that has arrived) for what that points to. */
#define AHEAD 8
#if defined(__GNUC__)
#define PREFETCH(addr) __builtin_prefetch(addr)
#else
#define PREFETCH(addr) ((void)(addr))
#endif

/* A block's struct may straddle two lines: both are asked for. */
static inline void prefetch_blk(const Pool *p, int32_t b)
{
    const char *at = (const char *)&p->blk[b];
    PREFETCH(at);
    PREFETCH(at + sizeof(Block) - 1);
}

static inline void prefetch_hash(const Pool *p, PyObject *obj)
{
    uint64_t h;
    if (hash_of(obj, &h)) {
        PyErr_Clear(); /* (the walk reaches it and raises) */
        return;
    }
    PREFETCH(&p->slots[slot_of(p, h)]);
}

static inline void prefetch_block(const Pool *p, PyObject *obj)
{
    if (!PyLong_CheckExact(obj))
        return;
    Py_ssize_t b = id_value(obj);
    if (b == -1 && PyErr_Occurred()) {
        PyErr_Clear(); /* (the walk reaches it and raises) */
        return;
    }
    if (b >= 0 && b < p->n)
        prefetch_blk(p, (int32_t)b);
}

/* A walk over int objects (hashes or block ids), in two stages per entry: the object
 * 2 * AHEAD entries on is asked for; the one AHEAD on, arrived by then, is read, and what
 * it names asked for by `names` (prefetch_hash: a map slot; prefetch_block: a block).
 * `start_walk` before the walk from `from`, `walk_ahead` at each of its entries; `len`
 * bounds the entries the walk reaches. (Inlined with `names` a constant: no calls.) */
typedef void (*Names)(const Pool *, PyObject *);

static inline void start_walk(const Pool *p, PyObject *const *items, Py_ssize_t from,
                              Py_ssize_t len, Names names)
{
    for (Py_ssize_t k = from; k < len && k < from + 2 * AHEAD; k++)
        PREFETCH(items[k]);
    for (Py_ssize_t k = from; k < len && k < from + AHEAD; k++)
        names(p, items[k]);
}

static inline void walk_ahead(const Pool *p, PyObject *const *items, Py_ssize_t k,
                              Py_ssize_t len, Names names)
{
    if (k + 2 * AHEAD < len)
        PREFETCH(items[k + 2 * AHEAD]);
    if (k + AHEAD < len)
        names(p, items[k + AHEAD]);
}

/* The same walk over hashes in either form: a buffer's words are in a row already (the
 * hardware reads them ahead), so only their map slots are asked for. */
static inline void start_hashes(const Pool *p, const Hashes *hs, Py_ssize_t from, Py_ssize_t len)
{
    if (hs->words == NULL) {
        start_walk(p, hs->items, from, len, prefetch_hash);
        return;
    }
    for (Py_ssize_t k = from; k < len && k < from + AHEAD; k++)
        PREFETCH(&p->slots[slot_of(p, hs->words[k])]);
}

static inline void hashes_ahead(const Pool *p, const Hashes *hs, Py_ssize_t k, Py_ssize_t len)
{
    if (hs->words == NULL)
        walk_ahead(p, hs->items, k, len, prefetch_hash);
    else if (k + AHEAD < len)
        PREFETCH(&p->slots[slot_of(p, hs->words[k + AHEAD])]);
}

static void map_del(Pool *p, uint64_t h)
{
    Py_ssize_t i = slot_of(p, h);
    while (p->slots[i].val >= 0 && p->slots[i].key != h)
        i = (i + 1) & p->mask;
    if (p->slots[i].val < 0)
        return;
    p->count--;
    /* Backward shift: later entries of the run move up, so no tombstone is left. */
    Py_ssize_t j = i;
    for (;;) {
        j = (j + 1) & p->mask;
        if (p->slots[j].val < 0)
            break;
        Py_ssize_t home = slot_of(p, p->slots[j].key);
        /* Move j into the hole i unless its home lies cyclically in (i, j]. */
        int stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
        if (stays)
            continue;
        p->slots[i].key = p->slots[j].key;
        p->slots[i].val = p->slots[j].val;
        i = j;
    }
    p->slots[i].val = -1;
}

/* -- the free queue ------------------------------------------------------------------------ */

#define Q_AT(p, i) ((p)->q[(uint64_t)(i) & (uint64_t)(p)->qmask])

/* Close the holes: the live entries move up to the head, in order. It runs when the ring is
 * full; the ring has room for at least twice as many entries as there are blocks, so it
 * frees at least half of it, and as many pushes as there are blocks come before the next. */
static void compact_queue(Pool *p)
{
    int64_t w = p->qhead;
    for (int64_t r = p->qhead; r < p->qtail; r++) {
        int32_t b = Q_AT(p, r);
        if (b < 0)
            continue;
        Q_AT(p, w) = b;
        p->blk[b].pos = w++;
    }
    p->qtail = w;
}

static inline void queue_room(Pool *p)
{
    if (p->qtail - p->qhead > p->qmask)
        compact_queue(p);
}

static inline void unlink_block(Pool *p, int32_t b)
{
    Q_AT(p, p->blk[b].pos) = -1;
    p->blk[b].flags &= ~F_FREE;
    p->free_len--;
    /* (Holes at the ends go at once: a queue of revived blocks does not keep growing.) */
    while (p->qhead < p->qtail && Q_AT(p, p->qhead) < 0)
        p->qhead++;
    while (p->qtail > p->qhead && Q_AT(p, p->qtail - 1) < 0)
        p->qtail--;
}

/* A block whose last reference went: one holding a hash is reused last, one without first
 * (the LRU policy's `push`). */
static inline void push_free(Pool *p, int32_t b)
{
    queue_room(p);
    int64_t at = (p->blk[b].flags & F_HASHED) ? p->qtail++ : --p->qhead;
    Q_AT(p, at) = b;
    p->blk[b].pos = at;
    p->blk[b].flags |= F_FREE;
    p->free_len++;
}

/* -- helpers ----------------------------------------------------------------------------- */

static int block_of(Pool *p, PyObject *obj, int32_t *out)
{
    /* Exact ints only (the ids this pool hands out): an int subclass could run Python code
     * (a finalizer) while a walk holds borrowed items. */
    if (!PyLong_CheckExact(obj)) {
        PyErr_Format(PyExc_TypeError, "a block of this pool is its id (an int), not %.100s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    Py_ssize_t b = id_value(obj);
    if (b == -1 && PyErr_Occurred())
        return -1;
    if (b < 0 || b >= p->n) {
        PyErr_Format(PyExc_ValueError, "block %zd is not in this pool of %zd", b, p->n);
        return -1;
    }
    *out = (int32_t)b;
    return 0;
}

/* A block's hash left the cache: noted for the events when recording. */
static int note_evicted(Pool *p, uint64_t h)
{
    if (!p->record)
        return 0;
    PyObject *obj = PyLong_FromUnsignedLongLong(h);
    if (obj == NULL)
        return -1;
    int rc = PyList_Append(p->evicted, obj);
    Py_DECREF(obj);
    return rc;
}

static PyObject *block_repr(Pool *p, int32_t b)
{
    if (!(p->blk[b].flags & F_HASHED))
        return PyUnicode_FromFormat("KVBlock(id=%d, ref=%d, hash=None)", (int)b,
                                    (int)p->blk[b].ref);
    PyObject *h = PyLong_FromUnsignedLongLong(p->blk[b].hash);
    if (h == NULL)
        return NULL;
    PyObject *r =
        PyUnicode_FromFormat("KVBlock(id=%d, ref=%d, hash=%S)", (int)b, (int)p->blk[b].ref, h);
    Py_DECREF(h);
    return r;
}

static void set_error_about(Pool *p, PyObject *type, int32_t b, const char *what)
{
    PyObject *r = block_repr(p, b);
    if (r != NULL) {
        PyErr_Format(type, "%U %s", r, what);
        Py_DECREF(r);
    }
}

/* A method of a pool whose __init__ never ran (a subclass that skipped it), or failed, raises
 * instead of reading arrays that do not exist. */
#define REQUIRE_READY(p)                                                                   \
    do {                                                                                   \
        if (!(p)->ready) {                                                                 \
            PyErr_SetString(PyExc_RuntimeError, "the pool was not initialised");           \
            return NULL;                                                                   \
        }                                                                                  \
    } while (0)

/* -- construction -------------------------------------------------------------------------- */

static void Pool_dealloc(Pool *p)
{
    if (p->blk != NULL) {
        for (Py_ssize_t i = 0; i < p->n; i++)
            Py_XDECREF(p->blk[i].id);
    }
    PyMem_Free(p->blk);
    PyMem_Free(p->q);
    Py_XDECREF(p->evicted);
    Py_XDECREF(p->stored);
    PyMem_Free(p->slots);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static int Pool_init(Pool *p, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"num_blocks", "block_size", "enable_caching", "record_events", NULL};
    Py_ssize_t n, block_size;
    int enable_caching = 1, record = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "nn|$pp", kwlist, &n, &block_size,
                                     &enable_caching, &record))
        return -1;
    if (p->blk != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a pool is initialised once");
        return -1;
    }
    if (n < 0 || n > INT32_MAX - 2) {
        PyErr_Format(PyExc_ValueError, "num_blocks must be in [0, %d], got %zd", INT32_MAX - 2, n);
        return -1;
    }
    p->n = n;
    p->block_size = block_size;
    p->enable_caching = enable_caching;
    p->record = record;
    p->evicted = PyList_New(0);
    p->stored = PyList_New(0);
    if (p->evicted == NULL || p->stored == NULL)
        return -1;
    Py_ssize_t cap = 8;
    int bits = 3;
    while (cap < 2 * n) {
        cap <<= 1;
        bits++;
    }
    p->mask = cap - 1;
    p->shift = 64 - bits;
    p->qmask = cap - 1; /* the ring: at least twice the blocks, as the map */
    p->blk = PyMem_Calloc(n ? n : 1, sizeof(Block));
    p->slots = PyMem_Malloc(cap * sizeof(Slot));
    p->q = PyMem_Malloc(cap * sizeof(int32_t));
    if (!p->blk || !p->slots || !p->q) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < cap; i++)
        p->slots[i].val = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        p->blk[i].id = PyLong_FromSsize_t(i);
        if (p->blk[i].id == NULL)
            return -1;
    }
    /* Handed out 0, 1, 2, ... first. */
    for (Py_ssize_t i = 0; i < n; i++) {
        p->q[i] = (int32_t)i;
        p->blk[i].pos = i;
        p->blk[i].flags = F_FREE;
    }
    p->qhead = 0;
    p->qtail = p->free_len = n;
    p->ready = 1;
    return 0;
}

/* -- allocation ---------------------------------------------------------------------------- */

static PyObject *Pool_get_new_blocks(Pool *p, PyObject *arg)
{
    REQUIRE_READY(p);
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n > p->free_len || n < 0) {
        PyErr_Format(PyExc_ValueError, "cannot allocate %zd blocks, only %zd reusable", n,
                     p->free_len);
        return NULL;
    }
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    /* The next n ids, read off the ring in a row (holes skipped). */
    int32_t stack[64];
    int32_t *take = n <= 64 ? stack : PyMem_Malloc(n * sizeof(int32_t));
    if (take == NULL) {
        Py_DECREF(out);
        return PyErr_NoMemory();
    }
    int64_t at = p->qhead;
    for (Py_ssize_t k = 0; k < n; at++) {
        int32_t b = Q_AT(p, at);
        if (b >= 0)
            take[k++] = b;
    }
    if (p->record) {
        /* The hashes these blocks give up, noted first: nothing changes if that fails. */
        Py_ssize_t noted = PyList_GET_SIZE(p->evicted);
        for (Py_ssize_t k = 0; k < n; k++) {
            Block *blk = &p->blk[take[k]];
            if ((blk->flags & F_HASHED) && note_evicted(p, blk->hash)) {
                PyList_SetSlice(p->evicted, noted, PY_SSIZE_T_MAX, NULL);
                if (take != stack)
                    PyMem_Free(take);
                Py_DECREF(out);
                return NULL;
            }
        }
    }
    /* In stages: a block's struct is asked for 2 * AHEAD entries before its turn; AHEAD
     * before, its id object and (for a cached block) the map slot of its hash; then the
     * block is handed out and its hash dropped. */
    for (Py_ssize_t k = 0; k < n && k < 2 * AHEAD; k++)
        prefetch_blk(p, take[k]);
    for (Py_ssize_t k = 0; k < n && k < AHEAD; k++) {
        Block *ahead = &p->blk[take[k]];
        PREFETCH(ahead->id);
        if (ahead->flags & F_HASHED)
            PREFETCH(&p->slots[slot_of(p, ahead->hash)]);
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        if (k + 2 * AHEAD < n)
            prefetch_blk(p, take[k + 2 * AHEAD]);
        if (k + AHEAD < n) {
            Block *ahead = &p->blk[take[k + AHEAD]];
            PREFETCH(ahead->id);
            if (ahead->flags & F_HASHED)
                PREFETCH(&p->slots[slot_of(p, ahead->hash)]);
        }
        Block *blk = &p->blk[take[k]];
        if (blk->flags & F_HASHED)
            map_del(p, blk->hash);
        blk->flags = 0;
        blk->ref = 1;
        Py_INCREF(blk->id);
        PyList_SET_ITEM(out, k, blk->id);
    }
    if (take != stack)
        PyMem_Free(take);
    /* The taken entries leave the ring (with the holes among them and just after). */
    while (at < p->qtail && Q_AT(p, at) < 0)
        at++;
    p->qhead = at;
    p->free_len -= n;
    p->num_used += n;
    return out;
}

static int touch_one(Pool *p, int32_t b)
{
    if (p->blk[b].ref == 0) {
        if (!(p->blk[b].flags & F_FREE)) {
            set_error_about(p, PyExc_ValueError, b, "is not on a free list");
            return -1;
        }
        unlink_block(p, b);
        p->num_used++;
    }
    p->blk[b].ref++;
    return 0;
}

static PyObject *Pool_touch(Pool *p, PyObject *blocks)
{
    REQUIRE_READY(p);
    PyObject *it = PyObject_GetIter(blocks);
    if (it == NULL)
        return NULL;
    PyObject *item;
    while ((item = PyIter_Next(it)) != NULL) {
        int32_t b;
        int bad = block_of(p, item, &b) || touch_one(p, b);
        Py_DECREF(item);
        if (bad) {
            Py_DECREF(it);
            return NULL;
        }
    }
    Py_DECREF(it);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

/* Drop one reference from each block, in order; those left unreferenced go to the free list
 * in that order (after the walk, as the Python pool's `push_many`: a bad block stops the walk
 * but the ones before it are freed all the same). */
static int free_items(Pool *p, PyObject *const *items, Py_ssize_t len)
{
    int32_t stack[64];
    int32_t *freed = len <= 64 ? stack : PyMem_Malloc(len * sizeof(int32_t));
    if (freed == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t nfreed = 0;
    int failed = 0;
    start_walk(p, items, 0, len, prefetch_block);
    for (Py_ssize_t k = 0; k < len; k++) {
        int32_t b;
        walk_ahead(p, items, k, len, prefetch_block);
        if (block_of(p, items[k], &b)) {
            failed = 1;
            break;
        }
        int32_t left = --p->blk[b].ref;
        if (left == 0)
            freed[nfreed++] = b;
        else if (left < 0) {
            set_error_about(p, PyExc_ValueError, b, "freed more often than referenced");
            failed = 1;
            break;
        }
    }
    p->num_used -= nfreed;
    for (Py_ssize_t k = 0; k < nfreed; k++)
        push_free(p, freed[k]);
    if (freed != stack)
        PyMem_Free(freed);
    return failed ? -1 : 0;
}

static PyObject *Pool_free_blocks(Pool *p, PyObject *ordered)
{
    REQUIRE_READY(p);
    PyObject *seq = PySequence_Fast(ordered, "free_blocks takes an iterable of blocks");
    if (seq == NULL)
        return NULL;
    int rc = free_items(p, PySequence_Fast_ITEMS(seq), PySequence_Fast_GET_SIZE(seq));
    Py_DECREF(seq);
    if (rc)
        return NULL;
    Py_RETURN_NONE;
}

/* free_blocks(reversed(blocks)) for a request's block list, tail first, without building the
 * reversed list (an increment and a decrement of every block's id object, each a cache miss
 * in a pool larger than the caches). */
static PyObject *Pool_free_blocks_reversed(Pool *p, PyObject *blocks)
{
    REQUIRE_READY(p);
    if (!PyList_Check(blocks)) {
        PyErr_SetString(PyExc_TypeError, "free_blocks_reversed takes a list of blocks");
        return NULL;
    }
    Py_ssize_t len = PyList_GET_SIZE(blocks);
    PyObject *stack[64] = {NULL};
    PyObject **items = len <= 64 ? stack : PyMem_Malloc(len * sizeof(PyObject *));
    if (items == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t k = 0; k < len; k++)
        items[k] = PyList_GET_ITEM(blocks, len - 1 - k); /* (borrowed: the list holds them) */
    int rc = free_items(p, items, len);
    if (items != stack)
        PyMem_Free(items);
    if (rc)
        return NULL;
    Py_RETURN_NONE;
}

/* -- prefix cache -------------------------------------------------------------------------- */

static PyObject *Pool_lookup(Pool *p, PyObject *arg)
{
    REQUIRE_READY(p);
    uint64_t h;
    if (hash_of(arg, &h))
        return NULL;
    int32_t b = map_get(p, h);
    if (b < 0)
        Py_RETURN_NONE;
    Py_INCREF(p->blk[b].id);
    return p->blk[b].id;
}

static PyObject *Pool_lookup_prefix(Pool *p, PyObject *hashes)
{
    REQUIRE_READY(p);
    Hashes hs;
    if (hashes_open(hashes, &hs, "lookup_prefix takes a sequence of hashes"))
        return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        hashes_close(&hs);
        return NULL;
    }
    Py_ssize_t len = hs.len;
    start_hashes(p, &hs, 0, len);
    for (Py_ssize_t k = 0; k < len; k++) {
        uint64_t h;
        hashes_ahead(p, &hs, k, len);
        if (hashes_get(&hs, k, &h)) {
            Py_DECREF(out);
            hashes_close(&hs);
            return NULL;
        }
        int32_t b = map_get(p, h);
        if (b < 0)
            break;
        if (PyList_Append(out, p->blk[b].id)) {
            Py_DECREF(out);
            hashes_close(&hs);
            return NULL;
        }
    }
    hashes_close(&hs);
    return out;
}

static PyObject *Pool_num_cached_prefix(Pool *p, PyObject *hashes)
{
    REQUIRE_READY(p);
    Hashes hs;
    if (hashes_open(hashes, &hs, "num_cached_prefix takes a sequence of hashes"))
        return NULL;
    Py_ssize_t k = 0;
    for (; k < hs.len; k++) {
        uint64_t h;
        if (hashes_get(&hs, k, &h)) {
            hashes_close(&hs);
            return NULL;
        }
        if (map_get(p, h) < 0)
            break;
    }
    hashes_close(&hs);
    return PyLong_FromSsize_t(k);
}

static PyObject *Pool_num_reviving(Pool *p, PyObject *blocks)
{
    REQUIRE_READY(p);
    PyObject *seq = PySequence_Fast(blocks, "num_reviving takes a sequence of blocks");
    if (seq == NULL)
        return NULL;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_ssize_t count = 0;
    for (Py_ssize_t k = 0; k < len; k++) {
        int32_t b;
        if (block_of(p, items[k], &b)) {
            Py_DECREF(seq);
            return NULL;
        }
        count += p->blk[b].ref == 0;
    }
    Py_DECREF(seq);
    return PyLong_FromSsize_t(count);
}

/* Block b is cached under h (the map holds it already). */
static inline void set_registered(Pool *p, int32_t b, uint64_t h, int has_parent, uint64_t parent)
{
    Block *k = &p->blk[b];
    k->hash = h;
    k->parent = parent;
    k->flags = (uint8_t)((k->flags & F_FREE) | F_HASHED | (has_parent ? F_PARENT : 0));
    k->seq = p->next_seq++;
}

static int add_run(PyObject *runs, Py_ssize_t start, Py_ssize_t end)
{
    PyObject *run = Py_BuildValue("(nn)", start, end);
    if (run == NULL)
        return -1;
    int rc = PyList_Append(runs, run);
    Py_DECREF(run);
    return rc;
}

/* cache_full_blocks(blocks, start, end, block_hashes, token_ids, lora_name=None,
 * session_id=None): make blocks[start:end] findable under block_hashes[start:end]; a block
 * whose hash is cached already is replaced in the table by the cached one, and released (the
 * Python pool's per-block path, which its all-new fast path matches). When recording, the runs of blocks
 * newly stored are noted for `take_stored` (their events: tokens, LoRA and session are the
 * caller's). */
static PyObject *Pool_cache_full_blocks(Pool *p, PyObject *const *args, Py_ssize_t nargs)
{
    REQUIRE_READY(p);
    if (nargs < 5 || nargs > 7) {
        PyErr_SetString(PyExc_TypeError,
                        "cache_full_blocks(blocks, start, end, block_hashes, token_ids, "
                        "lora_name=None, session_id=None)");
        return NULL;
    }
    PyObject *blocks = args[0], *hashes = args[3];
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t end = PyLong_AsSsize_t(args[2]);
    if (end == -1 && PyErr_Occurred())
        return NULL;
    if (!p->enable_caching || start >= end)
        Py_RETURN_NONE;
    if (!PyList_Check(blocks)) {
        PyErr_SetString(PyExc_TypeError, "cache_full_blocks takes the request's block list");
        return NULL;
    }
    Hashes hs;
    if (hashes_open(hashes, &hs, "block_hashes must be a sequence"))
        return NULL;
    Py_ssize_t nh = hs.len;
    /* Recording: the (start, end) runs of blocks newly stored, as the Python pool's events
     * cover them (a block already cached ends a run). */
    PyObject *runs = p->record ? p->stored : NULL;
    Py_ssize_t run_start = -1;
    /* (Bounds of the prefetching walks: a bad index raises when the walk reaches it.) */
    Py_ssize_t h_end = end < nh ? end : nh;
    Py_ssize_t b_end = end < PyList_GET_SIZE(blocks) ? end : PyList_GET_SIZE(blocks);
    if (start >= 0) {
        start_hashes(p, &hs, start, h_end);
        start_walk(p, PySequence_Fast_ITEMS(blocks), start, b_end, prefetch_block);
    }
    for (Py_ssize_t i = start; i < end; i++) {
        if (i >= 0) {
            hashes_ahead(p, &hs, i, h_end);
            /* (Re-read: an adopted block replaces an item as the walk goes.) */
            walk_ahead(p, PySequence_Fast_ITEMS(blocks), i, b_end, prefetch_block);
        }
        if (i >= PyList_GET_SIZE(blocks) || i >= nh || i < 0) {
            PyErr_SetString(PyExc_IndexError, "list index out of range");
            goto fail;
        }
        int32_t b;
        uint64_t h, parent = 0;
        if (block_of(p, PyList_GET_ITEM(blocks, i), &b) || hashes_get(&hs, i, &h))
            goto fail;
        if (i > 0 && hashes_get(&hs, i - 1, &parent))
            goto fail;
        if ((p->blk[b].flags & F_HASHED) && p->blk[b].hash != h) {
            /* (Never from the engine: a block is registered once. Refused, so the map never
             * holds more entries than there are blocks.) */
            set_error_about(p, PyExc_ValueError, b, "is cached under another hash already");
            goto fail;
        }
        int32_t existing = map_get_or_put(p, h, b);
        if (existing < 0) {
            set_registered(p, b, h, i > 0, parent);
            if (run_start < 0)
                run_start = i;
            continue;
        }
        if (runs != NULL && run_start >= 0 && add_run(runs, run_start, i))
            goto fail;
        run_start = -1;
        if (existing != b) {
            /* Another request computed this block first: adopt its copy, release ours. */
            if (touch_one(p, existing))
                goto fail;
            PyObject *id = p->blk[existing].id;
            Py_INCREF(id);
            PyList_SetItem(blocks, i, id);
            int32_t left = --p->blk[b].ref;
            if (left == 0) {
                p->num_used--;
                push_free(p, b);
            } else if (left < 0) {
                set_error_about(p, PyExc_ValueError, b, "freed more often than referenced");
                goto fail;
            }
        }
    }
    hashes_close(&hs);
    if (runs != NULL && run_start >= 0 && add_run(runs, run_start, end))
        return NULL;
    Py_RETURN_NONE;
fail:
    hashes_close(&hs);
    return NULL;
}

typedef struct {
    uint64_t seq;
    int32_t block;
} Registered;

static int by_seq(const void *a, const void *b)
{
    uint64_t x = ((const Registered *)a)->seq, y = ((const Registered *)b)->seq;
    return (x > y) - (x < y);
}

/* Forget every cached block nobody references, but keep the ancestors of referenced ones
 * (the Python pool's `reset_prefix_cache` and its `_reset_map`, in its map's order). */
static PyObject *Pool_reset_prefix_cache(Pool *p, PyObject *Py_UNUSED(ignored))
{
    REQUIRE_READY(p);
    Py_ssize_t n = p->n;
    uint8_t *keep = PyMem_Calloc(n ? n : 1, 1);
    Registered *cleared = PyMem_Malloc((n ? n : 1) * sizeof(Registered));
    if (keep == NULL || cleared == NULL) {
        PyMem_Free(keep);
        PyMem_Free(cleared);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t b = 0; b < n; b++) {
        if (!(p->blk[b].flags & F_HASHED) || p->blk[b].ref == 0)
            continue;
        int32_t c = (int32_t)b;
        while (c >= 0 && !keep[c]) {
            keep[c] = 1;
            if (!(p->blk[c].flags & F_PARENT))
                break;
            c = map_get(p, p->blk[c].parent);
        }
    }
    Py_ssize_t m = 0;
    for (Py_ssize_t b = 0; b < n; b++)
        if ((p->blk[b].flags & F_HASHED) && !keep[b])
            cleared[m++] = (Registered){p->blk[b].seq, (int32_t)b};
    /* The Python pool walks its map in insertion order, and each cleared block goes to the
     * head of the free list in turn: the same order here. */
    qsort(cleared, m, sizeof(Registered), by_seq);
    for (Py_ssize_t i = 0; i < m; i++) {
        int32_t b = cleared[i].block;
        if (p->blk[b].flags & F_FREE)
            unlink_block(p, b);
        map_del(p, p->blk[b].hash);
        if (note_evicted(p, p->blk[b].hash)) {
            PyMem_Free(keep);
            PyMem_Free(cleared);
            return NULL;
        }
        p->blk[b].flags &= ~(F_HASHED | F_PARENT);
        push_free(p, b);
    }
    PyMem_Free(keep);
    PyMem_Free(cleared);
    return PyLong_FromSsize_t(m);
}

/* -- inspection (tests, checks) ---------------------------------------------------------- */

static PyObject *Pool_cached_hashes(Pool *p, PyObject *const *args, Py_ssize_t nargs)
{
    REQUIRE_READY(p);
    if (nargs > 1 || (nargs == 1 && PyLong_AsLong(args[0]) != 0)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "a dense pool has one group: 0");
        return NULL;
    }
    PyObject *out = PyDict_New();
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i <= p->mask; i++) {
        if (p->slots[i].val < 0)
            continue;
        PyObject *k = PyLong_FromUnsignedLongLong(p->slots[i].key);
        if (k == NULL || PyDict_SetItem(out, k, p->blk[p->slots[i].val].id)) {
            Py_XDECREF(k);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(k);
    }
    return out;
}

static PyObject *Pool_free_order(Pool *p, PyObject *Py_UNUSED(ignored))
{
    REQUIRE_READY(p);
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (int64_t at = p->qhead; at < p->qtail; at++) {
        int32_t b = Q_AT(p, at);
        if (b >= 0 && PyList_Append(out, p->blk[b].id)) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

static PyObject *take_list(PyObject **slot)
{
    PyObject *fresh = PyList_New(0);
    if (fresh == NULL)
        return NULL;
    PyObject *out = *slot;
    *slot = fresh;
    return out;
}

static PyObject *Pool_take_evicted(Pool *p, PyObject *Py_UNUSED(ignored))
{
    REQUIRE_READY(p);
    return take_list(&p->evicted);
}

static PyObject *Pool_take_stored(Pool *p, PyObject *Py_UNUSED(ignored))
{
    REQUIRE_READY(p);
    return take_list(&p->stored);
}

/* The cached blocks in the order they were registered (the Python pool's map order). */
static PyObject *Pool_cached_in_order(Pool *p, PyObject *Py_UNUSED(ignored))
{
    REQUIRE_READY(p);
    Registered *all = PyMem_Malloc((p->n ? p->n : 1) * sizeof(Registered));
    if (all == NULL)
        return PyErr_NoMemory();
    Py_ssize_t m = 0;
    for (Py_ssize_t b = 0; b < p->n; b++)
        if (p->blk[b].flags & F_HASHED)
            all[m++] = (Registered){p->blk[b].seq, (int32_t)b};
    qsort(all, m, sizeof(Registered), by_seq);
    PyObject *out = PyList_New(m);
    if (out != NULL) {
        for (Py_ssize_t i = 0; i < m; i++) {
            Py_INCREF(p->blk[all[i].block].id);
            PyList_SET_ITEM(out, i, p->blk[all[i].block].id);
        }
    }
    PyMem_Free(all);
    return out;
}

static PyObject *Pool_ref_cnt(Pool *p, PyObject *arg)
{
    REQUIRE_READY(p);
    int32_t b;
    if (block_of(p, arg, &b))
        return NULL;
    return PyLong_FromLong(p->blk[b].ref);
}

static PyObject *Pool_block_hash(Pool *p, PyObject *arg)
{
    REQUIRE_READY(p);
    int32_t b;
    if (block_of(p, arg, &b))
        return NULL;
    if (!(p->blk[b].flags & F_HASHED))
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(p->blk[b].hash);
}

static PyObject *Pool_parent_hash(Pool *p, PyObject *arg)
{
    REQUIRE_READY(p);
    int32_t b;
    if (block_of(p, arg, &b))
        return NULL;
    if (!(p->blk[b].flags & F_PARENT))
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(p->blk[b].parent);
}

/* Each block's hash (parents: its parent's), None where it has none: the tiers name a store's
 * copies by them (one call for a batch, not one per block). `strict`: a block with no hash is
 * an error (a RuntimeError: a store names cached blocks only). */
static PyObject *hashes_of(Pool *p, PyObject *arg, int parents, int strict)
{
    REQUIRE_READY(p);
    PyObject *seq = PySequence_Fast(arg, "blocks must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        goto fail;
    uint32_t flag = parents ? F_PARENT : F_HASHED;
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t b;
        if (block_of(p, items[i], &b))
            goto fail;
        const Block *x = &p->blk[b];
        if (strict && !(x->flags & flag)) {
            PyErr_SetString(PyExc_RuntimeError,
                            "a block to store holds no hash (it is not cached)");
            goto fail;
        }
        PyObject *h = !(x->flags & flag) ? Py_NewRef(Py_None)
                      : PyLong_FromUnsignedLongLong(parents ? x->parent : x->hash);
        if (h == NULL)
            goto fail;
        PyList_SET_ITEM(out, i, h);
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

static PyObject *Pool_block_hashes(Pool *p, PyObject *arg)
{
    return hashes_of(p, arg, 0, 0);
}

static PyObject *Pool_store_hashes(Pool *p, PyObject *arg)
{
    return hashes_of(p, arg, 0, 1);
}

static PyObject *Pool_parent_hashes(Pool *p, PyObject *arg)
{
    return hashes_of(p, arg, 1, 0);
}

static PyObject *Pool_get_num_blocks(Pool *p, void *Py_UNUSED(c))
{
    return PyLong_FromSsize_t(p->n);
}
static PyObject *Pool_get_num_free(Pool *p, void *Py_UNUSED(c))
{
    return PyLong_FromSsize_t(p->free_len);
}
static PyObject *Pool_get_num_used(Pool *p, void *Py_UNUSED(c))
{
    return PyLong_FromSsize_t(p->num_used);
}
static PyObject *Pool_get_block_size(Pool *p, void *Py_UNUSED(c))
{
    return PyLong_FromSsize_t(p->block_size);
}
static PyObject *Pool_get_enable_caching(Pool *p, void *Py_UNUSED(c))
{
    return PyBool_FromLong(p->enable_caching);
}

static PyObject *Pool_get_record_events(Pool *p, void *Py_UNUSED(c))
{
    return PyBool_FromLong(p->record);
}

static PyObject *Pool_get_usage(Pool *p, void *Py_UNUSED(c))
{
    return PyFloat_FromDouble(p->n ? (double)p->num_used / (double)p->n : 0.0);
}

static PyMethodDef Pool_methods[] = {
    {"get_new_blocks", (PyCFunction)Pool_get_new_blocks, METH_O,
     "Take n blocks off the free side, evicting cached ones in LRU order."},
    {"touch", (PyCFunction)Pool_touch, METH_O,
     "Add a reference to each block (prefix hit); a cached-free block leaves the free side."},
    {"free_blocks", (PyCFunction)Pool_free_blocks, METH_O,
     "Drop one reference from each block; pass blocks in the order they should be reused."},
    {"free_blocks_reversed", (PyCFunction)Pool_free_blocks_reversed, METH_O,
     "free_blocks(reversed(blocks)) for a list: a request's blocks, tail first."},
    {"lookup", (PyCFunction)Pool_lookup, METH_O, "The cached block of a hash, or None."},
    {"lookup_prefix", (PyCFunction)Pool_lookup_prefix, METH_O,
     "The cached blocks of the longest prefix of the hashes found in the cache."},
    {"num_cached_prefix", (PyCFunction)Pool_num_cached_prefix, METH_O,
     "How many leading hashes are cached, stopping at the first miss."},
    {"num_reviving", (PyCFunction)Pool_num_reviving, METH_O,
     "How many of these cached blocks are free (taking them takes them off the free side)."},
    {"cache_full_blocks", (PyCFunction)(void (*)(void))Pool_cache_full_blocks, METH_FASTCALL,
     "Make blocks[start:end] findable under block_hashes[start:end]."},
    {"reset_prefix_cache", (PyCFunction)Pool_reset_prefix_cache, METH_NOARGS,
     "Forget every cached block nobody references; how many were forgotten."},
    {"cached_hashes", (PyCFunction)(void (*)(void))Pool_cached_hashes, METH_FASTCALL,
     "A copy of the hash -> block map."},
    {"free_order", (PyCFunction)Pool_free_order, METH_NOARGS, "Free blocks in reuse order."},
    {"take_evicted", (PyCFunction)Pool_take_evicted, METH_NOARGS,
     "Recording: the hashes that left the cache since the last call, in order."},
    {"take_stored", (PyCFunction)Pool_take_stored, METH_NOARGS,
     "Recording: the (start, end) runs cache_full_blocks newly stored since the last call."},
    {"cached_in_order", (PyCFunction)Pool_cached_in_order, METH_NOARGS,
     "The cached blocks in the order they were registered."},
    {"ref_cnt", (PyCFunction)Pool_ref_cnt, METH_O, "A block's reference count."},
    {"block_hash", (PyCFunction)Pool_block_hash, METH_O, "A block's hash, or None."},
    {"parent_hash", (PyCFunction)Pool_parent_hash, METH_O, "A cached block's parent hash."},
    {"block_hashes", (PyCFunction)Pool_block_hashes, METH_O,
     "Each block's hash (None: not cached); the tiers name copies by them."},
    {"parent_hashes", (PyCFunction)Pool_parent_hashes, METH_O, "Each block's parent hash."},
    {"store_hashes", (PyCFunction)Pool_store_hashes, METH_O,
     "Each block's hash (RuntimeError: one holds none)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Pool_getset[] = {
    {"num_blocks", (getter)Pool_get_num_blocks, NULL, NULL, NULL},
    {"num_free", (getter)Pool_get_num_free, NULL, "Free and cached-free blocks.", NULL},
    {"num_reusable", (getter)Pool_get_num_free, NULL, "Blocks that can be handed out now.",
     NULL},
    {"num_used", (getter)Pool_get_num_used, NULL, "Referenced blocks.", NULL},
    {"usage", (getter)Pool_get_usage, NULL, "vLLM's kv_cache_usage_perc.", NULL},
    {"block_size", (getter)Pool_get_block_size, NULL, NULL, NULL},
    {"enable_caching", (getter)Pool_get_enable_caching, NULL, NULL, NULL},
    {"record_events", (getter)Pool_get_record_events, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PoolType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mocker.kv._cpool.Pool",
    .tp_basicsize = sizeof(Pool),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The device block pool over packed arrays (see mocker.kv.compiled_pool).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Pool_init,
    .tp_dealloc = (destructor)Pool_dealloc,
    .tp_methods = Pool_methods,
    .tp_getset = Pool_getset,
};

static struct PyModuleDef cpool_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "mocker.kv._cpool",
    .m_doc = "The device block pool over packed arrays (the Python pool is the reference).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__cpool(void)
{
    if (PyType_Ready(&PoolType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&cpool_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&PoolType);
    if (PyModule_AddObject(m, "Pool", (PyObject *)&PoolType) < 0) {
        Py_DECREF(&PoolType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
