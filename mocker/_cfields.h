/* Attributes of Python classes read and written from C through the public descriptor
 * protocol: a class's attribute found once (`field_find`), then each access one call of its
 * descriptor's `tp_descr_get` / `tp_descr_set` (for a `__slots__` member, the member
 * descriptor's own reader and writer), with no name lookup per access. Shared by the compiled
 * parts that walk engine and API objects per token (mocker/engine/_cpass.c,
 * mocker/api/_ctext.c). */
#ifndef MOCKER_CFIELDS_H
#define MOCKER_CFIELDS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* A class's data attribute: its descriptor (held) and that descriptor's get and set. */
typedef struct {
    PyObject *descr;
    descrgetfunc get;
    descrsetfunc set;
} Field;

/* Find `type`'s attribute `name` as a `__slots__` member of the class or a base: 1, or 0
 * when it is not one or `type` overrides attribute access (reading, or writing too when
 * `writes`): nothing held; -1 with an error set. A member descriptor wins over an instance's
 * dict, so with the generic attribute access reading through it is what `getattr` does for
 * instances of exactly `type`. */
static inline int field_find(Field *f, PyTypeObject *type, const char *name, int writes)
{
    f->descr = NULL;
    f->get = NULL;
    f->set = NULL;
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
    descrgetfunc get = Py_TYPE(d)->tp_descr_get;
    descrsetfunc set = Py_TYPE(d)->tp_descr_set;
    if (!Py_IS_TYPE(d, &PyMemberDescr_Type) || get == NULL || set == NULL) {
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
    f->get = get;
    f->set = set;
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
    return f->get(f->descr, obj, (PyObject *)Py_TYPE(obj));
}

/* `obj`'s field, or NULL with no error set when it cannot be read (a new reference). */
static inline PyObject *field_peek(const Field *f, PyObject *obj)
{
    assert(!PyErr_Occurred());
    PyObject *v = f->get(f->descr, obj, (PyObject *)Py_TYPE(obj));
    if (v == NULL)
        PyErr_Clear();
    return v;
}

/* Set `obj`'s field to `value` (not stolen): 0, or -1 with an error set. */
static inline int field_set(const Field *f, PyObject *obj, PyObject *value)
{
    return f->set(f->descr, obj, value);
}

/* Set `obj`'s field to `value`, stealing the reference: 0, or -1 with an error set. */
static inline int field_put(const Field *f, PyObject *obj, PyObject *value)
{
    int r = f->set(f->descr, obj, value);
    Py_DECREF(value);
    return r;
}

#endif
