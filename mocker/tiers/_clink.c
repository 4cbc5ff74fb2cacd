/* A channel between two tiers in C: one direction of a bandwidth-limited link with processor
 * sharing, and the callback of each transfer (mocker.tiers.channel's Channel over
 * mocker.tiers.link's Link is the reference; every figure is computed by the same
 * floating-point expressions, in the same order, so both give the same times bit for bit).
 *
 * Every active transfer has received the same number of bytes since the link went busy, the
 * service V(t), which grows at B/n while n transfers share the link. A transfer started at
 * service V0 has its bytes through when V reaches V0 + nbytes: the sharing transfers are a
 * heap on that target; once through, a transfer waits out the per-transfer latency in a
 * second heap on its finish time. Ties go to the lower transfer id, as the reference's
 * (target, id) tuples do. A transfer lives in one slot of a slab; each heap holds slot
 * numbers and each slot its position in its heap, so a cancel removes it at once. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

enum { FREE = 0, SHARING = 1, DELAYED = 2 };

typedef struct {
    long long tid;  /* the transfer's id: the order of ties */
    double key;     /* the service target while sharing; the finish time once delayed */
    PyObject *done; /* called with the finish time (owned) */
    Py_ssize_t pos; /* index in its heap; the next free slot while free */
    int where;
} Xfer;

typedef struct {
    PyObject_HEAD
    double bandwidth;
    double latency;
    double time;     /* the link's state is known up to here */
    double service;  /* V(time) */
    double deadline; /* next_deadline(), kept until a transfer starts, ends or is cancelled */
    int fresh;
    long long next_id;
    Xfer *xs;
    Py_ssize_t cap;
    Py_ssize_t free_head; /* a free slot (-1: none), chained through `pos` */
    Py_ssize_t *sharing;  /* heap of slots by (target, tid) */
    Py_ssize_t n_sharing;
    Py_ssize_t *delayed;  /* heap of slots by (finish, tid) */
    Py_ssize_t n_delayed;
    PyObject *src;
    PyObject *dst;
} Channel;

/* -- heaps ---------------------------------------------------------------------------------- */

static inline int before(const Xfer *xs, Py_ssize_t a, Py_ssize_t b)
{
    return xs[a].key < xs[b].key || (xs[a].key == xs[b].key && xs[a].tid < xs[b].tid);
}

static void sift_up(Xfer *xs, Py_ssize_t *heap, Py_ssize_t i)
{
    Py_ssize_t slot = heap[i];
    while (i > 0) {
        Py_ssize_t parent = (i - 1) >> 1;
        if (!before(xs, slot, heap[parent])) {
            break;
        }
        heap[i] = heap[parent];
        xs[heap[i]].pos = i;
        i = parent;
    }
    heap[i] = slot;
    xs[slot].pos = i;
}

static void sift_down(Xfer *xs, Py_ssize_t *heap, Py_ssize_t n, Py_ssize_t i)
{
    Py_ssize_t slot = heap[i];
    for (;;) {
        Py_ssize_t child = 2 * i + 1;
        if (child >= n) {
            break;
        }
        if (child + 1 < n && before(xs, heap[child + 1], heap[child])) {
            child++;
        }
        if (!before(xs, heap[child], slot)) {
            break;
        }
        heap[i] = heap[child];
        xs[heap[i]].pos = i;
        i = child;
    }
    heap[i] = slot;
    xs[slot].pos = i;
}

static void heap_push(Xfer *xs, Py_ssize_t *heap, Py_ssize_t *n, Py_ssize_t slot)
{
    heap[*n] = slot;
    (*n)++;
    sift_up(xs, heap, *n - 1);
}

/* Takes the slot at position i out of the heap. */
static void heap_remove(Xfer *xs, Py_ssize_t *heap, Py_ssize_t *n, Py_ssize_t i)
{
    (*n)--;
    if (i == *n) {
        return;
    }
    heap[i] = heap[*n];
    xs[heap[i]].pos = i;
    if (i > 0 && before(xs, heap[i], heap[(i - 1) >> 1])) {
        sift_up(xs, heap, i);
    }
    else {
        sift_down(xs, heap, *n, i);
    }
}

/* -- slots ---------------------------------------------------------------------------------- */

