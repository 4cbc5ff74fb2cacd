/* mocker's compiled LRU order for a tier's blocks (resident ones in recency order, incoming
 * ones beside them): mocker.tiers.lru_order.LruOrder's verbs over flat arrays (PyLruOrder, on
 * an OrderedDict and a dict, is the reference and serves when this was not built or
 * MOCKER_COMPILED=0; tests/tiers/test_lru_order.py compares the two).
 *
 * Why: a tier key is a 64-bit block hash, but in an OrderedDict each one is an int object of
 * its own somewhere on the heap (its hash reads it), inside a node that is another allocation
 * linked to two more, so making a copy resident is mostly cache misses.
 * Here a key is 8 bytes (and a sign bit) in a node array, found through one open-addressing
 * table of node indexes (linear probing, backward-shift deletion: no tombstones), and the
 * recency order is a doubly linked list of node indexes. Keys and parents are read from
 * lists, tuples or 8-byte unsigned buffers (a replay's array of hashes) without making int
 * objects.
 * Kept for: bench/compiled_parts.py's `replay_tiers` figure (what it buys: bench/README.md).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>


#define NIL (-1)
#define GOLDEN 0x9E3779B97F4A7C15ull
#define MAX_NODES 0x3FFFFFFF /* node indexes are int32 */

/* A key: an int in -2**63..2**64-1 (block hashes are 0..2**64-1; tests use negative ones too),
 * as its low 64 bits and whether it is negative. */
typedef struct {
    uint64_t v;
    uint32_t neg;
} Key;

static inline int same(Key a, Key b)
{
    return a.v == b.v && a.neg == b.neg;
}

enum { HAS_PARENT = 1, MARK = 2 };           /* flags */
enum { FREE = 0, RESIDENT = 1, INCOMING = 2 }; /* states: only resident nodes are listed */

typedef struct {
    uint64_t key;     /* Key.v */
    uint64_t parent;  /* Key.v, meaningful when flags has HAS_PARENT */
    int32_t prev;     /* towards the least recently used end */
    int32_t next;     /* towards the most recently used end; the free list's link */
    int32_t slot;     /* where the table names this node */
    uint8_t flags;    /* HAS_PARENT, MARK (a batch's validation) */
    uint8_t key_neg;  /* Key.neg */
    uint8_t parent_neg;
    uint8_t state;
} Node;

static inline Key node_key(const Node *x)
{
    return (Key){x->key, x->key_neg};
}

typedef struct {
    PyObject_HEAD
    Node *nodes;
    int32_t nodes_cap;
    int32_t free_list;  /* unused nodes, linked by next */
    int32_t used;       /* nodes handed out at least once (the rest are past the free list) */
    uint64_t *table;    /* a key's tag (high half) and its node (low half, NIL: empty) */
    uint32_t mask;      /* table size - 1 (a power of two, at least twice the nodes) */
    int bits;           /* log2 of the table size */
    Py_ssize_t len;       /* resident nodes */
    Py_ssize_t incoming;  /* reserved nodes, not listed (a copy on its way) */
    int32_t lru, mru;     /* the list's ends, NIL when empty */
    uint64_t version;     /* bumped by every change of a node's place (scan's guard) */
} LruMap;

/* -- keys in: ints, from a list/tuple or an 8-byte unsigned buffer ---------------------------- */

typedef struct {
    PyObject *fast;      /* a list/tuple of ints and Nones only (owned), or NULL */
    PyObject **items;
    const uint64_t *words;
    Py_buffer view;
    int has_view;
    Py_ssize_t n;
} Keys;

/* An int's key (no Python code runs: the int's value is read, never its __index__). */
static int long_key(PyObject *obj, Key *out)
{
    uint64_t v = PyLong_AsUnsignedLongLong(obj);
    if (v == (uint64_t)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
            return -1;
        }
        PyErr_Clear();
        long long s = PyLong_AsLongLong(obj); /* a negative key, or out of range */
        if (s == -1 && PyErr_Occurred()) {
            PyErr_SetString(PyExc_OverflowError, "a tier key is an int in -2**63..2**64-1");
            return -1;
        }
        *out = (Key){(uint64_t)s, 1};
        return 0;
    }
    *out = (Key){v, 0};
    return 0;
}

/* A single key given as an object: an int, or an integer of another type (numpy's) by its
 * index, as a dict would hash it. (Only where nothing of the map is held across the call.) */
static int key_of(PyObject *obj, Key *out)
{
    if (PyLong_Check(obj)) {
        return long_key(obj, out);
    }
    PyObject *index = PyNumber_Index(obj);
    if (index == NULL) {
        return -1;
    }
    int r = long_key(index, out);
    Py_DECREF(index);
    return r;
}

static PyObject *key_obj(Key key)
{
    return key.neg ? PyLong_FromLongLong((long long)key.v) : PyLong_FromUnsignedLongLong(key.v);
}

/* `seq` as a list or tuple whose items are all ints (or None, if `none_ok`): itself when they
 * are (the common case: a check per item) and `copy` is 0, else a new tuple of their indexes
 * made from a copy of the sequence (*slow set: Python code may have run). Once this returns,
 * reading the items runs no Python code, so a key's __index__ cannot change them or the map
 * under a verb. */
