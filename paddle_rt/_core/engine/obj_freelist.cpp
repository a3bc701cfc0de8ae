/* The free list of object memory, linked into the pool extension only (setup.py: ENGINE_SOURCES). */
#include <Python.h>
#include <string.h>

#include "engine/obj_freelist.h"

#define PRT_OBJFL_N 256
namespace {
PyObject* prt_objfl_items[PRT_OBJFL_N];
int prt_objfl_count = 0;
Py_ssize_t prt_objfl_size = -1;
PyTypeObject* prt_objfl_type = NULL;

PyObject* prt_objfl_alloc(PyTypeObject* t, Py_ssize_t nitems) {
    if (t == prt_objfl_type && nitems == 0 && prt_objfl_count > 0) {
        PyObject* o = prt_objfl_items[--prt_objfl_count];
        memset((void*)o, 0, (size_t)prt_objfl_size);
        return PyObject_Init(o, t);
    }
    return PyType_GenericAlloc(t, nitems);
}
void prt_objfl_free(void* p) {
    PyObject* o = (PyObject*)p;
    if (Py_TYPE(o) == prt_objfl_type && prt_objfl_count < PRT_OBJFL_N) {
        prt_objfl_items[prt_objfl_count++] = o;
        return;
    }
    PyObject_Free(p);
}
}  // namespace

/* 0 on success, -1 when the type is tracked by the garbage collector (left unchanged). */
int prt_objfl_install(PyTypeObject* t) {
    if (PyType_HasFeature(t, Py_TPFLAGS_HAVE_GC) || prt_objfl_type != NULL) return -1;
    prt_objfl_type = t;
    prt_objfl_size = t->tp_basicsize;
    t->tp_alloc = prt_objfl_alloc;
    t->tp_free = prt_objfl_free;
    return 0;
}
