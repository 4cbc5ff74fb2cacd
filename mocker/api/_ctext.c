/* Token chunks framed for a chunked HTTP body, their text copied from one compact table:
 * mocker.api.text_table's `TextTable` (the Python reference, which serves when this was not
 * built or MOCKER_KV_POOL=python; tests/api/test_text_table.py compares the two).
 *
 * Why: a streamed token's text came from a dict of ~26k token ids -> escaped bytes, ~2.5 MB of
 * dict, int keys and bytes objects for the default tokenizer. Tokens are drawn at random, so
 * nearly every lookup missed the caches (5% of a 500-stream server's CPU in `_Py_dict_lookup`,
 * the same in the eval loop when the dict was a list), and the chunk was then joined from
 * its pieces by four concatenations. Here the texts sit in one buffer (~0.2 MB) behind one
 * uint32 per token id, and the framed chunk (`<hex length>\r\n<head><text><tail>\r\n`, as
 * uvicorn frames a body chunk) is one allocation.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
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

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "mocker.api._ctext",
    "Framed streaming chunks from a compact token-text table (mocker.api.text_table is the "
    "reference).",
    -1, NULL,
};

PyMODINIT_FUNC PyInit__ctext(void)
{
    if (PyType_Ready(&TextTableType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&TextTableType);
    if (PyModule_AddObject(m, "TextTable", (PyObject *)&TextTableType) < 0) {
        Py_DECREF(&TextTableType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