static PyObject *int_items(PyObject *seq, int none_ok, const char *what, int copy, int *slow)
{
    PyObject *fast = PySequence_Fast(seq, what);
    if (fast == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    Py_ssize_t i = 0;
    while (!copy && i < n && (PyLong_Check(items[i]) || (none_ok && items[i] == Py_None))) {
        i++;
    }
    if (!copy && i == n) {
        return fast;
    }
    *slow = 1;
    PyObject *own = PySequence_Tuple(fast); /* (its own references: the list may change) */
    Py_DECREF(fast);
    if (own == NULL) {
        return NULL;
    }
    n = PyTuple_GET_SIZE(own);
    PyObject *ints = PyTuple_New(n);
    for (i = 0; ints != NULL && i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(own, i);
        PyObject *v = PyLong_CheckExact(item) || (none_ok && item == Py_None)
                          ? Py_NewRef(item) : PyNumber_Index(item);
        if (v == NULL) {
            Py_CLEAR(ints);
            break;
        }
        PyTuple_SET_ITEM(ints, i, v);
    }
    Py_DECREF(own);
    return ints;
}

static int keys_open_as(PyObject *seq, Keys *k, int copy, int *slow)
{
    memset(k, 0, sizeof(*k));
    if (!PyList_Check(seq) && !PyTuple_Check(seq) && PyObject_CheckBuffer(seq)) {
        if (PyObject_GetBuffer(seq, &k->view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
            return -1;
        }
        k->has_view = 1; /* (while it is held, the exporter cannot resize the buffer) */
        const char *f = k->view.format ? k->view.format : "B";
#if PY_LITTLE_ENDIAN
        if (*f == '<' || *f == '=' || *f == '@') {
#else
        if (*f == '>' || *f == '!' || *f == '=' || *f == '@') {
#endif
            f++;
        }
        if (k->view.itemsize != 8 || (strcmp(f, "Q") != 0 && strcmp(f, "L") != 0 &&
                                      strcmp(f, "K") != 0)) {
            PyErr_Format(PyExc_TypeError, "keys from a buffer must be 8-byte unsigned ints in "
                         "this machine's order, not format %.20s",
                         k->view.format ? k->view.format : "B");
            PyBuffer_Release(&k->view);
            k->has_view = 0;
            return -1;
        }
        k->words = (const uint64_t *)k->view.buf;
        k->n = k->view.len / 8;
        return 0;
    }
    k->fast = int_items(seq, 0, "keys must be a sequence", copy, slow);
    if (k->fast == NULL) {
        return -1;
    }
    k->items = PySequence_Fast_ITEMS(k->fast);
    k->n = PySequence_Fast_GET_SIZE(k->fast);
    return 0;
}

static int keys_open(PyObject *seq, Keys *k)
{
    int slow = 0;
    return keys_open_as(seq, k, 0, &slow);
}

static void keys_close(Keys *k);

/* Keys and their parents (ints or None), both readable without running Python code: if
 * reading one ran any (an __index__), the other may have changed meanwhile, so both are
 * taken again as copies. *ps: the parents' list or tuple (owned). */
static int pair_open(PyObject *keys, PyObject *parents, Keys *k, PyObject **ps)
{
    const char *what = "parents must be a sequence";
    int slow = 0;
    if (keys_open_as(keys, k, 0, &slow) < 0) {
        return -1;
    }
    *ps = int_items(parents, 1, what, 0, &slow);
    if (*ps != NULL && slow) {
        keys_close(k);
        Py_DECREF(*ps);
        *ps = NULL;
        if (keys_open_as(keys, k, 1, &slow) < 0) {
            return -1;
        }
        *ps = int_items(parents, 1, what, 1, &slow);
    }
    if (*ps == NULL) {
        keys_close(k);
        return -1;
    }
    if (PySequence_Fast_GET_SIZE(*ps) != k->n) {
        PyErr_Format(PyExc_ValueError, "%zd keys but %zd parents", k->n,
                     PySequence_Fast_GET_SIZE(*ps));
        Py_CLEAR(*ps);
        keys_close(k);
        return -1;
    }
    return 0;
}

static inline int keys_get(Keys *k, Py_ssize_t i, Key *out)
{
    if (k->words != NULL) {
        *out = (Key){k->words[i], 0};
        return 0;
    }
    return long_key(k->items[i], out);
}

static void keys_close(Keys *k)
{
    Py_XDECREF(k->fast);
    if (k->has_view) {
        PyBuffer_Release(&k->view);
    }
}

/* -- the table --------------------------------------------------------------------------------- */

/* A key's tag: the high half of its hash. The table keeps it beside the node's index, so a
 * probe that passes other keys, a miss, an insertion and a deletion's shifts read the table
 * alone (the nodes are scattered: each one read is likely a cache miss). A key's home slot is
 * the tag's top `bits` bits (the table never has more than 2^31 slots). */
static inline uint32_t tag_of(Key key)
{
    return (uint32_t)(((key.v ^ key.neg) * GOLDEN) >> 32);
}

static inline uint32_t home_of_tag(const LruMap *m, uint32_t tag)
{
    return tag >> (32 - m->bits);
}

static inline int32_t entry_node(uint64_t e)
{
    return (int32_t)(uint32_t)e;
}

static inline uint64_t entry(uint32_t tag, int32_t n)
{
    return ((uint64_t)tag << 32) | (uint32_t)n;
}

/* The node holding `key`, or NIL. */
static inline int32_t find(const LruMap *m, Key key)
{
    uint32_t tag = tag_of(key);
    uint32_t i = home_of_tag(m, tag);
    for (;;) {
        uint64_t e = m->table[i];
        int32_t n = entry_node(e);
        if (n == NIL || ((uint32_t)(e >> 32) == tag && same(node_key(&m->nodes[n]), key))) {
            return n;
        }
        i = (i + 1) & m->mask;
    }
}

/* The node at `c` holds `key` (a live node: one node per key, so it is the key's). */
static inline int holds_at(const LruMap *m, int32_t c, Key key)
{
    return c >= 0 && c < m->used && m->nodes[c].state != FREE && same(node_key(&m->nodes[c]), key);
}

/* find(), trying first the nodes beside `near` (the node of the key walked before this one,
 * or NIL): a batch's keys are given neighbouring nodes, so walking a chain either way finds
 * the next key there, without reading the table (a miss of the cache per key, in a big
 * tier). Exact: a live node holding the key is its node. */
static inline int32_t find_near(const LruMap *m, Key key, int32_t near)
{
    if (near != NIL) {
        if (holds_at(m, near + 1, key)) {
            return near + 1;
        }
        if (holds_at(m, near - 1, key)) {
            return near - 1;
        }
    }
    return find(m, key);
}

static void place_tagged(LruMap *m, int32_t n, uint32_t tag)
{
    uint32_t i = home_of_tag(m, tag);
    while (entry_node(m->table[i]) != NIL) {
        i = (i + 1) & m->mask;
    }
    m->table[i] = entry(tag, n);
    m->nodes[n].slot = (int32_t)i;
}

static void place(LruMap *m, int32_t n)
{
    place_tagged(m, n, tag_of(node_key(&m->nodes[n])));
}

static int resize_table(LruMap *m, int bits)
{
    size_t size = (size_t)1 << bits;
    uint64_t *table = PyMem_Malloc(size * sizeof(uint64_t));
    if (table == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(table, 0xff, size * sizeof(uint64_t)); /* NIL everywhere */
    uint64_t *old = m->table;
    size_t old_size = old == NULL ? 0 : (size_t)m->mask + 1;
    m->table = table;
    m->bits = bits;
    m->mask = (uint32_t)(size - 1);
    for (size_t i = 0; i < old_size; i++) { /* (the tags are there: no node is read for them) */
        int32_t n = entry_node(old[i]);
        if (n != NIL) {
            place_tagged(m, n, (uint32_t)(old[i] >> 32));
        }
    }
    PyMem_Free(old);
    return 0;
}

/* Backward-shift deletion: the entries after the hole that may move into it do. */
static void unplace(LruMap *m, int32_t n)
{
    uint32_t hole = (uint32_t)m->nodes[n].slot;
    uint32_t j = hole;
    m->table[hole] = entry(0, NIL);
    for (;;) {
        j = (j + 1) & m->mask;
        uint64_t e = m->table[j];
        int32_t other = entry_node(e);
        if (other == NIL) {
            return;
        }
        uint32_t h = home_of_tag(m, (uint32_t)(e >> 32));
        /* `other` may fill the hole unless its home lies cyclically in (hole, j]. */
        if (((j - h) & m->mask) >= ((j - hole) & m->mask)) {
            m->table[hole] = e;
            m->nodes[other].slot = (int32_t)hole;
            m->table[j] = entry(0, NIL);
            hole = j;
        }
    }
}

/* -- the recency list -------------------------------------------------------------------------- */

static inline void unlink_node(LruMap *m, int32_t n)
{
    Node *x = &m->nodes[n];
    if (x->prev != NIL) {
        m->nodes[x->prev].next = x->next;
    } else {
        m->lru = x->next;
    }
    if (x->next != NIL) {
        m->nodes[x->next].prev = x->prev;
    } else {
        m->mru = x->prev;
    }
}

static inline void link_mru(LruMap *m, int32_t n)
{
    Node *x = &m->nodes[n];
    x->prev = m->mru;
    x->next = NIL;
    if (m->mru != NIL) {
        m->nodes[m->mru].next = n;
    } else {
        m->lru = n;
    }
    m->mru = n;
}

static inline void to_mru(LruMap *m, int32_t n)
{
    m->version++;
    if (m->mru != n) {
        unlink_node(m, n);
        link_mru(m, n);
    }
}

/* Room for `more` keys: nodes and a table at most half full. */
static int reserve(LruMap *m, Py_ssize_t more)
{
    Py_ssize_t want = m->len + m->incoming + more;
    if (want > MAX_NODES) {
        PyErr_SetString(PyExc_OverflowError, "too many keys for a compiled LRU order");
        return -1;
    }
    if (want > m->nodes_cap) { /* (the free nodes are nodes_cap - len - incoming) */
        int32_t cap = m->nodes_cap ? m->nodes_cap : 64;
        while (cap < want) {
            cap *= 2;
        }
        Node *nodes = PyMem_Realloc(m->nodes, (size_t)cap * sizeof(Node));
        if (nodes == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        m->nodes = nodes;
        m->nodes_cap = cap;
    }
    int bits = m->bits;
    while (((Py_ssize_t)1 << bits) < 2 * want) {
        bits++;
    }
    if (bits != m->bits) {
        return resize_table(m, bits);
    }
    return 0;
}

/* A new node for `key` (room reserved): resident at the most recently used end, or
 * incoming. */
static int32_t insert(LruMap *m, Key key, Key parent, int has_parent, uint8_t state)
{
    int32_t n;
    if (m->free_list != NIL) {
        n = m->free_list;
        m->free_list = m->nodes[n].next;
    } else if (m->used < m->nodes_cap) {
        n = m->used++;
    } else { /* (reserve() made room: only a change of the map during a call gets here) */
        PyErr_SetString(PyExc_RuntimeError, "LruMap changed during a call");
        return NIL;
    }
    Node *x = &m->nodes[n];
    x->key = key.v;
    x->key_neg = (uint8_t)key.neg;
    x->parent = parent.v;
    x->parent_neg = (uint8_t)parent.neg;
    x->flags = has_parent ? HAS_PARENT : 0;
    x->state = state;
    m->version++;
    place(m, n);
    if (state == RESIDENT) {
        link_mru(m, n);
        m->len++;
    } else {
        m->incoming++;
    }
    return n;
}

static void release(LruMap *m, int32_t n)
{
    m->version++;
    unplace(m, n);
    if (m->nodes[n].state == RESIDENT) {
        unlink_node(m, n);
        m->len--;
    } else {
        m->incoming--;
    }
    m->nodes[n].state = FREE;
    m->nodes[n].next = m->free_list;
    m->free_list = n;
}

/* The resident node holding `key`, or NIL. */
static inline int32_t find_resident(const LruMap *m, Key key)
{
    int32_t n = find(m, key);
    return n != NIL && m->nodes[n].state == RESIDENT ? n : NIL;
}

static PyObject *key_error(Key key)
{
    PyObject *k = key_obj(key);
    if (k != NULL) {
        PyErr_SetObject(PyExc_KeyError, k);
        Py_DECREF(k);
    }
    return NULL;
}

static PyObject *incoming_error(Key key)
{
    PyObject *k = key_obj(key);
    if (k != NULL) {
        PyErr_Format(PyExc_ValueError, "key %R is incoming (reserved, not landed)", k);
        Py_DECREF(k);
    }
    return NULL;
}

static PyObject *parent_of(const Node *x)
{
    if (!(x->flags & HAS_PARENT)) {
        Py_RETURN_NONE;
    }
    return key_obj((Key){x->parent, x->parent_neg});
}

/* -- the type ---------------------------------------------------------------------------------- */

static PyObject *LruMap_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) || (kwds && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "LruMap() takes no arguments");
        return NULL;
    }
    LruMap *m = (LruMap *)type->tp_alloc(type, 0);
    if (m == NULL) {
        return NULL;
    }
    m->free_list = NIL;
    m->lru = m->mru = NIL;
    if (resize_table(m, 4) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return (PyObject *)m;
}

static void LruMap_dealloc(LruMap *m)
{
    PyMem_Free(m->nodes);
    PyMem_Free(m->table);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static Py_ssize_t LruMap_len(LruMap *m)
{
    return m->len;
}

static int LruMap_contains(LruMap *m, PyObject *obj)
{
    Key key;
    if (key_of(obj, &key) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError) &&
            !PyErr_ExceptionMatches(PyExc_TypeError)) {
            return -1;
        }
        PyErr_Clear(); /* no int in -2**63..2**64-1: no key of ours (a dict would say so) */
        return 0;
    }
    return find_resident(m, key) != NIL;
}

static PyObject *LruMap_getitem(LruMap *m, PyObject *obj)
{
    Key key;
    if (key_of(obj, &key) < 0) {
        return NULL;
    }
    int32_t n = find_resident(m, key);
    if (n == NIL) {
        return key_error(key);
    }
    return parent_of(&m->nodes[n]);
}

/* add(keys, parents): each key at the most recently used end with its parent (int or None),
 * in order; a key already there keeps its place and takes the new parent (as
 * OrderedDict.update). ValueError, nothing changed: a key is incoming. */
static PyObject *LruMap_add(LruMap *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "add(keys, parents)");
        return NULL;
    }
    Keys k;
    PyObject *ps;
    if (pair_open(args[0], args[1], &k, &ps) < 0) {
        return NULL;
    }
    PyObject **parents = PySequence_Fast_ITEMS(ps);
    /* Checked first (every key and parent converts, none is incoming), then applied. */
    for (int apply = 0; apply < 2; apply++) {
        if (apply && reserve(m, k.n) < 0) {
            goto fail;
        }
        for (Py_ssize_t i = 0; i < k.n; i++) {
            Key key, parent = {0, 0};
            int has_parent = parents[i] != Py_None;
            if (keys_get(&k, i, &key) < 0 ||
                (has_parent && long_key(parents[i], &parent) < 0)) {
                goto fail;
            }
            int32_t n = find(m, key);
            if (!apply) {
                if (n != NIL && m->nodes[n].state == INCOMING) {
                    incoming_error(key);
                    goto fail;
                }
            } else if (n == NIL) {
                if (insert(m, key, parent, has_parent, RESIDENT) == NIL) {
                    goto fail; /* (cannot happen: room was reserved, and no Python code ran) */
                }
            } else {
                m->nodes[n].parent = parent.v;
                m->nodes[n].parent_neg = (uint8_t)parent.neg;
                m->nodes[n].flags = has_parent ? HAS_PARENT : 0;
            }
        }
    }
    Py_DECREF(ps);
    keys_close(&k);
    Py_RETURN_NONE;
fail:
    Py_DECREF(ps);
    keys_close(&k);
    return NULL;
}

