/* npy.h: reading and writing NumPy .npy files (float32, float16, and float64 where asked; C order, little-endian). */
#ifndef FLASHCL_TOOLS_NPY_H
#define FLASHCL_TOOLS_NPY_H

#include <stddef.h>

/* NumPy itself allows 64; more than this is reported as unsupported. */
#define NPY_MAX_DIMS 32

typedef enum npy_dtype {
    NPY_FLOAT32 = 0, /* descr '<f4' */
    NPY_FLOAT16 = 1, /* descr '<f2' */
    NPY_FLOAT64 = 2  /* descr '<f8': written by npy_write_temp, read by npy_read_any only */
} npy_dtype;

/* An array read from or about to be written to a file. data holds `count`
 * elements in host byte order, C order; it is owned by the array. */
typedef struct npy_array {
    npy_dtype dtype;
    int ndim;
    size_t shape[NPY_MAX_DIMS];
    size_t count; /* product of shape (1 for a 0-d array, 0 if a dim is 0) */
    void *data;
} npy_array;

/* Bytes per element, and the name used in messages ("float32", "float16"). */
size_t npy_dtype_size(npy_dtype dtype);
const char *npy_dtype_name(npy_dtype dtype);

/* Writes "(2,17,4,64)" into buf (truncated to size, always terminated). */
void npy_format_shape(const size_t *shape, int ndim, char *buf, size_t size);

/* Reads `path` into *array. Accepts format versions 1.0, 2.0 and 3.0, descr
 * '<f4'/'<f2' (or '|'/'=' for the native little-endian order), fortran_order
 * False, and exactly as many data bytes as the shape needs. On failure
 * returns -1, leaves *array empty and writes a one-line reason without the
 * file name into err (e.g. "bad magic: not a .npy file"). */
int npy_read(const char *path, npy_array *array, char *err, size_t err_size);

/* npy_read that also accepts float64 ('<f8'), for callers that handle it. */
int npy_read_any(const char *path, npy_array *array, char *err, size_t err_size);

/* Frees array->data and empties the array. Safe on an empty array. */
void npy_free(npy_array *array);

/* Writes an array as a version 1.0 (2.0 if the header needs it) .npy file to
 * a new temporary file next to `path` (same directory, so a rename is
 * atomic). On success returns 0 and *temp_path (malloc'd, the caller frees
 * it) names the complete file, which the caller renames onto `path` or
 * removes; on failure returns -1, no temporary file remains, and err says
 * why. The permissions follow the umask, like a file created with fopen. */
int npy_write_temp(const char *path, npy_dtype dtype, const size_t *shape, int ndim,
                   const void *data, char **temp_path, char *err, size_t err_size);

#endif /* FLASHCL_TOOLS_NPY_H */
