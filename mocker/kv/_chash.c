/* mocker's fast block-hash chain in C: mocker.kv.hashing.BlockHasher's hashes, the same values
 * as its Python code (the reference, which serves when this was not built or
 * MOCKER_COMPILED=0; tests/kv/test_hashing.py compares the two and this XXH3 against the
 * xxhash package).
 *
 * A block's hash is XXH3-64 (seeded) of: its parent's hash (8 bytes, big-endian), the body's
 * length (4 bytes, big-endian), its token ids (4 bytes each, little-endian) and the extra
 * keys. With 16-token blocks that is 76 bytes: XXH3's medium-input path (17-240 bytes), written
 * here from the algorithm's specification (doc/xxhash_spec.md of the xxHash project). Why:
 * in Python each generated block costs a dozen objects and calls around one xxh3 call. Other
 * lengths are left to the Python code.
 * Kept for: bench/compiled_parts.py's `replay` figure (what it buys: bench/README.md).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define PRIME64_1 0x9E3779B185EBCA87ull
#define PRIME_MX1 0x165667919E3779F9ull
#define MEDIUM_MAX 240 /* the medium path's bound */

/* XXH3's default secret (the specification's 192 bytes; the medium path reads 136). */
static const uint8_t SECRET[192] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

static inline uint64_t read_le64(const uint8_t *p)
{
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--)
        x = (x << 8) | p[i];
    return x;
}

static inline uint64_t avalanche(uint64_t x)
{
    x ^= x >> 37;
    x *= PRIME_MX1;
    return x ^ (x >> 32);
}

/* 16 bytes of input against 16 of the secret: the 128-bit product, folded. */
static inline uint64_t mix_step(const uint8_t *in, size_t secret_at, uint64_t seed)
{
    uint64_t lo = read_le64(in) ^ (read_le64(SECRET + secret_at) + seed);
    uint64_t hi = read_le64(in + 8) ^ (read_le64(SECRET + secret_at + 8) - seed);
#if defined(__SIZEOF_INT128__)
    unsigned __int128 product = (unsigned __int128)lo * hi;
    return (uint64_t)product ^ (uint64_t)(product >> 64);
#else
    uint64_t a = lo & 0xFFFFFFFFu, b = lo >> 32, c = hi & 0xFFFFFFFFu, d = hi >> 32;
    uint64_t ac = a * c, ad = a * d, bc = b * c, bd = b * d;
    uint64_t mid = (ac >> 32) + (ad & 0xFFFFFFFFu) + (bc & 0xFFFFFFFFu);
    uint64_t low = (mid << 32) | (ac & 0xFFFFFFFFu);
    uint64_t high = bd + (ad >> 32) + (bc >> 32) + (mid >> 32);
    return low ^ high;
#endif
}

/* XXH3-64 of 17 to 240 bytes, seeded. */
static uint64_t xxh3_medium(const uint8_t *in, size_t len, uint64_t seed)
{
    uint64_t acc = (uint64_t)len * PRIME64_1;
    if (len <= 128) {
        for (Py_ssize_t i = (Py_ssize_t)((len - 1) >> 5); i >= 0; i--) {
            acc += mix_step(in + i * 16, (size_t)i * 32, seed);
            acc += mix_step(in + len - (size_t)i * 16 - 16, (size_t)i * 32 + 16, seed);
        }
        return avalanche(acc);
    }
    size_t chunks = len >> 4;
    for (size_t i = 0; i < 8; i++)
        acc += mix_step(in + i * 16, i * 16, seed);
    acc = avalanche(acc);
    for (size_t i = 8; i < chunks; i++)
        acc += mix_step(in + i * 16, (i - 8) * 16 + 3, seed);
    acc += mix_step(in + len - 16, 119, seed);
    return avalanche(acc);
}

/* xxh3_64(data, seed): the medium path alone (tests compare it with the xxhash package). */
static PyObject *xxh3_64(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "xxh3_64(data, seed)");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE))
        return NULL;
    uint64_t seed = PyLong_AsUnsignedLongLongMask(args[1]);
    if (PyErr_Occurred() || view.len < 17 || view.len > MEDIUM_MAX) {
        PyBuffer_Release(&view);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "xxh3_64 takes 17 to 240 bytes");
        return NULL;
    }
    uint64_t h = xxh3_medium(view.buf, (size_t)view.len, seed);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong(h);
}

static inline void put_be(uint8_t *at, uint64_t x, int bytes)
{
    for (int i = bytes - 1; i >= 0; i--, x >>= 8)
        at[i] = (uint8_t)x;
}

/* chain(parent, token_ids, start, end, block_size, seed, extra, first) -> bytes | None: the
 * hashes of blocks start .. end - 1 (native uint64 words), block i hashing
 * token_ids[i * block_size : (i + 1) * block_size] after block i - 1 (`parent` for the first),
 * with `first` as the extra keys of block 0 when given, else `extra`. token_ids: an
 * array('I') (read in place) or a list of ints. None when a block's input is outside the
 * medium path (the caller hashes those itself). */
