/* npy.c: a strict reader and an atomic (temp file + rename) writer for NumPy .npy files. */
#define _POSIX_C_SOURCE 200809L

#include "npy.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

/* The format is documented in numpy/lib/format.py: magic, version, a
 * little-endian header length (u16 in 1.0, u32 in 2.0/3.0), then a Python
 * dict literal padded with spaces to a multiple of 64 bytes and ended by '\n',
 * then the raw data. */
static const unsigned char npy_magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

/* Real headers are ~128 bytes; the bound keeps a corrupt length field from
 * asking for a huge allocation. */
#define NPY_MAX_HEADER ((size_t)1 << 20)

#if defined(__GNUC__)
#define NPY_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define NPY_PRINTF(f, a)
#endif

static void set_err(char *err, size_t size, const char *fmt, ...) NPY_PRINTF(3, 4);

static void set_err(char *err, size_t size, const char *fmt, ...) {
    va_list ap;
    if (err == NULL || size == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, size, fmt, ap);
    va_end(ap);
}

static int host_is_little_endian(void) {
    const uint16_t one = 1;
    unsigned char first;
    memcpy(&first, &one, 1);
    return first == 1;
}

static void swap_bytes(void *data, size_t count, size_t elem_size) {
    unsigned char *p = data;
    for (size_t i = 0; i < count; i++, p += elem_size) {
        for (size_t a = 0, b = elem_size - 1; a < b; a++, b--) {
            unsigned char t = p[a];
            p[a] = p[b];
            p[b] = t;
        }
    }
}

size_t npy_dtype_size(npy_dtype dtype) {
    return dtype == NPY_FLOAT64 ? 8 : dtype == NPY_FLOAT16 ? 2 : 4;
}

const char *npy_dtype_name(npy_dtype dtype) {
    return dtype == NPY_FLOAT64 ? "float64" : dtype == NPY_FLOAT16 ? "float16" : "float32";
}

/* Appends with snprintf semantics, never running past size. */
static void append(char *buf, size_t size, size_t *used, const char *fmt, ...) NPY_PRINTF(4, 5);

static void append(char *buf, size_t size, size_t *used, const char *fmt, ...) {
    va_list ap;
    int n;
    if (*used >= size)
        return;
    va_start(ap, fmt);
    n = vsnprintf(buf + *used, size - *used, fmt, ap);
    va_end(ap);
    if (n > 0)
        *used += (size_t)n < size - *used ? (size_t)n : size - *used - 1;
}

void npy_format_shape(const size_t *shape, int ndim, char *buf, size_t size) {
    size_t used = 0;
    if (size == 0)
        return;
    buf[0] = '\0';
    append(buf, size, &used, "(");
    for (int i = 0; i < ndim; i++)
        append(buf, size, &used, "%s%zu", i ? "," : "", shape[i]);
    append(buf, size, &used, ndim == 1 ? ",)" : ")");
}

/* ---- header parsing -------------------------------------------------------
 * A tiny recursive-descent parser for exactly what numpy writes: a dict with
 * the keys 'descr' (a string), 'fortran_order' (True/False) and 'shape' (a
 * tuple of integers). Anything else is refused rather than guessed at. */
typedef struct hdr_parser {
    const char *text;
    size_t len, pos;
    char *err;
    size_t err_size;
} hdr_parser;

static void hp_skip_ws(hdr_parser *p) {
    while (p->pos < p->len && (p->text[p->pos] == ' ' || p->text[p->pos] == '\t' ||
                               p->text[p->pos] == '\n' || p->text[p->pos] == '\r'))
        p->pos++;
}

static int hp_peek(const hdr_parser *p) {
    return p->pos < p->len ? (unsigned char)p->text[p->pos] : -1;
}

static int hp_fail(hdr_parser *p, const char *expected) {
    set_err(p->err, p->err_size, "header not parsable: expected %s at header byte %zu", expected,
            p->pos);
    return -1;
}

/* After an item of a list (the shape tuple, the header dict): skips white space, then takes ','
 * (returns 1: another item follows) or `close` (returns 0: the list ended), or fails naming
 * `expected` (-1). */
