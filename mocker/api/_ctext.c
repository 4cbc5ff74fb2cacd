/* Token chunks framed for a chunked HTTP body, their text copied from one compact table:
 * mocker.api.text_table's `TextTable` (the Python reference, which serves when this was not
 * built or MOCKER_COMPILED=0; tests/api/test_text_table.py compares the two).
 *
 * Why: in Python a streamed token's text comes from a dict of token ids -> escaped bytes,
 * megabytes of dict, int keys and bytes objects for a real vocabulary. Tokens are drawn at
 * random, so nearly every lookup misses the caches, and the chunk is then joined from its
 * pieces by four concatenations. Here the texts sit in one buffer behind one uint32 per token
 * id, and the framed chunk (`<hex length>\r\n<head><text><tail>\r\n`, as uvicorn frames a
 * body chunk) is one allocation.
 * Kept for: bench/compiled_parts.py's `stream` figure (what it buys: bench/README.md).
 */
#include "../_cfields.h"
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MAX_TEXT 255               /* a slot's 8 length bits */
#define MAX_BLOB ((1u << 24) - 1) /* its 24 offset bits */
#define MAX_IDS (1 << 24)         /* token ids the table indexes (vocabularies are < 1M) */

typedef struct {
    PyObject_HEAD
    uint32_t *slots;     /* by token id: offset << 8 | length; 0: not in the table */
    Py_ssize_t num_ids;  /* slots' length: the largest id + 1 */
    Py_ssize_t num_texts;
    char *blob;          /* the texts, from offset 1 (so that no present slot is 0) */
} TextTable;

static void table_dealloc(TextTable *self)
{
    PyMem_Free(self->slots);
    PyMem_Free(self->blob);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* TextTable(pieces): pieces maps token ids (ints) to their texts (bytes). Entries the table
 * cannot hold (an id < 0 or >= 2**24, a text over 255 bytes) are left out: `framed` answers
 * None for them, as for any id it was not given. */
static PyObject *table_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"pieces", NULL};
    PyObject *pieces;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!:TextTable", kwlist, &PyDict_Type, &pieces))
        return NULL;
    Py_ssize_t pos = 0, max_id = -1, total = 1;
    PyObject *key, *value;
    while (PyDict_Next(pieces, &pos, &key, &value)) {
        if (!PyLong_Check(key) || !PyBytes_Check(value)) {
            PyErr_SetString(PyExc_TypeError, "TextTable: pieces must map ints to bytes");
            return NULL;
        }
        Py_ssize_t id = PyLong_AsSsize_t(key);
        if (id == -1 && PyErr_Occurred()) {
            PyErr_Clear(); /* beyond any index: left out */
            continue;
        }
        if (id < 0 || id >= MAX_IDS || PyBytes_GET_SIZE(value) > MAX_TEXT)
            continue;
        if (id > max_id)
            max_id = id;
        total += PyBytes_GET_SIZE(value);
    }
    if ((size_t)total > MAX_BLOB) {
        PyErr_SetString(PyExc_ValueError, "TextTable: the texts exceed 16 MB");
        return NULL;
    }
    TextTable *self = (TextTable *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->num_ids = max_id + 1;
    self->slots = PyMem_Calloc(self->num_ids ? self->num_ids : 1, sizeof(uint32_t));
    self->blob = PyMem_Malloc(total);
    if (self->slots == NULL || self->blob == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    Py_ssize_t at = 1;
    pos = 0;
    while (PyDict_Next(pieces, &pos, &key, &value)) {
        Py_ssize_t id = PyLong_AsSsize_t(key);
        if (id == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            continue;
        }
        Py_ssize_t n = PyBytes_GET_SIZE(value);
        if (id < 0 || id >= MAX_IDS || n > MAX_TEXT)
            continue;
        memcpy(self->blob + at, PyBytes_AS_STRING(value), n);
        self->slots[id] = (uint32_t)at << 8 | (uint32_t)n;
        self->num_texts++;
        at += n;
    }
    return (PyObject *)self;
}

/* The chunk `head + text + tail` framed; Py_None (a new reference) when the id is not in the
 * table. */
static PyObject *frame(TextTable *self, Py_ssize_t id, PyObject *head, PyObject *tail)
{
    if (id < 0 || id >= self->num_ids)
        Py_RETURN_NONE;
    uint32_t slot = self->slots[id];
    if (slot == 0)
        Py_RETURN_NONE;
    Py_ssize_t text_len = slot & 0xff;
    const char *text = self->blob + (slot >> 8);
    Py_ssize_t head_len = PyBytes_GET_SIZE(head), tail_len = PyBytes_GET_SIZE(tail);
    Py_ssize_t n = head_len + text_len + tail_len;
    char hex[2 * sizeof(Py_ssize_t)];
    int digits = 0;
    for (Py_ssize_t v = n; digits == 0 || v; v >>= 4)
        hex[digits++] = "0123456789abcdef"[v & 0xf];
    PyObject *out = PyBytes_FromStringAndSize(NULL, digits + 2 + n + 2);
    if (out == NULL)
        return NULL;
    char *p = PyBytes_AS_STRING(out);
    while (digits)
        *p++ = hex[--digits];
    *p++ = '\r';
    *p++ = '\n';
    memcpy(p, PyBytes_AS_STRING(head), head_len);
    p += head_len;
    memcpy(p, text, text_len);
    p += text_len;
    memcpy(p, PyBytes_AS_STRING(tail), tail_len);
    p += tail_len;
    *p++ = '\r';
    *p = '\n';
    return out;
}

/* framed(token_id, head, tail) -> bytes | None */
static PyObject *table_framed(TextTable *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "framed() takes token_id, head and tail");
        return NULL;
    }
    PyObject *head = args[1], *tail = args[2];
    if (!PyLong_Check(args[0]) || !PyBytes_Check(head) || !PyBytes_Check(tail)) {
        PyErr_SetString(PyExc_TypeError, "framed() takes an int and two bytes");
        return NULL;
    }
    Py_ssize_t id = PyLong_AsSsize_t(args[0]);
    if (id == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return frame(self, id, head, tail);
}

