/* Slots of Python classes (`__slots__`, dataclasses with slots=True) read and written from C at
 * the offsets their member descriptors name: no attribute lookup per access. Shared by the
 * compiled parts that walk engine and API objects per token (mocker/engine/_cpass.c,
 * mocker/api/_ctext.c). */
#ifndef MOCKER_CSLOTS_H
#define MOCKER_CSLOTS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* The object in the slot at `off` (borrowed; NULL while unset). */
#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

/* The offset of `type`'s own plain slot `name` (a writable object member), or -1. */
static inline Py_ssize_t slot_offset(PyTypeObject *type, const char *name)
{
    PyObject *d = PyDict_GetItemString(type->tp_dict, name); /* borrowed */
    if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type))
        return -1;
    PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
    if (m->type != T_OBJECT_EX || (m->flags & READONLY))
        return -1;
    return m->offset;
}

/* The offsets of `type`'s plain slots `names`: 0, or -1 with a TypeError naming the first
 * that is not one (the message starts with `who`). */
static inline int slot_offsets(PyTypeObject *type, const char *const *names, Py_ssize_t *out,
                               int n, const char *who)
{
    for (int i = 0; i < n; i++) {
        out[i] = slot_offset(type, names[i]);
        if (out[i] < 0) {
            PyErr_Format(PyExc_TypeError, "%s: %s.%s is not a plain slot", who, type->tp_name,
                         names[i]);
            return -1;
        }
    }
    return 0;
}

/* A new reference to the attribute `name`: read at `off` when that is >= 0 (an unset slot
 * raises AttributeError), else looked up. NULL with an error set. */
static inline PyObject *read_slot(PyObject *obj, Py_ssize_t off, PyObject *name)
{
    if (off < 0)
        return PyObject_GetAttr(obj, name);
    PyObject *v = SLOT(obj, off);
    if (v == NULL) {
        PyErr_SetObject(PyExc_AttributeError, name);
        return NULL;
    }
    Py_INCREF(v);
    return v;
}

/* Set the attribute `name` (a new reference to `value` is taken): at `off` when >= 0. */
static inline int write_slot(PyObject *obj, Py_ssize_t off, PyObject *name, PyObject *value)
{
    if (off < 0)
        return PyObject_SetAttr(obj, name, value);
    PyObject *old = SLOT(obj, off);
    Py_INCREF(value);
    SLOT(obj, off) = value;
    Py_XDECREF(old);
    return 0;
}

/* A callable that can be asked, ahead of a call, to prefetch what the call will touch: its
 * object starts with these fields, and its type's name is WARMABLE_TYPE. `warm(self, arg,
 * stage)` only prefetches (never fails, never changes anything); stage 0 reads the object's
 * own fields, stage 1 (a little later) what those point to. mocker.api._ctext's Sink is one;
 * mocker.engine._cpass's `deliver` warms the sinks of the outputs ahead of the one it hands
 * out (the two modules share no other symbol). */
#define WARMABLE_TYPE "mocker.api._ctext.Sink"
typedef void (*warmfunc)(PyObject *self, Py_ssize_t arg, int stage);
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    warmfunc warm;
} Warmable;

#endif