/* -- batch verbs: one walk over the keys ------------------------------------------------------ */

/* Called for each key of a batch in order, with the node holding it (NIL: none); returns 0 to
 * go on, 1 to stop there, -1 on an error (set). */
typedef int (*Visit)(LruMap *m, Keys *k, Py_ssize_t i, Key key, int32_t node, void *ctx);

/* Walk the keys of `seq`: 0, or -1 on an error. */
static int each_key(LruMap *m, PyObject *seq, Visit visit, void *ctx)
{
    Keys k;
    if (keys_open(seq, &k) < 0) {
        return -1;
    }
    int r = 0;
    int32_t near = NIL;
    for (Py_ssize_t i = 0; i < k.n && r == 0; i++) {
        Key key;
        if (keys_get(&k, i, &key) < 0) {
            r = -1;
            break;
        }
        near = find_near(m, key, near);
        r = visit(m, &k, i, key, near, ctx);
    }
    keys_close(&k);
    return r < 0 ? -1 : 0;
}

static inline int is_resident(const LruMap *m, int32_t node)
{
    return node != NIL && m->nodes[node].state == RESIDENT;
}

/* Appends the key to the list `ctx` (a list's own item, or a new int for a buffer's word). */
static int append_key(Keys *k, Py_ssize_t i, Key key, PyObject *out)
{
    PyObject *obj = k->items != NULL ? Py_NewRef(k->items[i]) : key_obj(key);
    if (obj == NULL) {
        return -1;
    }
    int err = PyList_Append(out, obj);
    Py_DECREF(obj);
    return err;
}

