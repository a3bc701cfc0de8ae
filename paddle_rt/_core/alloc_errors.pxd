# The allocator's errors (alloc_errors.pyx). Only allocator.pyx cimports it; with the GIL, the allocator's lock not
# held.
from paddle_rt._core.alloc_types cimport AllocatorCore, AllocError

# Raise the exception of `e` found in allocator `c` (always -1); `owner`: for ERR_FOREIGN, where the pointer belongs
# (allocator.owner_of) or None.
cdef int raise_alloc_error(AllocatorCore* c, AllocError* e, object owner) except -1
