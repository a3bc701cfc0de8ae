/* A free list of object memory for one extension type that Cython cannot give one itself (a subclass of a cdef
 * class with its own free list, e.g. pool.AsyncAllocation). prt_objfl_install(T) replaces T's tp_alloc/tp_free:
 * objects of exactly T's size are kept (up to 256) and handed out again, others go through the default functions.
 * Only for types that the garbage collector does not track; always called with the GIL held. The list lives in
 * obj_freelist.cpp, linked into the pool extension only. */
#ifndef PADDLE_RT_ENGINE_OBJ_FREELIST_H_
#define PADDLE_RT_ENGINE_OBJ_FREELIST_H_

#include <Python.h>

/* 0 on success, -1 when the type is tracked by the garbage collector or a type was installed already. */
int prt_objfl_install(PyTypeObject* t);

#endif /* PADDLE_RT_ENGINE_OBJ_FREELIST_H_ */
