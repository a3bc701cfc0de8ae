# Small atomic helpers (GCC/Clang __atomic builtins) on plain integer fields, for counters shared between Python
# threads and stream worker threads (deferred frees of record_stream).
from libc.stdint cimport int64_t

cdef extern from "engine/atomics.h" nogil:
    # Add d; return the new value.
    int64_t prt_atomic_add_i64(int64_t* p, int64_t d)
    int64_t prt_atomic_load_i64(int64_t* p)
    int prt_atomic_add_int(int* p, int d)