static Py_ssize_t take_slot(Channel *self)
{
    if (self->free_head < 0) {
        Py_ssize_t cap = self->cap ? self->cap * 2 : 8;
        Xfer *xs = PyMem_Realloc(self->xs, (size_t)cap * sizeof(Xfer));
        if (xs == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        self->xs = xs;
        Py_ssize_t *sharing = PyMem_Realloc(self->sharing, (size_t)cap * sizeof(Py_ssize_t));
        if (sharing == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        self->sharing = sharing;
        Py_ssize_t *delayed = PyMem_Realloc(self->delayed, (size_t)cap * sizeof(Py_ssize_t));
        if (delayed == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        self->delayed = delayed;
        for (Py_ssize_t s = cap - 1; s >= self->cap; s--) {
            xs[s].where = FREE;
            xs[s].done = NULL;
            xs[s].pos = self->free_head;
            self->free_head = s;
        }
        self->cap = cap;
    }
    Py_ssize_t slot = self->free_head;
    self->free_head = self->xs[slot].pos;
    return slot;
}

/* Frees the slot; hands back its callback (the caller owns it). */
static PyObject *release_slot(Channel *self, Py_ssize_t slot)
{
    Xfer *x = &self->xs[slot];
    PyObject *done = x->done;
    x->done = NULL;
    x->where = FREE;
    x->pos = self->free_head;
    self->free_head = slot;
    return done;
}

/* -- the link model (mocker.tiers.link.Link, expression for expression) ---------------------- */

/* The shared service moves to `now`; transfers whose bytes are through wait out their latency.
 * Time never goes back. */
static void progress(Channel *self, double now)
{
    if (now < self->time) {
        return;
    }
    Xfer *xs = self->xs;
    while (self->n_sharing) {
        Py_ssize_t slot = self->sharing[0];
        double gap = xs[slot].key - self->service;
        double finish = self->time + (gap > 0.0 ? gap : 0.0) * (double)self->n_sharing /
                                         self->bandwidth;
        if (finish > now) {
            break;
        }
        /* Bytes done: time and service move to this instant exactly (no drift). */
        self->time = finish;
        self->service = xs[slot].key;
        heap_remove(xs, self->sharing, &self->n_sharing, 0);
        xs[slot].key = finish + self->latency;
        xs[slot].where = DELAYED;
        heap_push(xs, self->delayed, &self->n_delayed, slot);
        self->fresh = 0; /* n changed: the others' finish times moved */
    }
    if (self->n_sharing) {
        self->service += (now - self->time) * self->bandwidth / (double)self->n_sharing;
    }
    else {
        /* Idle: the service count restarts (it never grows large enough to lose precision). */
        self->service = 0.0;
    }
    self->time = now;
}

/* When the next transfer finishes if nothing else starts; 0 when none does. */
static int compute_deadline(Channel *self, double *out)
{
    int found = 0;
    double best = 0.0;
    if (self->n_delayed) {
        best = self->xs[self->delayed[0]].key;
        found = 1;
    }
    if (self->n_sharing) {
        double gap = self->xs[self->sharing[0]].key - self->service;
        double finish = self->time + (gap > 0.0 ? gap : 0.0) * (double)self->n_sharing /
                                         self->bandwidth;
        finish = finish + self->latency;
        if (!found || finish < best) {
            best = finish;
        }
        found = 1;
    }
    *out = best;
    return found;
}

static int as_time(PyObject *obj, double *out)
{
    *out = PyFloat_AsDouble(obj);
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

/* -- the type ------------------------------------------------------------------------------- */

static PyObject *Channel_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"bandwidth", "latency", "src", "dst", NULL};
    double bandwidth, latency;
    PyObject *src, *dst;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "ddUU", kwlist, &bandwidth, &latency, &src,
                                     &dst)) {
        return NULL;
    }
    if (latency < 0) {
        PyObject *given = PyFloat_FromDouble(latency); /* (it may have come by keyword) */
        if (given != NULL) {
            PyErr_Format(PyExc_ValueError, "latency must be >= 0, got %R", given);
            Py_DECREF(given);
        }
        return NULL;
    }
    Channel *self = (Channel *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->bandwidth = bandwidth;
    self->latency = latency;
    self->fresh = 1;
    self->free_head = -1;
    Py_INCREF(src);
    self->src = src;
    Py_INCREF(dst);
    self->dst = dst;
    return (PyObject *)self;
}

static int Channel_traverse(Channel *self, visitproc visit, void *arg)
{
    for (Py_ssize_t s = 0; s < self->cap; s++) {
        Py_VISIT(self->xs[s].done);
    }
    return 0;
}

/* Drops every transfer (their callbacks hold the engine, which holds the channel: a cycle). */
static int Channel_clear(Channel *self)
{
    for (Py_ssize_t s = 0; s < self->cap; s++) {
        Py_CLEAR(self->xs[s].done);
    }
    return 0;
}

static void Channel_dealloc(Channel *self)
{
    PyObject_GC_UnTrack(self);
    Channel_clear(self);
    PyMem_Free(self->xs);
    PyMem_Free(self->sharing);
    PyMem_Free(self->delayed);
    Py_XDECREF(self->src);
    Py_XDECREF(self->dst);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t Channel_len(Channel *self)
{
    return self->n_sharing + self->n_delayed;
}

static PyObject *Channel_start(Channel *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "start(now, nbytes, done) takes 3 arguments");
        return NULL;
    }
    double now, nbytes;
    if (as_time(args[0], &now) < 0 || as_time(args[1], &nbytes) < 0) {
        return NULL;
    }
    Py_ssize_t slot = take_slot(self);
    if (slot < 0) {
        return NULL;
    }
    progress(self, now);
    self->fresh = 0;
    Xfer *x = &self->xs[slot];
    x->tid = self->next_id++;
    Py_INCREF(args[2]);
    x->done = args[2];
    if (self->bandwidth <= 0 || nbytes <= 0) {
        x->key = self->time + self->latency;
        x->where = DELAYED;
        heap_push(self->xs, self->delayed, &self->n_delayed, slot);
    }
    else {
        x->key = self->service + nbytes;
        x->where = SHARING;
        heap_push(self->xs, self->sharing, &self->n_sharing, slot);
    }
    return PyLong_FromLongLong(x->tid);
}