/* text(token_id) -> bytes | None */
static PyObject *table_text(TextTable *self, PyObject *token_id)
{
    if (!PyLong_Check(token_id)) {
        PyErr_SetString(PyExc_TypeError, "text() takes an int");
        return NULL;
    }
    Py_ssize_t id = PyLong_AsSsize_t(token_id);
    if (id == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (id < 0 || id >= self->num_ids || self->slots[id] == 0)
        Py_RETURN_NONE;
    uint32_t slot = self->slots[id];
    return PyBytes_FromStringAndSize(self->blob + (slot >> 8), slot & 0xff);
}

static Py_ssize_t table_len(TextTable *self)
{
    return self->num_texts;
}

static PyMethodDef table_methods[] = {
    {"framed", (PyCFunction)(void (*)(void))table_framed, METH_FASTCALL,
     "The chunk head + text + tail framed as a chunked body's chunk; None: not in the table."},
    {"text", (PyCFunction)table_text, METH_O, "A token's text; None: not in the table."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods table_as_sequence = {
    .sq_length = (lenfunc)table_len,
};

static PyTypeObject TextTableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mocker.api._ctext.TextTable",
    .tp_doc = "Token texts in one buffer, for framed streaming chunks.",
    .tp_basicsize = sizeof(TextTable),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = table_new,
    .tp_dealloc = (destructor)table_dealloc,
    .tp_methods = table_methods,
    .tp_as_sequence = &table_as_sequence,
};

/* Sink(table, head, tail, emitter, direct, cycle, choice): a streamed response's plain tokens
 * written from the engine loop's hand-out (mocker.engine.stream's `deliver`) without a Python
 * frame. `sink(token_id)` does what StreamRenderer.on_output does for a one-token output
 * that ends nothing once the choice's first chunk is out: while `emitter.writer` is still
 * `direct` and `direct`'s checks pass (the cycle not disconnected, its flow not paused, the
 * response not complete), the token's chunk framed from the table is written to the cycle's
 * transport and `choice.completion_tokens` counts it: True. False, having done nothing,
 * when any of that does not hold (a token not in the table, a pause, a write that raises):
 * the renderer's Python path then takes the output, as it takes every other one. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    TextTable *table;
    PyObject *head, *tail, *emitter, *direct, *cycle, *flow, *write, *choice;
    Field writer, count; /* emitter.writer, choice.completion_tokens (descr NULL: looked up) */
} Sink;

static PyObject *s_writer, *s_disconnected, *s_write_paused, *s_response_complete,
    *s_completion_tokens, *s_flow, *s_transport, *s_write;

static int sink_traverse(Sink *self, visitproc visit, void *arg)
{
    Py_VISIT(self->table);
    Py_VISIT(self->head);
    Py_VISIT(self->tail);
    Py_VISIT(self->emitter);
    Py_VISIT(self->direct);
    Py_VISIT(self->cycle);
    Py_VISIT(self->flow);
    Py_VISIT(self->write);
    Py_VISIT(self->choice);
    Py_VISIT(self->writer.descr);
    Py_VISIT(self->count.descr);
    return 0;
}

static int sink_clear(Sink *self)
{
    Py_CLEAR(self->table);
    Py_CLEAR(self->head);
    Py_CLEAR(self->tail);
    Py_CLEAR(self->emitter);
    Py_CLEAR(self->direct);
    Py_CLEAR(self->cycle);
    Py_CLEAR(self->flow);
    Py_CLEAR(self->write);
    Py_CLEAR(self->choice);
    Py_CLEAR(self->writer.descr);
    Py_CLEAR(self->count.descr);
    return 0;
}

static void sink_dealloc(Sink *self)
{
    PyObject_GC_UnTrack(self);
    sink_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* An attribute's truth; 1 (as "not ours to write") when it cannot be read. */
static int flag(PyObject *obj, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) {
        PyErr_Clear();
        return 1;
    }
    int truth = PyObject_IsTrue(v);
    Py_DECREF(v);
    if (truth < 0) {
        PyErr_Clear();
        return 1;
    }
    return truth;
}

static PyObject *sink_push(Sink *self, PyObject *tok)
{
    if (!PyLong_Check(tok))
        Py_RETURN_FALSE;
    /* emitter.writer compared by identity */
    PyObject *writer = self->writer.descr != NULL ? field_get(&self->writer, self->emitter)
                                                  : PyObject_GetAttr(self->emitter, s_writer);
    if (writer == NULL) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    Py_DECREF(writer); /* (only its identity is compared: the emitter holds it) */
    if (writer != self->direct)
        Py_RETURN_FALSE;
    if (flag(self->cycle, s_disconnected) || flag(self->flow, s_write_paused) ||
        flag(self->cycle, s_response_complete))
        Py_RETURN_FALSE;
    Py_ssize_t id = PyLong_AsSsize_t(tok);
    if (id == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    PyObject *chunk = frame(self->table, id, self->head, self->tail);
    if (chunk == NULL)
        return NULL;
    if (chunk == Py_None) {
        Py_DECREF(chunk);
        Py_RETURN_FALSE; /* (not in the table: the Python path escapes it) */
    }
    /* The count is made before the write: nothing after the write may fail but the store. */
    PyObject *count = self->count.descr != NULL
                          ? field_get(&self->count, self->choice)
                          : PyObject_GetAttr(self->choice, s_completion_tokens);
    PyObject *one = count == NULL ? NULL : PyLong_FromLong(1);
    PyObject *counted = one == NULL ? NULL : PyNumber_Add(count, one);
    Py_XDECREF(count);
    Py_XDECREF(one);
    if (counted == NULL) {
        Py_DECREF(chunk);
        return NULL;
    }
    PyObject *written = PyObject_Vectorcall(self->write, &chunk, 1, NULL);
    Py_DECREF(chunk);
    if (written == NULL) {
        /* (the transport closed under us: the Python path writes again, and fails the
         * emitter when that raises too) */
        PyErr_Clear();
        Py_DECREF(counted);
        Py_RETURN_FALSE;
    }
    Py_DECREF(written);
    int set = self->count.descr != NULL
                  ? field_set(&self->count, self->choice, counted)
                  : PyObject_SetAttr(self->choice, s_completion_tokens, counted);
    Py_DECREF(counted);
    if (set < 0)
        return NULL;
    Py_RETURN_TRUE;
}

static PyObject *sink_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                                 PyObject *kwnames)
{
    if (PyVectorcall_NARGS(nargsf) != 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "a sink takes one token id");
        return NULL;
    }
    return sink_push((Sink *)callable, args[0]);
}

