/* Attributes of Python classes read and written from C through CPython's member API: a
 * class's `__slots__` member found once (`field_find`: its member descriptor and the
 * PyMemberDef that describes it), then read as `PyMember_GetOne` reads it (the object at the
 * PyMemberDef's published offset) and written by `PyMember_SetOne`, with no name lookup per
 * access. The PyMemberDef is the member descriptor's (`PyMemberDescrObject`, CPython's
 * public non-limited API); its offset is the one the class publishes for the member. The
 * caller checks that an object is of the field's class before each access, as the
 * descriptor would. Shared by the compiled parts that walk engine and API objects per token
 * (mocker/engine/_cpass.c, mocker/api/_ctext.c). */
#ifndef MOCKER_CFIELDS_H
#define MOCKER_CFIELDS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h> /* (T_OBJECT_EX, READONLY: 3.11's names, kept by 3.12 and 3.13) */

/* A class's `__slots__` member: its descriptor (held) and the PyMemberDef it reads through. */
typedef struct {
    PyObject *descr;    /* the member descriptor (held: it keeps `member` alive) */
    PyMemberDef *member;
} Field;

/* Find `type`'s attribute `name` as a `__slots__` member of the class or a base: 1, or 0
 * when it is not one or `type` overrides attribute access (reading, or writing too when
 * `writes`): nothing held; -1 with an error set. A member descriptor wins over an instance's
 * dict, so with the generic attribute access reading through it is what `getattr` does for
 * instances of exactly `type`. */
static inline int field_find(Field *f, PyTypeObject *type, const char *name, int writes)
{
    f->descr = NULL;
    f->member = NULL;
    /* (a class that overrides attribute access is read through it: not a field) */
    if (type->tp_getattro != PyObject_GenericGetAttr ||
        (writes && type->tp_setattro != PyObject_GenericSetAttr))
        return 0;
    PyObject *d = PyObject_GetAttrString((PyObject *)type, name);
    if (d == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    PyMemberDef *member = Py_IS_TYPE(d, &PyMemberDescr_Type)
                              ? ((PyMemberDescrObject *)d)->d_member
                              : NULL;
    if (member == NULL || member->type != T_OBJECT_EX || (member->flags & READONLY)) {
        Py_DECREF(d);
        return 0;
    }
    /* (a member of another class, copied into this one's namespace, would refuse its
     * instances at each access) */
    PyObject *owner = PyObject_GetAttrString(d, "__objclass__");
    int mine = owner != NULL && PyType_Check(owner) &&
               PyType_IsSubtype(type, (PyTypeObject *)owner);
    Py_XDECREF(owner);
    if (!mine) {
        Py_DECREF(d);
        if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    f->descr = d;
    f->member = member;
    return 1;
}

/* `type`'s attributes `names` as fields (`writes`: as `field_find`): 0, or -1 with a
 * TypeError naming the first that is not one (the message starts with `who`). */
static inline int fields_find(Field *out, PyTypeObject *type, const char *const *names, int n,
                              int writes, const char *who)
{
    for (int i = 0; i < n; i++) {
        int found = field_find(&out[i], type, names[i], writes);
        if (found <= 0) {
            if (found == 0)
                PyErr_Format(PyExc_TypeError, "%s: %s.%s is not a plain slot", who,
                             type->tp_name, names[i]);
            for (int j = 0; j < i; j++)
                Py_CLEAR(out[j].descr);
            return -1;
        }
    }
    return 0;
}

static inline void fields_clear(Field *fields, int n)
{
    for (int i = 0; i < n; i++)
        Py_CLEAR(fields[i].descr);
}

/* A new reference to `obj`'s field (obj's type is the field's class), NULL with an error set
 * (an unset slot: AttributeError). */
static inline PyObject *field_get(const Field *f, PyObject *obj)
{
    /* What PyMember_GetOne does for a T_OBJECT_EX member, inline (a pass reads a few dozen
     * a token): the object at the offset its PyMemberDef publishes (a new reference), or
     * AttributeError when the slot is unset. */
    PyObject *v = *(PyObject *const *)((const char *)obj + f->member->offset);
    if (v == NULL)
        return PyMember_GetOne((const char *)obj, f->member); /* (raises as getattr does) */
    return Py_NewRef(v);
}

/* `obj`'s field, or NULL with no error set when it cannot be read (a new reference). */
static inline PyObject *field_peek(const Field *f, PyObject *obj)
{
    assert(!PyErr_Occurred());
    PyObject *v = *(PyObject *const *)((const char *)obj + f->member->offset);
    return Py_XNewRef(v);
}

/* `obj`'s field, borrowed (NULL while unset): only to prefetch it or compare its identity,
 * with no Python code run between the read and that use. */
static inline PyObject *field_borrow(const Field *f, PyObject *obj)
{
    return *(PyObject *const *)((const char *)obj + f->member->offset);
}

/* Set `obj`'s field to `value` (not stolen): 0, or -1 with an error set. */
static inline int field_set(const Field *f, PyObject *obj, PyObject *value)
{
    return PyMember_SetOne((char *)obj, f->member, value);
}

/* Set `obj`'s field to `value`, stealing the reference: 0, or -1 with an error set. */
static inline int field_put(const Field *f, PyObject *obj, PyObject *value)
{
    int r = PyMember_SetOne((char *)obj, f->member, value);
    Py_DECREF(value);
    return r;
}

#endif