/* ctx: an Act, done to each key's resident node; KeyError at a key not resident. */
typedef struct {
    void (*on)(LruMap *m, int32_t n);
} Act;

static int visit_resident(LruMap *m, Keys *k, Py_ssize_t i, Key key, int32_t n, void *ctx)
{
    (void)k, (void)i;
    if (!is_resident(m, n)) {
        key_error(key);
        return -1;
    }
    ((Act *)ctx)->on(m, n);
    return 0;
}

/* ctx: a Py_ssize_t count of resident keys; stops at the first absent one. */
static int visit_until_absent(LruMap *m, Keys *k, Py_ssize_t i, Key key, int32_t n, void *ctx)
{
    (void)k, (void)i, (void)key;
    if (!is_resident(m, n)) {
        return 1;
    }
    ++*(Py_ssize_t *)ctx;
    return 0;
}

/* ctx: an int set to 1 at the first resident key, where it stops. */
static int visit_until_present(LruMap *m, Keys *k, Py_ssize_t i, Key key, int32_t n, void *ctx)
{
    (void)k, (void)i, (void)key;
    *(int *)ctx = is_resident(m, n);
    return *(int *)ctx;
}

/* ctx: an int set to 0 at the first key neither resident nor incoming, where it stops. */
static int visit_until_unheld(LruMap *m, Keys *k, Py_ssize_t i, Key key, int32_t n, void *ctx)
{
    (void)m, (void)k, (void)i, (void)key;
    *(int *)ctx = n != NIL;
    return n == NIL;
}