static PyObject *Channel_cancel(Channel *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "cancel(now, tid) takes 2 arguments");
        return NULL;
    }
    double now;
    if (as_time(args[0], &now) < 0) {
        return NULL;
    }
    long long tid = PyLong_AsLongLong(args[1]);
    if (tid == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t found = -1;
    for (Py_ssize_t s = 0; s < self->cap; s++) {
        if (self->xs[s].where != FREE && self->xs[s].tid == tid) {
            found = s;
            break;
        }
    }
    if (found < 0) {
        Py_RETURN_NONE; /* ended (or cancelled) already */
    }
    progress(self, now);
    self->fresh = 0;
    Xfer *x = &self->xs[found];
    if (x->where == SHARING) {
        heap_remove(self->xs, self->sharing, &self->n_sharing, x->pos);
    }
    else {
        heap_remove(self->xs, self->delayed, &self->n_delayed, x->pos);
    }
    Py_XDECREF(release_slot(self, found));
    Py_RETURN_NONE;
}

static PyObject *Channel_next_deadline(Channel *self, PyObject *Py_UNUSED(ignored))
{
    if (!(self->n_sharing + self->n_delayed)) {
        Py_RETURN_NONE;
    }
    if (!self->fresh) {
        compute_deadline(self, &self->deadline);
        self->fresh = 1;
    }
    return PyFloat_FromDouble(self->deadline);
}

typedef struct {
    double end;
    PyObject *done;
} Ended;

/* finish(now), `now` read: call back every transfer done by then; how many (NULL: raised). */
static PyObject *finish_at(Channel *self, double now)
{
    if (!(self->n_sharing + self->n_delayed)) {
        return PyLong_FromLong(0);
    }
    progress(self, now);
    Ended small[8];
    Ended *ended = small;
    Py_ssize_t n = 0, cap = 8;
    while (self->n_delayed && self->xs[self->delayed[0]].key <= now) {
        Py_ssize_t slot = self->delayed[0];
        if (n == cap) {
            Ended *grown = PyMem_Malloc((size_t)cap * 2 * sizeof(Ended));
            if (grown == NULL) {
                /* Nothing is lost: what was taken is called below, the rest stays. */
                break;
            }
            memcpy(grown, ended, (size_t)n * sizeof(Ended));
            if (ended != small) {
                PyMem_Free(ended);
            }
            ended = grown;
            cap *= 2;
        }
        double end = self->xs[slot].key;
        heap_remove(self->xs, self->delayed, &self->n_delayed, 0);
        ended[n].end = end;
        ended[n].done = release_slot(self, slot);
        n++;
    }
    if (n) {
        self->fresh = 0;
    }
    /* The callbacks run once the link is at `now` (each may start or cancel transfers). */
    Py_ssize_t i = 0;
    for (; i < n; i++) {
        if (ended[i].done == NULL) {
            continue; /* (dropped by the collector's clear) */
        }
        PyObject *end = PyFloat_FromDouble(ended[i].end);
        PyObject *res = end == NULL ? NULL : PyObject_CallOneArg(ended[i].done, end);
        Py_XDECREF(end);
        Py_DECREF(ended[i].done);
        if (res == NULL) {
            break;
        }
        Py_DECREF(res);
    }
    if (i < n) {
        for (Py_ssize_t j = i + 1; j < n; j++) {
            Py_XDECREF(ended[j].done);
        }
    }
    if (ended != small) {
        PyMem_Free(ended);
    }
    return i < n ? NULL : PyLong_FromSsize_t(n);
}

