"""The Cython core of paddle_rt. Each module is a ``.pyx`` with a ``.pxd`` that other Cython code can cimport."""
