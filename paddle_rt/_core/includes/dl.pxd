# dlopen family and the few process calls the loader needs.
cdef extern from "<dlfcn.h>" nogil:
    void* dlopen(const char* filename, int flags)
    void* dlsym(void* handle, const char* symbol)
    int dlclose(void* handle)
    char* dlerror()
    int RTLD_NOW
    int RTLD_LAZY
    int RTLD_LOCAL
    int RTLD_GLOBAL
    void* RTLD_DEFAULT