static PyObject *Channel_finish(Channel *self, PyObject *arg)
{
    double now;
    if (as_time(arg, &now) < 0) {
        return NULL;
    }
    return finish_at(self, now);
}

static PyObject *Channel_duration(Channel *self, PyObject *arg)
{
    double nbytes;
    if (as_time(arg, &nbytes) < 0) {
        return NULL;
    }
    return PyFloat_FromDouble((self->bandwidth <= 0 ? 0.0 : nbytes / self->bandwidth) +
                              self->latency);
}

static PyObject *Channel_get_key(Channel *self, void *Py_UNUSED(closure))
{
    return PyTuple_Pack(2, self->src, self->dst);
}

static PyObject *Channel_get_instant(Channel *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->bandwidth <= 0);
}

static PyTypeObject ChannelType;

/* The earliest next deadline of a list of channels and its channel (a new reference; None
 * when all are idle), the first of equals. Compiled channels are read directly, others asked.
 * -1: raised. */
static int find_earliest(PyObject *arg, double *out, PyObject **out_which)
{
    double best = Py_HUGE_VAL;
    PyObject *which = Py_NewRef(Py_None); /* owned: another channel's call may drop it */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(arg); i++) {
        PyObject *ch = Py_NewRef(PyList_GET_ITEM(arg, i));
        double d;
        if (Py_IS_TYPE(ch, &ChannelType)) {
            Channel *c = (Channel *)ch;
            if (!(c->n_sharing + c->n_delayed)) {
                Py_DECREF(ch);
                continue;
            }
            if (!c->fresh) {
                compute_deadline(c, &c->deadline);
                c->fresh = 1;
            }
            d = c->deadline;
        }
        else {
            PyObject *res = PyObject_CallMethod(ch, "next_deadline", NULL);
            if (res == NULL) {
                Py_DECREF(ch);
                Py_DECREF(which);
                return -1;
            }
            if (res == Py_None) {
                Py_DECREF(res);
                Py_DECREF(ch);
                continue;
            }
            d = PyFloat_AsDouble(res);
            Py_DECREF(res);
            if (d == -1.0 && PyErr_Occurred()) {
                Py_DECREF(ch);
                Py_DECREF(which);
                return -1;
            }
        }
        if (d < best) {
            best = d;
            Py_SETREF(which, ch);
        }
        else {
            Py_DECREF(ch);
        }
    }
    *out = best;
    *out_which = which;
    return 0;
}

/* earliest(channels): (the earliest next deadline, its channel), the first of equals; (inf,
 * None) when every channel is idle. */
static PyObject *earliest(PyObject *Py_UNUSED(module), PyObject *arg)
{
    if (!PyList_CheckExact(arg)) {
        PyErr_SetString(PyExc_TypeError, "earliest() takes a list of channels");
        return NULL;
    }
    double best;
    PyObject *which;
    if (find_earliest(arg, &best, &which) < 0) {
        return NULL;
    }
    PyObject *t = PyFloat_FromDouble(best);
    PyObject *out = t == NULL ? NULL : PyTuple_Pack(2, t, which);
    Py_XDECREF(t);
    Py_DECREF(which);
    return out;
}

/* finish_due(channels, bound): `finish` the earliest channel at its deadline while that is
 * no later than `bound`, asking again after each (a callback may start transfers on any of
 * them): every transfer that ends by `bound` is called back, in time order, the first
 * channel of equals first. Returns the channels' next deadline then (inf: all idle). */
