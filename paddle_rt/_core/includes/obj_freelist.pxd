# A free list of object memory for one extension type that Cython cannot give one itself (a subclass of a cdef class
# with its own free list, e.g. pool.AsyncAllocation). prt_objfl_install(T) replaces T's tp_alloc/tp_free: objects of
# exactly T's size are kept (up to 256) and handed out again, others go through the default functions. Only for types
# that the garbage collector does not track (no Py_TPFLAGS_HAVE_GC); always called with the GIL held.
from cpython.object cimport PyTypeObject

cdef extern from "engine/obj_freelist.h" nogil:
    int prt_objfl_install(PyTypeObject* t)
