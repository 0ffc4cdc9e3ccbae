/* kernels.h: the OpenCL sources embedded at build time (cmake/embed_kernels.cmake). */
#ifndef FLASHCL_KERNELS_H
#define FLASHCL_KERNELS_H

#include <stddef.h>

typedef struct flashcl_embedded_source {
    const char *name; /* file name under cl/, e.g. "flash_fwd.cl" */
    const char *text; /* NUL-terminated source                    */
    size_t length;
} flashcl_embedded_source;

/* Terminated by an entry whose name is NULL. */
extern const flashcl_embedded_source flashcl_embedded_sources[];

#endif