static PyObject *finish_due(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "finish_due(channels, bound) takes a list of channels");
        return NULL;
    }
    double bound;
    if (as_time(args[1], &bound) < 0) {
        return NULL;
    }
    PyObject *channels = Py_NewRef(args[0]); /* (held: a callback may drop the caller's) */
    double t;
    for (;;) {
        PyObject *which;
        if (find_earliest(channels, &t, &which) < 0) {
            Py_DECREF(channels);
            return NULL;
        }
        if (which == Py_None || !(t <= bound)) {
            Py_DECREF(which);
            break;
        }
        PyObject *res;
        if (Py_IS_TYPE(which, &ChannelType)) {
            res = finish_at((Channel *)which, t);
        }
        else {
            PyObject *at = PyFloat_FromDouble(t);
            res = at == NULL ? NULL : PyObject_CallMethod(which, "finish", "O", at);
            Py_XDECREF(at);
        }
        Py_DECREF(which);
        if (res == NULL) {
            Py_DECREF(channels);
            return NULL;
        }
        Py_DECREF(res);
    }
    Py_DECREF(channels);
    return PyFloat_FromDouble(t);
}

static PyMethodDef module_methods[] = {
    {"earliest", (PyCFunction)earliest, METH_O,
     "earliest(channels): (the earliest next deadline, its channel); (inf, None) if idle."},
    {"finish_due", (PyCFunction)(void (*)(void))finish_due, METH_FASTCALL,
     "finish_due(channels, bound): every transfer that ends by `bound` called back, in time "
     "order; the channels' next deadline then (inf: idle)."},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef Channel_methods[] = {
    {"start", (PyCFunction)(void (*)(void))Channel_start, METH_FASTCALL,
     "start(now, nbytes, done): a transfer from `now`; `done(end)` is called when it ends."},
    {"cancel", (PyCFunction)(void (*)(void))Channel_cancel, METH_FASTCALL,
     "cancel(now, tid): stop a transfer at `now` (its callback is never called)."},
    {"next_deadline", (PyCFunction)Channel_next_deadline, METH_NOARGS,
     "When the next transfer ends if nothing else starts (None: idle)."},
    {"finish", (PyCFunction)Channel_finish, METH_O,
     "finish(now): call back, in finish order, every transfer done by `now`; how many."},
    {"duration", (PyCFunction)Channel_duration, METH_O,
     "duration(nbytes): seconds one transfer takes on the idle link."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Channel_members[] = {
    {"src", T_OBJECT_EX, offsetof(Channel, src), READONLY, "The source tier's name."},
    {"dst", T_OBJECT_EX, offsetof(Channel, dst), READONLY, "The destination tier's name."},
    {"bandwidth", T_DOUBLE, offsetof(Channel, bandwidth), READONLY, "Bytes per second."},
    {"latency", T_DOUBLE, offsetof(Channel, latency), READONLY, "Seconds per transfer."},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef Channel_getset[] = {
    {"key", (getter)Channel_get_key, NULL, "(source tier, destination tier).", NULL},
    {"instant", (getter)Channel_get_instant, NULL, "Bandwidth <= 0: no transfer time.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods Channel_as_sequence = {
    .sq_length = (lenfunc)Channel_len,
};

static PyTypeObject ChannelType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mocker.tiers._clink.Channel",
    .tp_doc = PyDoc_STR("Channel(bandwidth, latency, src, dst): a link with processor "
                        "sharing from tier src to tier dst, and each transfer's callback."),
    .tp_basicsize = sizeof(Channel),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = Channel_new,
    .tp_dealloc = (destructor)Channel_dealloc,
    .tp_traverse = (traverseproc)Channel_traverse,
    .tp_clear = (inquiry)Channel_clear,
    .tp_as_sequence = &Channel_as_sequence,
    .tp_methods = Channel_methods,
    .tp_members = Channel_members,
    .tp_getset = Channel_getset,
};

static struct PyModuleDef clink_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "mocker.tiers._clink",
    .m_doc = "A channel between tiers in C (mocker.tiers.channel is the reference).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__clink(void)
{
    if (PyType_Ready(&ChannelType) < 0) {
        return NULL;
    }
    PyObject *mod = PyModule_Create(&clink_module);
    if (mod == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(mod, "Channel", (PyObject *)&ChannelType) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
