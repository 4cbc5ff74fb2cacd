/* An exact int in [0, 2**64) read as a uint64 straight from its digits, shared by the compiled
 * parts that take block hashes from Python lists (mocker/kv/_cpool.c, mocker/tiers/_clru.c).
 *
 * Why: on 3.11 PyLong_AsUnsignedLongLong converts an int of three digits (every hash above
 * 2**60) through a generic byte-array routine, about 200 instructions where this takes 20
 * (a tier's batch verbs read every key they are given). On other versions, or for anything
 * else (a negative int, one of 65 bits or more, a subclass), the caller's own path. */
#ifndef MOCKER_CUINT64_H
#define MOCKER_CUINT64_H

#include <Python.h>
#include <stdint.h>

/* 1 and *out set: read; 0: not read here (the caller converts it its own way). */
static inline int uint64_digits(PyObject *obj, uint64_t *out)
{
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
    if (PyLong_CheckExact(obj)) {
        Py_ssize_t size = Py_SIZE(obj);
        const digit *d = ((PyLongObject *)obj)->ob_digit;
        if (size >= 0 && size * PyLong_SHIFT < 64 + PyLong_SHIFT) {
            /* The bits the top digit may use: a larger one is an int of 65 bits or more. */
            int room = 64 - (int)(size - 1) * PyLong_SHIFT;
            if (size == 0 || room >= PyLong_SHIFT || (d[size - 1] >> room) == 0) {
                uint64_t x = 0;
                for (Py_ssize_t i = size - 1; i >= 0; i--) {
                    x = (x << PyLong_SHIFT) | d[i];
                }
                *out = x;
                return 1;
            }
        }
    }
#else
    (void)obj;
    (void)out;
#endif
    return 0;
}

#endif