static int visit_present(LruMap *m, Keys *k, Py_ssize_t i, Key key, int32_t n, void *ctx)
{
    return is_resident(m, n) ? append_key(k, i, key, (PyObject *)ctx) : 0;
}

static int visit_incoming(LruMap *m, Keys *k, Py_ssize_t i, Key key, int32_t n, void *ctx)
{
    return n != NIL && m->nodes[n].state == INCOMING ? append_key(k, i, key, (PyObject *)ctx)
                                                     : 0;
}

static int visit_parent(LruMap *m, Keys *k, Py_ssize_t i, Key key, int32_t n, void *ctx)
{
    (void)k, (void)i;
    if (!is_resident(m, n)) {
        key_error(key);
        return -1;
    }
    PyObject *p = parent_of(&m->nodes[n]);
    if (p == NULL) {
        return -1;
    }
    int err = PyList_Append((PyObject *)ctx, p);
    Py_DECREF(p);
    return err;
}

/* A list filled by a walk, or NULL. */
static PyObject *collect(LruMap *m, PyObject *seq, Visit visit)
{
    PyObject *out = PyList_New(0);
    if (out != NULL && each_key(m, seq, visit, out) < 0) {
        Py_CLEAR(out);
    }
    return out;
}

/* move_to_end(keys): each becomes the most recently used in turn (the last one most of all);
 * KeyError at the first key not here (the ones before it moved). */