static int hp_after_item(hdr_parser *p, int close, const char *expected) {
    hp_skip_ws(p);
    const int c = hp_peek(p);
    if (c != ',' && c != close)
        return hp_fail(p, expected);
    p->pos++;
    return c == ',';
}

static int hp_expect(hdr_parser *p, char c, const char *what) {
    hp_skip_ws(p);
    if (hp_peek(p) != (unsigned char)c)
        return hp_fail(p, what);
    p->pos++;
    return 0;
}

/* A quoted string without escapes (numpy never writes any in these keys). */
static int hp_string(hdr_parser *p, char *out, size_t out_size) {
    int quote;
    size_t n = 0;
    hp_skip_ws(p);
    quote = hp_peek(p);
    if (quote != '\'' && quote != '"')
        return hp_fail(p, "a quoted string");
    p->pos++;
    while (p->pos < p->len && p->text[p->pos] != quote) {
        char c = p->text[p->pos];
        if (c == '\\' || c == '\n' || c == '\0')
            return hp_fail(p, "a plain string");
        if (n + 1 >= out_size)
            return hp_fail(p, "a short string");
        out[n++] = c;
        p->pos++;
    }
    if (p->pos >= p->len)
        return hp_fail(p, "a closing quote");
    p->pos++;
    out[n] = '\0';
    return 0;
}

static int hp_bool(hdr_parser *p, int *value) {
    hp_skip_ws(p);
    if (p->len - p->pos >= 4 && memcmp(p->text + p->pos, "True", 4) == 0) {
        p->pos += 4;
        *value = 1;
        return 0;
    }
    if (p->len - p->pos >= 5 && memcmp(p->text + p->pos, "False", 5) == 0) {
        p->pos += 5;
        *value = 0;
        return 0;
    }
    return hp_fail(p, "True or False");
}

static int hp_shape(hdr_parser *p, size_t *shape, int *ndim) {
    int n = 0;
    if (hp_expect(p, '(', "'(' opening the shape") != 0)
        return -1;
    for (;;) {
        size_t value = 0;
        hp_skip_ws(p);
        if (hp_peek(p) == ')') {
            p->pos++;
            break;
        }
        if (hp_peek(p) < '0' || hp_peek(p) > '9')
            return hp_fail(p, "a non-negative integer in the shape");
        while (hp_peek(p) >= '0' && hp_peek(p) <= '9') {
            size_t digit = (size_t)(hp_peek(p) - '0');
            if (value > (SIZE_MAX - digit) / 10) {
                set_err(p->err, p->err_size, "shape has a dimension too large for this machine");
                return -1;
            }
            value = value * 10 + digit;
            p->pos++;
        }
        if (hp_peek(p) == 'L') /* Python 2 era files wrote longs as 3L */
            p->pos++;
        if (n >= NPY_MAX_DIMS) {
            set_err(p->err, p->err_size, "shape has more than %d dimensions", NPY_MAX_DIMS);
            return -1;
        }
        shape[n++] = value;
        const int more = hp_after_item(p, ')', "',' or ')' in the shape");
        if (more < 0)
            return -1;
        if (!more)
            break;
    }
    *ndim = n;
    return 0;
}

