# A free list of object memory for one extension type that Cython cannot give one itself (a subclass of a cdef class
# with its own free list, e.g. pool.AsyncAllocation). prt_objfl_install(T) replaces T's tp_alloc/tp_free: objects of
# exactly T's size are kept (up to 256) and handed out again, others go through the default functions. Only for types
# that the garbage collector does not track (no Py_TPFLAGS_HAVE_GC); always called with the GIL held.
from cpython.object cimport PyTypeObject

cdef extern from * nogil:
    """
    #include <Python.h>
    #include <string.h>
    #define PRT_OBJFL_N 256
    static PyObject* prt_objfl_items[PRT_OBJFL_N];
    static int prt_objfl_count = 0;
    static Py_ssize_t prt_objfl_size = -1;
    static PyTypeObject* prt_objfl_type = NULL;

    static PyObject* prt_objfl_alloc(PyTypeObject* t, Py_ssize_t nitems) {
        if (t == prt_objfl_type && nitems == 0 && prt_objfl_count > 0) {
            PyObject* o = prt_objfl_items[--prt_objfl_count];
            memset((void*)o, 0, (size_t)prt_objfl_size);
            return PyObject_Init(o, t);
        }
        return PyType_GenericAlloc(t, nitems);
    }
    static void prt_objfl_free(void* p) {
        PyObject* o = (PyObject*)p;
        if (Py_TYPE(o) == prt_objfl_type && prt_objfl_count < PRT_OBJFL_N) {
            prt_objfl_items[prt_objfl_count++] = o;
            return;
        }
        PyObject_Free(p);
    }
    /* 0 on success, -1 when the type is tracked by the garbage collector (left unchanged). */
    static int prt_objfl_install(PyTypeObject* t) {
        if (PyType_HasFeature(t, Py_TPFLAGS_HAVE_GC) || prt_objfl_type != NULL) return -1;
        prt_objfl_type = t;
        prt_objfl_size = t->tp_basicsize;
        t->tp_alloc = prt_objfl_alloc;
        t->tp_free = prt_objfl_free;
        return 0;
    }
    """
    int prt_objfl_install(PyTypeObject* t)