static PyObject *LruMap_move_to_end(LruMap *m, PyObject *seq)
{
    Act act = {to_mru};
    if (each_key(m, seq, visit_resident, &act) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* pop_many(keys): take each out; KeyError at the first key not here. */
static PyObject *LruMap_pop_many(LruMap *m, PyObject *seq)
{
    Act act = {release};
    if (each_key(m, seq, visit_resident, &act) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* pop_lru(n): up to n keys taken from the least recently used end, in that order. */
static PyObject *LruMap_pop_lru(LruMap *m, PyObject *arg)
{
    Py_ssize_t want = PyLong_AsSsize_t(arg);
    if (want == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (want > m->len) {
        want = m->len;
    }
    if (want < 0) {
        want = 0;
    }
    PyObject *out = PyList_New(want);
    if (out == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < want; i++) {
        PyObject *key = key_obj(node_key(&m->nodes[m->lru]));
        if (key == NULL) {
            Py_DECREF(out); /* (the keys taken so far are gone: only on a failed allocation) */
            return NULL;
        }
        PyList_SET_ITEM(out, i, key);
        release(m, m->lru);
    }
    return out;
}

static int check_range(Py_ssize_t n, Py_ssize_t *start, Py_ssize_t *stop)
{
    if (*stop > n) {
        PyErr_Format(PyExc_IndexError, "lookup up to %zd of %zd keys", *stop, n);
        return -1;
    }
    if (*start < 0) {
        *start = 0;
    }
    return 0;
}

/* count_run(keys, start, stop): how many of keys[start:stop] are here, contiguously from
 * start (IndexError: stop past the keys). */
static PyObject *LruMap_count_run(LruMap *m, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t start, stop;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "count_run(keys, start, stop)");
        return NULL;
    }
    start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred()) {
        return NULL;
    }
    stop = PyLong_AsSsize_t(args[2]);
    if (stop == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Keys k;
    if (keys_open(args[0], &k) < 0) {
        return NULL;
    }
    if (check_range(k.n, &start, &stop) < 0) {
        keys_close(&k);
        return NULL;
    }
    Py_ssize_t i = start;
    int32_t near = NIL;
    for (; i < stop; i++) {
        Key key;
        if (keys_get(&k, i, &key) < 0) {
            keys_close(&k);
            return NULL;
        }
        near = find_near(m, key, near);
        if (near == NIL || m->nodes[near].state != RESIDENT) {
            break;
        }
    }
    keys_close(&k);
    return PyLong_FromSsize_t(i > start ? i - start : 0);
}

/* contains_all(keys): every key is here. */
static PyObject *LruMap_contains_all(LruMap *m, PyObject *seq)
{
    Py_ssize_t n = PyObject_Length(seq), here = 0;
    if (n < 0 || each_key(m, seq, visit_until_absent, &here) < 0) {
        return NULL;
    }
    return PyBool_FromLong(here == n);
}

/* isdisjoint(keys): no key is here. */
static PyObject *LruMap_isdisjoint(LruMap *m, PyObject *seq)
{
    int met = 0;
    if (each_key(m, seq, visit_until_present, &met) < 0) {
        return NULL;
    }
    return PyBool_FromLong(!met);
}

/* present(keys): the keys that are here, in the order given. */
static PyObject *LruMap_present(LruMap *m, PyObject *seq)
{
    return collect(m, seq, visit_present);
}

/* parents(keys): each key's parent (int or None); KeyError at a key not here. */
static PyObject *LruMap_parents(LruMap *m, PyObject *seq)
{
    return collect(m, seq, visit_parent);
}

/* scan(n, pinned, spared): from the least recently used end, up to n keys in neither
 * `pinned` nor `spared` (containers of ints), and the pinned keys passed on the way:
 * (victims, passed). Nothing moves or leaves. */
static PyObject *LruMap_scan(LruMap *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "scan(n, pinned, spared)");
        return NULL;
    }
    Py_ssize_t want = PyLong_AsSsize_t(args[0]);
    if (want == -1 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *pinned = args[1], *spared = args[2];
    /* (Nothing is spared, most often: an empty tuple or set is not asked.) */
    Py_ssize_t spared_len = PyObject_Length(spared);
    if (spared_len < 0) {
        PyErr_Clear(); /* a container without a length: asked every time */
    }
    int check_spared = spared_len != 0;
    PyObject *victims = PyList_New(0), *passed = PyList_New(0);
    if (victims == NULL || passed == NULL) {
        goto fail;
    }
    /* Asking a container may run Python code (a __contains__, an __eq__) that changes the
     * map: then the walk stops with RuntimeError, as an OrderedDict's iterator does. */
    const uint64_t version = m->version;
    for (int32_t n = m->lru; n != NIL && PyList_GET_SIZE(victims) < want; n = m->nodes[n].next) {
        PyObject *key = key_obj(node_key(&m->nodes[n]));
        if (key == NULL) {
            goto fail;
        }
        int r = PySequence_Contains(pinned, key);
        PyObject *into = NULL;
        if (r > 0) {
            into = passed;
        } else if (r == 0) {
            r = check_spared ? PySequence_Contains(spared, key) : 0;
            into = r == 0 ? victims : NULL;
        }
        if (r < 0 || (into != NULL && PyList_Append(into, key) < 0)) {
            Py_DECREF(key);
            goto fail;
        }
        Py_DECREF(key);
        if (m->version != version) { /* (before `n` is followed to its next) */
            PyErr_SetString(PyExc_RuntimeError, "LruMap changed during scan");
            goto fail;
        }
    }
    return Py_BuildValue("(NN)", victims, passed);
fail:
    Py_XDECREF(victims);
    Py_XDECREF(passed);
    return NULL;
}

/* -- incoming: reserved slots whose copies have not landed ------------------------------------- */

static PyObject *LruMap_get_num_incoming(LruMap *m, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(m->incoming);
}

/* holds(key): resident or incoming. */
static PyObject *LruMap_holds(LruMap *m, PyObject *obj)
{
    Key key;
    if (key_of(obj, &key) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError) &&
            !PyErr_ExceptionMatches(PyExc_TypeError)) {
            return NULL;
        }
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    return PyBool_FromLong(find(m, key) != NIL);
}

/* holds_all(keys): every key is resident or incoming. */
static PyObject *LruMap_holds_all(LruMap *m, PyObject *seq)
{
    int all = 1;
    if (each_key(m, seq, visit_until_unheld, &all) < 0) {
        return NULL;
    }
    return PyBool_FromLong(all);
}

/* The keys inserted as incoming, in order; if one is held already (or comes twice) or fails to
 * convert, what this call inserted is taken out again. 1: inserted, 0: a key was held (nothing
 * changed), -1: an error (nothing changed). */
static int reserve_keys(LruMap *m, PyObject *keys, PyObject *parents_seq)
{
    Keys k;
    PyObject *ps;
    if (pair_open(keys, parents_seq, &k, &ps) < 0) {
        return -1;
    }
    int result = -1;
    int32_t *made = NULL;
    Py_ssize_t done = 0;
    if (reserve(m, k.n) < 0) {
        goto out;
    }
    made = PyMem_Malloc((size_t)(k.n ? k.n : 1) * sizeof(int32_t));
    if (made == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    PyObject **parents = PySequence_Fast_ITEMS(ps);
    result = 1;
    for (Py_ssize_t i = 0; i < k.n; i++) {
        Key key, parent = {0, 0};
        int has_parent = parents[i] != Py_None;
        if (keys_get(&k, i, &key) < 0 || (has_parent && long_key(parents[i], &parent) < 0)) {
            result = -1;
            break;
        }
        if (find(m, key) != NIL) {
            result = 0;
            break;
        }
        int32_t n = insert(m, key, parent, has_parent, INCOMING);
        if (n == NIL) { /* (cannot happen: room was reserved, and no Python code ran) */
            result = -1;
            break;
        }
        made[done++] = n;
    }
    if (result != 1) {
        while (done > 0) {
            release(m, made[--done]);
        }
    }
out:
    PyMem_Free(made);
    Py_DECREF(ps);
    keys_close(&k);
    return result;
}

/* reserve_new(keys, parents): if no key is held (resident or incoming), all become incoming:
 * True; else nothing changes: False. */
static PyObject *LruMap_reserve_new(LruMap *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "reserve_new(keys, parents)");
        return NULL;
    }
    int r = reserve_keys(m, args[0], args[1]);
    return r < 0 ? NULL : PyBool_FromLong(r);
}

/* reserve(keys, parents): every key becomes incoming (ValueError, nothing changed: one is held
 * already, or comes twice). */
static PyObject *LruMap_reserve(LruMap *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "reserve(keys, parents)");
        return NULL;
    }
    int r = reserve_keys(m, args[0], args[1]);
    if (r == 0) {
        PyErr_SetString(PyExc_ValueError, "reserve: a key is held already (or comes twice)");
    }
    if (r <= 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* incoming_present(keys): the keys that are incoming, in the order given. */
static PyObject *LruMap_incoming_present(LruMap *m, PyObject *seq)
{
    return collect(m, seq, visit_incoming);
}

static void unmark(LruMap *m, const int32_t *nodes, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        m->nodes[nodes[i]].flags &= (uint8_t)~MARK;
    }
}

/* A batch's nodes into `out`, each marked: every key incoming and none twice, else KeyError
 * (the first key that is not, nothing changed, no mark left). */