static int parse_header(hdr_parser *p, char *descr, size_t descr_size, int *fortran, size_t *shape,
                        int *ndim) {
    int seen_descr = 0, seen_fortran = 0, seen_shape = 0;
    if (hp_expect(p, '{', "'{' opening the header dict") != 0)
        return -1;
    for (;;) {
        char key[32];
        hp_skip_ws(p);
        if (hp_peek(p) == '}') {
            p->pos++;
            break;
        }
        if (hp_string(p, key, sizeof key) != 0)
            return -1;
        if (hp_expect(p, ':', "':' after a key") != 0)
            return -1;
        if (strcmp(key, "descr") == 0 && !seen_descr) {
            hp_skip_ws(p);
            if (hp_peek(p) == '[') {
                set_err(p->err, p->err_size,
                        "structured dtype not supported: flashcl reads float32 or float16 arrays");
                return -1;
            }
            if (hp_string(p, descr, descr_size) != 0)
                return -1;
            seen_descr = 1;
        } else if (strcmp(key, "fortran_order") == 0 && !seen_fortran) {
            if (hp_bool(p, fortran) != 0)
                return -1;
            seen_fortran = 1;
        } else if (strcmp(key, "shape") == 0 && !seen_shape) {
            if (hp_shape(p, shape, ndim) != 0)
                return -1;
            seen_shape = 1;
        } else {
            set_err(p->err, p->err_size, "header not parsable: unexpected or repeated key '%s'",
                    key);
            return -1;
        }
        const int more = hp_after_item(p, '}', "',' or '}' after a value");
        if (more < 0)
            return -1;
        if (!more)
            break;
    }
    hp_skip_ws(p);
    if (p->pos != p->len)
        return hp_fail(p, "the end of the header after '}'");
    if (!seen_descr || !seen_fortran || !seen_shape) {
        set_err(p->err, p->err_size, "header not parsable: missing key '%s'",
                !seen_descr     ? "descr"
                : !seen_fortran ? "fortran_order"
                                : "shape");
        return -1;
    }
    return 0;
}

/* Maps a descr to a dtype; *swap says whether the bytes need reversing. */
static int parse_descr(const char *descr, npy_dtype *dtype, int *swap, int allow_f64, char *err,
                       size_t err_size) {
    char order = descr[0];
    int little;
    if (strlen(descr) == 3 && descr[1] == 'f' &&
        (descr[2] == '4' || descr[2] == '2' || (allow_f64 && descr[2] == '8'))) {
        if (order == '>') {
            set_err(err, err_size,
                    "big-endian dtype '%s' not supported: save with arr.astype('<f%c')", descr,
                    descr[2]);
            return -1;
        }
        if (order == '<' || order == '|' || order == '=') {
            /* '|' and '=' mean the writer's native order; like numpy, take them as ours. */
            little = order == '<' ? 1 : host_is_little_endian();
            *dtype = descr[2] == '8' ? NPY_FLOAT64 : descr[2] == '4' ? NPY_FLOAT32 : NPY_FLOAT16;
            *swap = little != host_is_little_endian();
            return 0;
        }
    }
    set_err(err, err_size,
            "dtype '%s' not supported: flashcl reads float32 ('<f4') or float16 ('<f2')", descr);
    return -1;
}

static int read_impl(const char *path, npy_array *array, int allow_f64, char *err, size_t err_size);

int npy_read(const char *path, npy_array *array, char *err, size_t err_size) {
    return read_impl(path, array, 0, err, err_size);
}

int npy_read_any(const char *path, npy_array *array, char *err, size_t err_size) {
    return read_impl(path, array, 1, err, err_size);
}