static PyObject *sink_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"table", "head", "tail", "emitter", "direct", "cycle", "choice",
                             NULL};
    PyObject *table, *head, *tail, *emitter, *direct, *cycle, *choice;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!O!OOOO:Sink", kwlist, &TextTableType,
                                     &table, &PyBytes_Type, &head, &PyBytes_Type, &tail,
                                     &emitter, &direct, &cycle, &choice))
        return NULL;
    PyObject *flow = PyObject_GetAttr(cycle, s_flow);
    PyObject *transport = flow == NULL ? NULL : PyObject_GetAttr(cycle, s_transport);
    PyObject *write = transport == NULL ? NULL : PyObject_GetAttr(transport, s_write);
    Py_XDECREF(transport);
    if (write == NULL) {
        Py_XDECREF(flow);
        return NULL;
    }
    Sink *self = (Sink *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(flow);
        Py_DECREF(write);
        return NULL;
    }
    self->vectorcall = sink_vectorcall;
    self->table = (TextTable *)Py_NewRef(table);
    self->head = Py_NewRef(head);
    self->tail = Py_NewRef(tail);
    self->emitter = Py_NewRef(emitter);
    self->direct = Py_NewRef(direct);
    self->cycle = Py_NewRef(cycle);
    self->flow = flow;
    self->write = write;
    self->choice = Py_NewRef(choice);
    if (field_find(&self->writer, Py_TYPE(emitter), "writer", 0) < 0 ||
        field_find(&self->count, Py_TYPE(choice), "completion_tokens", 1) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static PyTypeObject SinkType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mocker.api._ctext.Sink",
    .tp_doc = "A streamed response's plain tokens written from the engine loop's hand-out.",
    .tp_basicsize = sizeof(Sink),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = sink_new,
    .tp_dealloc = (destructor)sink_dealloc,
    .tp_traverse = (traverseproc)sink_traverse,
    .tp_clear = (inquiry)sink_clear,
    .tp_vectorcall_offset = offsetof(Sink, vectorcall),
    .tp_call = PyVectorcall_Call,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "mocker.api._ctext",
    "Framed streaming chunks from a compact token-text table (mocker.api.text_table is the "
    "reference).",
    -1, NULL,
};

PyMODINIT_FUNC PyInit__ctext(void)
{
    if (PyType_Ready(&TextTableType) < 0 || PyType_Ready(&SinkType) < 0)
        return NULL;
    struct {
        PyObject **at;
        const char *name;
    } names[] = {
        {&s_writer, "writer"}, {&s_disconnected, "disconnected"},
        {&s_write_paused, "write_paused"}, {&s_response_complete, "response_complete"},
        {&s_completion_tokens, "completion_tokens"}, {&s_flow, "flow"},
        {&s_transport, "transport"}, {&s_write, "write"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        *names[i].at = PyUnicode_InternFromString(names[i].name);
        if (*names[i].at == NULL)
            return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "TextTable", (PyObject *)&TextTableType) < 0 ||
        PyModule_AddObjectRef(m, "Sink", (PyObject *)&SinkType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