static int incoming_nodes(LruMap *m, Keys *k, int32_t *out)
{
    Py_ssize_t i;
    int32_t n = NIL;
    for (i = 0; i < k->n; i++) {
        Key key;
        if (keys_get(k, i, &key) < 0) {
            goto fail;
        }
        n = find_near(m, key, n);
        if (n == NIL || m->nodes[n].state != INCOMING || (m->nodes[n].flags & MARK)) {
            key_error(key);
            goto fail;
        }
        m->nodes[n].flags |= MARK;
        out[i] = n;
    }
    return 0;
fail:
    unmark(m, out, i);
    return -1;
}

static void list_landed(LruMap *m, int32_t n)
{
    m->version++;
    m->nodes[n].state = RESIDENT;
    m->incoming--;
    m->len++;
    link_mru(m, n);
}

static inline int is_parent(const Node *child, const Node *parent)
{
    return (child->flags & HAS_PARENT) && child->parent == parent->key &&
           child->parent_neg == parent->key_neg;
}

/* Whether a node's parent is in the batch being landed (marked). */
static inline int parent_in_batch(const LruMap *m, const Node *x)
{
    if (!(x->flags & HAS_PARENT)) {
        return 0;
    }
    int32_t p = find(m, (Key){x->parent, x->parent_neg});
    return p != NIL && (m->nodes[p].flags & MARK);
}

/* Land a batch of chains children first, as chains_children_first (mocker/tiers/lru_order.py)
 * orders it: chains root first each reversed, chains leaf first kept, the chains in the order
 * of their roots. 0 if a chain branches within the batch (nothing landed). */
static int land_chains(LruMap *m, const int32_t *nodes, Py_ssize_t n)
{
    const Node *x = m->nodes;
    /* One chain (the common batch), whatever its ends' parents: leaf first, or root first. */
    int leaf_first = 1, root_first = 1;
    for (Py_ssize_t i = 1; i < n && (leaf_first || root_first); i++) {
        leaf_first = leaf_first && is_parent(&x[nodes[i - 1]], &x[nodes[i]]);
        root_first = root_first && is_parent(&x[nodes[i]], &x[nodes[i - 1]]);
    }
    if (leaf_first || root_first) {
        for (Py_ssize_t i = 0; i < n; i++) {
            list_landed(m, nodes[leaf_first ? i : n - 1 - i]);
        }
        return 1;
    }
    /* Root-first runs: a run continues while each node's parent is the node before it; the
     * runs are chains when no run's first node has its parent in the batch. */
    int ok = 1;
    for (Py_ssize_t i = 0; i < n && ok; i++) {
        if (i == 0 || !is_parent(&x[nodes[i]], &x[nodes[i - 1]])) {
            ok = !parent_in_batch(m, &x[nodes[i]]);
        }
    }
    if (ok) {
        for (Py_ssize_t lo = 0, hi; lo < n; lo = hi) { /* the runs in order, each reversed */
            hi = lo + 1;
            while (hi < n && is_parent(&x[nodes[hi]], &x[nodes[hi - 1]])) {
                hi++;
            }
            for (Py_ssize_t j = hi - 1; j >= lo; j--) {
                list_landed(m, nodes[j]);
            }
        }
        return 1;
    }
    /* Leaf-first runs: a run continues while each node's parent is the node after it; the
     * runs are chains when no run's last node has its parent in the batch. */
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((i == n - 1 || !is_parent(&x[nodes[i]], &x[nodes[i + 1]])) &&
            parent_in_batch(m, &x[nodes[i]])) {
            return 0;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        list_landed(m, nodes[i]);
    }
    return 1;
}

enum { LAND_ORDERED, LAND_IN_ORDER, DROP };

/* The verbs on a batch of incoming keys (validated first: KeyError, nothing changed). */
static PyObject *incoming_batch(LruMap *m, PyObject *seq, int verb)
{
    Keys k;
    if (keys_open(seq, &k) < 0) {
        return NULL;
    }
    int32_t *nodes = PyMem_Malloc((size_t)(k.n ? k.n : 1) * sizeof(int32_t));
    if (nodes == NULL) {
        keys_close(&k);
        return PyErr_NoMemory();
    }
    PyObject *result = NULL;
    Py_ssize_t n = k.n;
    if (incoming_nodes(m, &k, nodes) < 0) {
        goto out;
    }
    if (verb == LAND_ORDERED && land_chains(m, nodes, n)) {
        unmark(m, nodes, n);
        result = Py_NewRef(Py_None);
        goto out;
    }
    unmark(m, nodes, n);
    if (verb == DROP) {
        for (Py_ssize_t i = 0; i < n; i++) {
            release(m, nodes[i]);
        }
        result = Py_NewRef(Py_None);
        goto out;
    }
    if (verb == LAND_IN_ORDER) {
        for (Py_ssize_t i = 0; i < n; i++) {
            list_landed(m, nodes[i]);
        }
        result = Py_NewRef(Py_None);
        goto out;
    }
    /* A chain branches within the batch: its parents, for the caller's ordering. */
    result = PyList_New(n);
    for (Py_ssize_t i = 0; result != NULL && i < n; i++) {
        PyObject *p = parent_of(&m->nodes[nodes[i]]);
        if (p == NULL) {
            Py_CLEAR(result);
            break;
        }
        PyList_SET_ITEM(result, i, p);
    }
out:
    PyMem_Free(nodes);
    keys_close(&k);
    return result;
}

/* make_resident(keys): these incoming keys become resident, children before parents (so a parent is
 * more recently used than its children) when the batch is chains: None; otherwise nothing
 * changes and their parents are returned, for `make_resident_in_order` after the caller's ordering. */
static PyObject *LruMap_make_resident(LruMap *m, PyObject *seq)
{
    return incoming_batch(m, seq, LAND_ORDERED);
}

static PyObject *LruMap_land_in_order(LruMap *m, PyObject *seq)
{
    return incoming_batch(m, seq, LAND_IN_ORDER);
}