static int read_impl(const char *path, npy_array *array, int allow_f64, char *err, size_t err_size) {
    unsigned char pre[12];
    char descr[32], shape_text[256];
    size_t got, prelen, hlen, count = 1, bytes, elem_size;
    int fortran = 0, swap = 0, have_size;
    long long file_size = 0;
    struct stat st;
    char *header = NULL;
    npy_dtype dtype;
    hdr_parser parser;
    FILE *f;

    memset(array, 0, sizeof *array);
    f = fopen(path, "rb");
    if (f == NULL) {
        set_err(err, err_size, "cannot open: %s", strerror(errno));
        return -1;
    }
    /* The size, when known, lets every length be checked before any large malloc. */
    have_size = fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode);
    if (have_size)
        file_size = (long long)st.st_size;
    else if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        set_err(err, err_size, "is a directory, not a .npy file");
        goto fail;
    }

    got = fread(pre, 1, 10, f);
    if (got == 0) {
        set_err(err, err_size, "empty file, not a .npy file");
        goto fail;
    }
    if (memcmp(pre, npy_magic, got < 6 ? got : 6) != 0) {
        set_err(err, err_size, "bad magic: not a .npy file");
        goto fail;
    }
    if (got < 10) {
        set_err(err, err_size, "truncated: the file ends inside the .npy preamble (%zu bytes)",
                got);
        goto fail;
    }
    if (pre[6] == 1) {
        hlen = (size_t)pre[8] | (size_t)pre[9] << 8;
        prelen = 10;
    } else if (pre[6] == 2 || pre[6] == 3) {
        if (fread(pre + 10, 1, 2, f) != 2) {
            set_err(err, err_size, "truncated: the file ends inside the .npy preamble");
            goto fail;
        }
        hlen = (size_t)pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 | (size_t)pre[11] << 24;
        prelen = 12;
    } else {
        set_err(err, err_size, "unsupported .npy format version %u.%u", pre[6], pre[7]);
        goto fail;
    }
    if (hlen > NPY_MAX_HEADER) {
        set_err(err, err_size, "header length %zu is implausible (corrupt file?)", hlen);
        goto fail;
    }
    if (have_size && (long long)(prelen + hlen) > file_size) {
        set_err(err, err_size,
                "truncated: the header needs %zu bytes, the file has %lld after the "
                "preamble",
                hlen, file_size - (long long)prelen);
        goto fail;
    }
    header = malloc(hlen + 1);
    if (header == NULL) {
        set_err(err, err_size, "out of memory reading the header");
        goto fail;
    }
    if (fread(header, 1, hlen, f) != hlen) {
        set_err(err, err_size, "truncated: the file ends inside the header");
        goto fail;
    }
    header[hlen] = '\0';

    parser.text = header;
    parser.len = hlen;
    parser.pos = 0;
    parser.err = err;
    parser.err_size = err_size;
    if (parse_header(&parser, descr, sizeof descr, &fortran, array->shape, &array->ndim) != 0)
        goto fail;
    if (parse_descr(descr, &dtype, &swap, allow_f64, err, err_size) != 0)
        goto fail;
    npy_format_shape(array->shape, array->ndim, shape_text, sizeof shape_text);
    if (fortran) {
        set_err(err, err_size,
                "fortran_order True not supported: save a C-ordered array "
                "(np.ascontiguousarray)");
        goto fail;
    }
    elem_size = npy_dtype_size(dtype);
    for (int i = 0; i < array->ndim; i++) {
        if (array->shape[i] != 0 && count > SIZE_MAX / elem_size / array->shape[i]) {
            set_err(err, err_size, "shape %s is too large for this machine", shape_text);
            goto fail;
        }
        count *= array->shape[i];
    }
    bytes = count * elem_size;
    if (have_size) {
        long long avail = file_size - (long long)(prelen + hlen);
        if (avail < (long long)bytes) {
            set_err(err, err_size,
                    "data truncated: shape %s of %s needs %zu bytes, the file has %lld", shape_text,
                    npy_dtype_name(dtype), bytes, avail);
            goto fail;
        }
        if (avail > (long long)bytes) {
            set_err(err, err_size, "%lld bytes of trailing data after the %s array of shape %s",
                    avail - (long long)bytes, npy_dtype_name(dtype), shape_text);
            goto fail;
        }
    }
    array->data = malloc(bytes ? bytes : 1);
    if (array->data == NULL) {
        set_err(err, err_size, "out of memory: shape %s needs %zu bytes", shape_text, bytes);
        goto fail;
    }
    got = fread(array->data, 1, bytes, f);
    if (got != bytes) {
        if (ferror(f))
            set_err(err, err_size, "read error: %s", strerror(errno));
        else
            set_err(err, err_size,
                    "data truncated: shape %s of %s needs %zu bytes, the file has %zu", shape_text,
                    npy_dtype_name(dtype), bytes, got);
        goto fail;
    }
    if (!have_size && fgetc(f) != EOF) {
        set_err(err, err_size, "trailing data after the %s array of shape %s",
                npy_dtype_name(dtype), shape_text);
        goto fail;
    }
    if (swap)
        swap_bytes(array->data, count, elem_size);
    array->dtype = dtype;
    array->count = count;
    free(header);
    fclose(f);
    return 0;

fail:
    free(header);
    npy_free(array);
    fclose(f);
    return -1;
}

