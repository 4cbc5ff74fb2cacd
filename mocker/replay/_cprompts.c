/* Replay prompts' mixing in C: mocker.replay.prompts.PromptBuilder's block hashes and tail
 * token ids, the same values as its Python code (the reference, which serves when this was
 * not built or MOCKER_COMPILED=0; tests/replay/test_prompts.py compares the two).
 *
 * Why it exists: the Python code mixes 64-bit values with big-int arithmetic, a dozen
 * objects per trace block of every prompt (the id chain), plus numpy calls whose overhead
 * outweighs their work on a prompt's few dozen trace blocks. Here it is a loop over machine
 * words.
 * Kept for: bench/compiled_parts.py's `replay` figure (what it buys: bench/README.md).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "../_cmixing.h"

/* block_hashes(ids, seed, per, num_full) -> bytes: the first num_full engine blocks'
 * hashes, native uint64 words. The prefix key of trace block t chains the ids:
 * key(t) = splitmix64(key(t - 1) ^ (ids[t] mod 2**64)), key(-1) = seed; engine block j,
 * the (j mod per)-th of trace block j / per, hashes as splitmix64(key ^ (j mod per) * GOLDEN). */
static PyObject *block_hashes(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "block_hashes(ids, seed, per, num_full)");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "ids must be a sequence of ints");
    if (seq == NULL)
        return NULL;
    uint64_t key = PyLong_AsUnsignedLongLongMask(args[1]);
    Py_ssize_t per = PyLong_AsSsize_t(args[2]);
    Py_ssize_t num_full = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred()) {
        Py_DECREF(seq);
        return NULL;
    }
    Py_ssize_t num_ids = PySequence_Fast_GET_SIZE(seq);
    if (per < 1 || num_full < 0 || num_full > num_ids * per) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError,
                     "%zd blocks of %zd per id need more than %zd ids (or per < 1)", num_full,
                     per, num_ids);
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, num_full * (Py_ssize_t)sizeof(uint64_t));
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    uint64_t *words = (uint64_t *)PyBytes_AS_STRING(out);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t j = 0; j < num_full; j++) {
        Py_ssize_t within = j % per;
        if (within == 0) {
            uint64_t id = PyLong_AsUnsignedLongLongMask(items[j / per]);
            if (id == (uint64_t)-1 && PyErr_Occurred()) {
                Py_DECREF(out);
                Py_DECREF(seq);
                return NULL;
            }
            key = splitmix64(key ^ id);
        }
        words[j] = splitmix64(key ^ ((uint64_t)within * GOLDEN));
    }
    Py_DECREF(seq);
    return out;
}

/* tail_tokens(base, start, count, low, span) -> bytes: native uint32 ids of positions
 * start .. start + count - 1 of a trace block whose id mixes to `base`:
 * low + splitmix64(base ^ position * GOLDEN) mod span. */
static PyObject *tail_tokens(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "tail_tokens(base, start, count, low, span)");
        return NULL;
    }
    uint64_t base = PyLong_AsUnsignedLongLongMask(args[0]);
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    Py_ssize_t count = PyLong_AsSsize_t(args[2]);
    long long low = PyLong_AsLongLong(args[3]);
    long long span = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    if (start < 0 || count < 0 || span < 1 || low < 0 || low + span > ((long long)1 << 32)) {
        PyErr_SetString(PyExc_ValueError, "tail_tokens: ids must fit in 32 bits");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, count * (Py_ssize_t)sizeof(uint32_t));
    if (out == NULL)
        return NULL;
    uint32_t *ids = (uint32_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t k = 0; k < count; k++) {
        uint64_t x = splitmix64(base ^ ((uint64_t)(start + k) * GOLDEN));
        ids[k] = (uint32_t)(low + (long long)(x % (uint64_t)span));
    }
    return out;
}

static PyMethodDef methods[] = {
    {"block_hashes", (PyCFunction)(void (*)(void))block_hashes, METH_FASTCALL,
     "A prompt's engine block hashes from its trace ids (native uint64 words)."},
    {"tail_tokens", (PyCFunction)(void (*)(void))tail_tokens, METH_FASTCALL,
     "A prompt's last partial block's token ids (native uint32 words)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "mocker.replay._cprompts",
    "Replay prompts' mixing in C (mocker.replay.prompts is the reference).", -1, methods,
};

PyMODINIT_FUNC PyInit__cprompts(void)
{
    return PyModule_Create(&module);
}