static PyObject *LruMap_drop(LruMap *m, PyObject *seq)
{
    return incoming_batch(m, seq, DROP);
}

/* Every resident key (with_parents: a (key, parent) pair), least recently used first. */
static PyObject *listed(LruMap *m, int with_parents)
{
    PyObject *out = PyList_New(m->len);
    Py_ssize_t i = 0;
    for (int32_t n = m->lru; out != NULL && n != NIL; n = m->nodes[n].next, i++) {
        PyObject *item = key_obj(node_key(&m->nodes[n]));
        if (item != NULL && with_parents) {
            PyObject *parent = parent_of(&m->nodes[n]);
            PyObject *pair = parent != NULL ? PyTuple_Pack(2, item, parent) : NULL;
            Py_XDECREF(parent);
            Py_SETREF(item, pair);
        }
        if (item == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, item);
    }
    return out;
}

/* keys(): every key, least recently used first. */
static PyObject *LruMap_keys(LruMap *m, PyObject *Py_UNUSED(ignored))
{
    return listed(m, 0);
}

/* items(): (key, parent) pairs, least recently used first. */
static PyObject *LruMap_items(LruMap *m, PyObject *Py_UNUSED(ignored))
{
    return listed(m, 1);
}

static PyObject *LruMap_iter(LruMap *m)
{
    PyObject *keys = LruMap_keys(m, NULL);
    if (keys == NULL) {
        return NULL;
    }
    PyObject *it = PyObject_GetIter(keys);
    Py_DECREF(keys);
    return it;
}

static PyMethodDef LruMap_methods[] = {
    {"add", (PyCFunction)(void (*)(void))LruMap_add, METH_FASTCALL,
     "add(keys, parents): at the most recently used end, in order (a key here keeps its place)."},
    {"move_to_end", (PyCFunction)LruMap_move_to_end, METH_O,
     "move_to_end(keys): each the most recently used in turn."},
    {"pop_many", (PyCFunction)LruMap_pop_many, METH_O, "pop_many(keys): take them out."},
    {"pop_lru", (PyCFunction)LruMap_pop_lru, METH_O,
     "pop_lru(n): up to n keys taken from the least recently used end."},
    {"count_run", (PyCFunction)(void (*)(void))LruMap_count_run, METH_FASTCALL,
     "count_run(keys, start, stop): keys[start:stop] here, contiguously from start."},
    {"contains_all", (PyCFunction)LruMap_contains_all, METH_O, "Every key is here."},
    {"isdisjoint", (PyCFunction)LruMap_isdisjoint, METH_O, "No key is here."},
    {"present", (PyCFunction)LruMap_present, METH_O, "The keys that are here, in order."},
    {"parents", (PyCFunction)LruMap_parents, METH_O, "Each key's parent (int or None)."},
    {"scan", (PyCFunction)(void (*)(void))LruMap_scan, METH_FASTCALL,
     "scan(n, pinned, spared): (victims, pinned keys passed) from the least recently used end."},
    {"holds", (PyCFunction)LruMap_holds, METH_O, "Resident or incoming."},
    {"holds_all", (PyCFunction)LruMap_holds_all, METH_O, "Every key resident or incoming."},
    {"reserve_new", (PyCFunction)(void (*)(void))LruMap_reserve_new, METH_FASTCALL,
     "reserve_new(keys, parents): all incoming if none is held (True), else nothing (False)."},
    {"reserve", (PyCFunction)(void (*)(void))LruMap_reserve, METH_FASTCALL,
     "reserve(keys, parents): all incoming (ValueError: one is held, or comes twice)."},
    {"incoming_present", (PyCFunction)LruMap_incoming_present, METH_O,
     "The keys that are incoming, in order."},
    {"make_resident", (PyCFunction)LruMap_make_resident, METH_O,
     "make_resident(keys): incoming -> resident when the batch is chains (None), else its parents."},
    {"make_resident_in_order", (PyCFunction)LruMap_land_in_order, METH_O,
     "make_resident_in_order(keys): incoming -> resident, in this order."},
    {"drop", (PyCFunction)LruMap_drop, METH_O, "drop(keys): incoming keys given up."},
    {"keys", (PyCFunction)LruMap_keys, METH_NOARGS, "Every key, least recently used first."},
    {"items", (PyCFunction)LruMap_items, METH_NOARGS, "(key, parent), least recently used first."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef LruMap_getset[] = {
    {"num_incoming", (getter)LruMap_get_num_incoming, NULL, "Keys reserved, not landed.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods LruMap_as_sequence = {
    .sq_length = (lenfunc)LruMap_len,
    .sq_contains = (objobjproc)LruMap_contains,
};

static PyMappingMethods LruMap_as_mapping = {
    .mp_length = (lenfunc)LruMap_len,
    .mp_subscript = (binaryfunc)LruMap_getitem,
};

static PyTypeObject LruMapType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mocker.tiers._clru.LruMap",
    .tp_doc = PyDoc_STR("A tier's keys (64-bit) -> parent: resident ones in recency order, "
                        "and incoming ones."),
    .tp_basicsize = sizeof(LruMap),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = LruMap_new,
    .tp_dealloc = (destructor)LruMap_dealloc,
    .tp_as_sequence = &LruMap_as_sequence,
    .tp_as_mapping = &LruMap_as_mapping,
    .tp_iter = (getiterfunc)LruMap_iter,
    .tp_methods = LruMap_methods,
    .tp_getset = LruMap_getset,
};

static struct PyModuleDef clru_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "mocker.tiers._clru",
    .m_doc = "A tier's LRU order over flat arrays (mocker.tiers.lru_order is the reference).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__clru(void)
{
    if (PyType_Ready(&LruMapType) < 0) {
        return NULL;
    }
    PyObject *mod = PyModule_Create(&clru_module);
    if (mod == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(mod, "LruMap", (PyObject *)&LruMapType) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