static PyObject *chain(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError,
                        "chain(parent, token_ids, start, end, block_size, seed, extra, first)");
        return NULL;
    }
    uint64_t parent = PyLong_AsUnsignedLongLongMask(args[0]);
    Py_ssize_t start = PyLong_AsSsize_t(args[2]);
    Py_ssize_t end = PyLong_AsSsize_t(args[3]);
    Py_ssize_t bs = PyLong_AsSsize_t(args[4]);
    uint64_t seed = PyLong_AsUnsignedLongLongMask(args[5]);
    if (PyErr_Occurred())
        return NULL;
    if (!PyBytes_Check(args[6]) || !PyBytes_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError, "chain: the extra keys are bytes");
        return NULL;
    }
    const char *extra = PyBytes_AS_STRING(args[6]), *first = PyBytes_AS_STRING(args[7]);
    Py_ssize_t n_extra = PyBytes_GET_SIZE(args[6]), n_first = PyBytes_GET_SIZE(args[7]);
    Py_ssize_t body = 4 * bs, head = 12 + body;
    /* (The inputs' lengths: head + extra keys, or head + first keys for block 0.) */
    Py_ssize_t shortest = head + n_extra, longest = head + n_extra;
    if (n_first && head + n_first < shortest)
        shortest = head + n_first;
    if (n_first && head + n_first > longest)
        longest = head + n_first;
    if (bs < 1 || start < 0 || end < start || shortest < 17 || longest > MEDIUM_MAX)
        Py_RETURN_NONE;
    /* The ids: a buffer of native uint32 (array('I')), or a list of ints. */
    Py_buffer view;
    int viewed = 0;
    PyObject *seq = NULL;
    const uint32_t *ids = NULL;
    PyObject **items = NULL;
    Py_ssize_t n_ids;
    if (PyObject_CheckBuffer(args[1]) &&
        PyObject_GetBuffer(args[1], &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) == 0) {
        viewed = 1;
        const char *f = view.format;
        if (f != NULL && (*f == '@' || *f == '='))
            f++;
        if (view.ndim != 1 || view.itemsize != 4 || f == NULL || f[0] != 'I' || f[1] != '\0') {
            PyBuffer_Release(&view);
            Py_RETURN_NONE; /* (another vector: the Python code reads it) */
        }
        ids = view.buf;
        n_ids = view.len / 4;
    } else {
        PyErr_Clear();
        seq = PySequence_Fast(args[1], "token_ids must be a sequence of ints");
        if (seq == NULL)
            return NULL;
        items = PySequence_Fast_ITEMS(seq);
        n_ids = PySequence_Fast_GET_SIZE(seq);
    }
    PyObject *out = NULL;
    if (end * bs > n_ids) {
        PyErr_SetString(PyExc_IndexError, "chain: fewer token ids than blocks");
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, (end - start) * (Py_ssize_t)sizeof(uint64_t));
    if (out == NULL)
        goto done;
    uint64_t *words = (uint64_t *)PyBytes_AS_STRING(out);
    uint8_t buf[MEDIUM_MAX];
    put_be(buf + 8, (uint64_t)body, 4);
    for (Py_ssize_t i = start; i < end; i++) {
        put_be(buf, parent, 8);
        uint8_t *at = buf + 12;
        for (Py_ssize_t k = i * bs; k < (i + 1) * bs; k++, at += 4) {
            uint32_t id;
            if (ids != NULL) {
                id = ids[k];
            } else {
                unsigned long v = PyLong_AsUnsignedLong(items[k]);
                if (v == (unsigned long)-1 && PyErr_Occurred())
                    goto fail;
                if (v > 0xFFFFFFFFul) {
                    PyErr_SetString(PyExc_OverflowError, "a token id does not fit in 32 bits");
                    goto fail;
                }
                id = (uint32_t)v;
            }
            at[0] = (uint8_t)id;
            at[1] = (uint8_t)(id >> 8);
            at[2] = (uint8_t)(id >> 16);
            at[3] = (uint8_t)(id >> 24);
        }
        const char *keys = (i == 0 && n_first) ? first : extra;
        Py_ssize_t n_keys = (i == 0 && n_first) ? n_first : n_extra;
        memcpy(buf + head, keys, (size_t)n_keys);
        parent = xxh3_medium(buf, (size_t)(head + n_keys), seed);
        words[i - start] = parent;
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    if (viewed)
        PyBuffer_Release(&view);
    Py_XDECREF(seq);
    return out;
}

static PyMethodDef methods[] = {
    {"chain", (PyCFunction)(void (*)(void))chain, METH_FASTCALL,
     "Blocks' hashes of mocker's fast chain (native uint64 words), or None."},
    {"xxh3_64", (PyCFunction)(void (*)(void))xxh3_64, METH_FASTCALL,
     "XXH3-64 of 17 to 240 bytes, seeded."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "mocker.kv._chash",
    "mocker's fast block-hash chain in C (mocker.kv.hashing is the reference).", -1, methods,
};

PyMODINIT_FUNC PyInit__chash(void)
{
    return PyModule_Create(&module);
}