void npy_free(npy_array *array) {
    if (array == NULL)
        return;
    free(array->data);
    memset(array, 0, sizeof *array);
}

/* Writes `bytes` of data, byte-swapped through a small buffer on a
 * big-endian host, since .npy files are written little-endian ('<'). */
static int write_data(FILE *f, const void *data, size_t count, size_t elem_size) {
    unsigned char buf[1 << 16];
    const unsigned char *src = data;
    size_t per_chunk = sizeof buf / elem_size;
    if (host_is_little_endian())
        return fwrite(data, elem_size, count, f) == count ? 0 : -1;
    for (size_t done = 0; done < count; done += per_chunk) {
        size_t n = count - done < per_chunk ? count - done : per_chunk;
        memcpy(buf, src + done * elem_size, n * elem_size);
        swap_bytes(buf, n, elem_size);
        if (fwrite(buf, elem_size, n, f) != n)
            return -1;
    }
    return 0;
}

int npy_write_temp(const char *path, npy_dtype dtype, const size_t *shape, int ndim,
                   const void *data, char **temp_path, char *err, size_t err_size) {
    char header[128 + NPY_MAX_DIMS * 24];
    unsigned char pre[10];
    size_t used = 0, count = 1, elem_size = npy_dtype_size(dtype), total, hlen, name_size;
    char *name;
    mode_t mask;
    FILE *f;
    int fd;

    *temp_path = NULL;
    if (ndim < 0 || ndim > NPY_MAX_DIMS) {
        set_err(err, err_size, "cannot write an array of %d dimensions", ndim);
        return -1;
    }
    for (int i = 0; i < ndim; i++)
        count *= shape[i];

    /* numpy's own layout: the dict, spaces, '\n', so that the data starts
     * on a 64-byte boundary. */
    append(header, sizeof header, &used, "{'descr': '<f%c', 'fortran_order': False, 'shape': (",
           dtype == NPY_FLOAT64 ? '8' : dtype == NPY_FLOAT16 ? '2' : '4');
    for (int i = 0; i < ndim; i++)
        append(header, sizeof header, &used, "%s%zu", i ? ", " : "", shape[i]);
    append(header, sizeof header, &used, "%s), }", ndim == 1 ? "," : "");
    total = sizeof pre + used + 1;
    while (total % 64 != 0) {
        header[used++] = ' ';
        total++;
    }
    header[used++] = '\n';
    hlen = used;
    memcpy(pre, npy_magic, 6);
    pre[6] = 1;
    pre[7] = 0;
    pre[8] = (unsigned char)(hlen & 0xff);
    pre[9] = (unsigned char)(hlen >> 8);

    name_size = strlen(path) + sizeof ".tmp-XXXXXX";
    name = malloc(name_size);
    if (name == NULL) {
        set_err(err, err_size, "out of memory");
        return -1;
    }
    snprintf(name, name_size, "%s.tmp-XXXXXX", path);
    fd = mkstemp(name);
    if (fd < 0) {
        set_err(err, err_size, "cannot create a temporary file next to it: %s", strerror(errno));
        free(name);
        return -1;
    }
    /* mkstemp creates 0600; give the result the permissions fopen would. */
    mask = umask(0);
    umask(mask);
    if (fchmod(fd, 0666 & ~mask) != 0) {
        /* Not fatal: the data is still right, only the mode is stricter. */
    }
    f = fdopen(fd, "wb");
    if (f == NULL) {
        set_err(err, err_size, "cannot write: %s", strerror(errno));
        close(fd);
        unlink(name);
        free(name);
        return -1;
    }
    errno = 0;
    if (fwrite(pre, 1, sizeof pre, f) != sizeof pre || fwrite(header, 1, hlen, f) != hlen ||
        write_data(f, data, count, elem_size) != 0) {
        set_err(err, err_size, "write failed: %s", errno ? strerror(errno) : "short write");
        fclose(f);
        unlink(name);
        free(name);
        return -1;
    }
    if (fclose(f) != 0) {
        set_err(err, err_size, "write failed: %s", strerror(errno));
        unlink(name);
        free(name);
        return -1;
    }
    *temp_path = name;
    return 0;
}
