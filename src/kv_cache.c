/* kv_cache.c: the paged KV cache: pools, page allocator with reference counts, fork, copy-on-write, append.
 *
 * Every state change follows plan -> enqueue -> commit: an append first works
 * out every page it will take (and every copy-on-write) without touching the
 * allocator, fails with FLASHCL_ERROR_OUT_OF_PAGES before anything changes
 * when the free list is too short, then enqueues the copies and the append
 * kernel, and only when all of that succeeded updates page tables, lengths,
 * reference counts and the free list. A failed enqueue therefore leaves the
 * cache as it was; the device may have written into pages that are still
 * free or rows past a sequence's length, which nothing reads. (A compaction
 * of the device page tables during planning moves regions but changes no
 * table, so it may stand when the operation then fails.)
 *
 * Device page tables. The attention kernels read each sequence's page table
 * from the cache's `tables` buffer (its region [dev_off, dev_off + dev_cap)),
 * so a decode step uploads a few ints per sequence instead of its tables.
 * The host tables stay the truth; the device copy follows them without a
 * transfer of its own: an append's kernel also writes the table entries the
 * append creates (new pages, a copy-on-write page), passed with its slots; a
 * sequence that outgrows its region moves to a fresh one (the next power of
 * two at or above its length, at least 16), its whole table written there the
 * same way; fork copies the parent's region on the device. Regions come from
 * a bump pointer; when it reaches the end, the buffer is rebuilt from the
 * host tables with every live region packed (freed and abandoned ones
 * reclaimed) and room to spare.
 *
 * An append's slot list (and those table entries) is uploaded without
 * blocking into one buffer the cache keeps (`slots`), from the context's
 * staging copies (serving.c), so an append allocates no device memory.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serving.h"

/* ---- helpers ------------------------------------------------------------------------ */

static int pages_for(int length, int page_size) {
    return (int)(((long)length + page_size - 1) / page_size);
}

/* splitmix64, for the optional shuffled page order. */
static uint64_t mix(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

const flashcl_kv_sequence *flashcl_kv_cache_sequence(const flashcl_kv_cache *c, int id) {
    if (!c || id < 0 || id >= c->seq_count || !c->seqs[id].live)
        return NULL;
    return &c->seqs[id];
}

flashcl_status flashcl_kv_cache_check_ids(const flashcl_kv_cache *c, flashcl_context *ctx, const int *seq_ids,
                                          int n, const char *suffix) {
    unsigned char *seen = calloc((size_t)c->seq_count + 1, 1);
    if (!seen)
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    flashcl_status st = FLASHCL_SUCCESS;
    for (int i = 0; i < n && st == FLASHCL_SUCCESS; ++i) {
        if (!flashcl_kv_cache_sequence(c, seq_ids[i]))
            st = flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "seq_ids[%d] = %d is not a live sequence", i,
                              seq_ids[i]);
        else if (seen[seq_ids[i]]++)
            st = flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "sequence %d appears twice%s", seq_ids[i], suffix);
    }
    free(seen);
    return st;
}

static flashcl_kv_sequence *live_sequence(flashcl_kv_cache *c, int id) {
    return (flashcl_kv_sequence *)flashcl_kv_cache_sequence(c, id);
}

/* Grows a page table to hold `need` entries; 0 when out of memory. */
static int reserve_pages(flashcl_kv_sequence *s, int need) {
    if (need <= s->capacity)
        return 1;
    int cap = s->capacity ? s->capacity : 4;
    while (cap < need)
        cap = cap > (1 << 29) ? need : cap * 2;
    int *p = realloc(s->pages, (size_t)cap * sizeof(int));
    if (!p)
        return 0;
    s->pages = p;
    s->capacity = cap;
    return 1;
}

/* A new sequence slot (reusing a freed id); NULL when out of memory. */
static flashcl_kv_sequence *new_slot(flashcl_kv_cache *c, int *id) {
    for (int i = 0; i < c->seq_count; ++i)
        if (!c->seqs[i].live) {
            *id = i;
            c->seqs[i].dev_cap = 0; /* its old region is abandoned */
            return &c->seqs[i];
        }
    if (c->seq_count == c->seq_capacity) {
        int cap = c->seq_capacity ? c->seq_capacity * 2 : 16;
        flashcl_kv_sequence *s = realloc(c->seqs, (size_t)cap * sizeof *s);
        if (!s)
            return NULL;
        memset(s + c->seq_capacity, 0, (size_t)(cap - c->seq_capacity) * sizeof *s);
        c->seqs = s;
        c->seq_capacity = cap;
    }
    *id = c->seq_count++;
    return &c->seqs[*id];
}

/* ---- device page tables ------------------------------------------------------------- */

/* The region size for a table of `pages` entries: a power of two, at least 16,
 * so that a growing sequence moves O(log) times. */
static int region_for(int pages) {
    int cap = 16;
    while (cap < pages && cap <= (1 << 29))
        cap *= 2;
    return cap < pages ? pages : cap;
}

/* Rebuilds the tables buffer: every live region packed from 0 (sizes kept),
 * its host table copied in at creation, and room for `extra` more ints with
 * as much again to spare. Contents do not change, only offsets, so this may
 * happen before an operation that then fails. */
static flashcl_status compact_tables(flashcl_kv_cache *c, long extra) {
    long live = 0;
    for (int i = 0; i < c->seq_count; ++i)
        if (c->seqs[i].live)
            live += c->seqs[i].dev_cap;
    long cap = 2 * (live + extra);
    if (cap < 1024)
        cap = 1024;
    if (cap > 0x7fffffffL / 2)
        return flashcl_fail(c->ctx, FLASHCL_ERROR_INVALID_SHAPE,
                            "the device page tables would exceed 2^30 entries (%ld live and new)", live + extra);
    int *host = calloc((size_t)cap, sizeof(int));
    if (!host)
        return flashcl_fail(c->ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    long off = 0;
    for (int i = 0; i < c->seq_count; ++i) {
        const flashcl_kv_sequence *q = &c->seqs[i];
        if (q->live && q->dev_cap > 0) {
            memcpy(host + off, q->pages, (size_t)q->count * sizeof(int));
            off += q->dev_cap;
        }
    }
    cl_int err = CL_SUCCESS;
    cl_mem b = clCreateBuffer(c->ctx->cl_ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, (size_t)cap * sizeof(int),
                              host, &err);
    free(host);
    if (!b)
        return flashcl_fail(c->ctx, err, "allocating the device page tables (%ld entries): %s", cap,
                            flashcl_status_string(err));
    /* Kernels already queued keep the old buffer alive until they have run. */
    if (c->tables)
        clReleaseMemObject(c->tables);
    c->tables = b;
    c->tables_cap = (int)cap;
    off = 0;
    for (int i = 0; i < c->seq_count; ++i) {
        flashcl_kv_sequence *q = &c->seqs[i];
        if (q->live && q->dev_cap > 0) {
            q->dev_off = (int)off;
            off += q->dev_cap;
        }
    }
    c->tables_used = (int)off;
    return FLASHCL_SUCCESS;
}

/* Makes room for `ints` more region entries past tables_used. */
static flashcl_status reserve_regions(flashcl_kv_cache *c, long ints) {
    if ((long)c->tables_used + ints <= (long)c->tables_cap)
        return FLASHCL_SUCCESS;
    return compact_tables(c, ints);
}

/* ---- lifetime ----------------------------------------------------------------------- */

/* FP8 pages' scales: the cache's host copies (which its desc points to) and
 * the device buffer [heads_k][4] = {k descale, v descale, k inverse, v
 * inverse}. The inverses are 1.0f / scale rounded once here, so the append
 * kernel multiplies (no division on the device, whose float division need
 * not be correctly rounded in OpenCL 1.2) and every device stores the same
 * bytes as flashcl_fp8_encode(x * inv) on the host. */
static flashcl_status make_scales(flashcl_kv_cache *c, const flashcl_kv_cache_desc *desc) {
    const int hk = desc->heads_k;
    c->k_scales = malloc((size_t)hk * sizeof(float));
    c->v_scales = malloc((size_t)hk * sizeof(float));
    float *dev = malloc((size_t)hk * 4 * sizeof(float));
    if (!c->k_scales || !c->v_scales || !dev) {
        free(dev);
        return flashcl_fail(c->ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    }
    for (int h = 0; h < hk; ++h) {
        c->k_scales[h] = desc->k_scales ? desc->k_scales[h] : 1.0f;
        c->v_scales[h] = desc->v_scales ? desc->v_scales[h] : 1.0f;
        dev[4 * h] = c->k_scales[h];
        dev[4 * h + 1] = c->v_scales[h];
        dev[4 * h + 2] = 1.0f / c->k_scales[h];
        dev[4 * h + 3] = 1.0f / c->v_scales[h];
    }
    c->desc.k_scales = c->k_scales;
    c->desc.v_scales = c->v_scales;
    cl_int err = CL_SUCCESS;
    c->scales = clCreateBuffer(c->ctx->cl_ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, (size_t)hk * 4 * sizeof(float),
                               dev, &err);
    free(dev);
    if (!c->scales)
        return flashcl_fail(c->ctx, err, "allocating the KV scales: %s", flashcl_status_string(err));
    return FLASHCL_SUCCESS;
}

flashcl_status flashcl_kv_cache_create(flashcl_context *ctx, const flashcl_kv_cache_desc *desc,
                                       flashcl_kv_cache **out) {
    FLASHCL_LOCKED(ctx);
    if (!ctx || !out)
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    *out = NULL;
    flashcl_clear_error(ctx);
    if (ctx->is_host)
        return flashcl_fail(ctx, FLASHCL_ERROR_UNSUPPORTED, "the paged KV cache needs an OpenCL device");
    if (!desc)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "desc is NULL");
    if (flashcl_dtype_is_fp8(desc->dtype))
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                            "dtype %d: a KV cache's dtype (appended K/V, queries, outputs) must be float32, float16 "
                            "or bfloat16; FP8 storage is asked for with page_dtype",
                            (int)desc->dtype);
    flashcl_status st = flashcl_check_dtype(ctx, desc->dtype);
    if (st)
        return st;
    /* page_dtype 0 is FLASHCL_FLOAT32's value: "as dtype" for every cache. */
    const flashcl_dtype page_dtype = desc->page_dtype == 0 ? desc->dtype : desc->page_dtype;
    const int fp8 = flashcl_dtype_is_fp8(page_dtype);
    if (page_dtype != desc->dtype && !fp8)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                            "page_dtype %d: must be 0, dtype (%d) or an FP8 format (FLASHCL_FLOAT8_E4M3 %d, "
                            "FLASHCL_FLOAT8_E5M2 %d)",
                            (int)desc->page_dtype, (int)desc->dtype, (int)FLASHCL_FLOAT8_E4M3,
                            (int)FLASHCL_FLOAT8_E5M2);
    const size_t es = flashcl_dtype_size(page_dtype);
    if (desc->heads_k < 1 || desc->head_dim < 1 || desc->head_dim > 256 || desc->page_size < 1 ||
        desc->page_size > 256 || desc->num_pages < 1)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE,
                            "invalid KV cache shape: heads_k %d, head_dim %d (1..256), page_size %d "
                            "(1..256), num_pages %d (>= 1)",
                            desc->heads_k, desc->head_dim, desc->page_size, desc->num_pages);
    /* Scales: only FP8 pages read them; each finite and > 0 (NaN fails the >),
     * and not so small that the append's multiplier 1.0f / scale overflows
     * (below ~2.9e-39: every byte would saturate, and 0 * inf is NaN). */
    for (int i = 0; fp8 && i < 2 * desc->heads_k; ++i) {
        const float *sc = i < desc->heads_k ? desc->k_scales : desc->v_scales;
        const float x = sc ? sc[i % desc->heads_k] : 1.0f;
        if (!(x > 0.0f) || isinf(x) || isinf(1.0f / x))
            return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                                "%s_scales[%d] = %g: must be finite and > 0, its inverse finite",
                                i < desc->heads_k ? "k" : "v", i % desc->heads_k, (double)x);
    }
    size_t page_bytes, pool_bytes;
    if (!flashcl_mul_add((size_t)desc->page_size * (size_t)desc->heads_k, (size_t)desc->head_dim * es, 0,
                         &page_bytes) ||
        !flashcl_mul_add(page_bytes, (size_t)desc->num_pages, 0, &pool_bytes))
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_SHAPE, "KV pool size overflows size_t");

    flashcl_kv_cache *c = calloc(1, sizeof *c);
    if (c) {
        c->refcount = calloc((size_t)desc->num_pages, sizeof(int));
        c->free_list = malloc((size_t)desc->num_pages * sizeof(int));
    }
    if (!c || !c->refcount || !c->free_list) {
        flashcl_kv_cache_destroy(c);
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    }
    c->ctx = ctx;
    c->desc = *desc;
    c->desc.k_scales = c->desc.v_scales = NULL;
    c->page_bytes = page_bytes;
    c->page_dtype = page_dtype;
    cl_int err = CL_SUCCESS;
    if (fp8 && (st = make_scales(c, desc)) != FLASHCL_SUCCESS) {
        flashcl_kv_cache_destroy(c);
        return st;
    }
    c->k_pool = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE, pool_bytes, NULL, &err);
    if (c->k_pool)
        c->v_pool = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE, pool_bytes, NULL, &err);
    if (!c->v_pool) {
        flashcl_kv_cache_destroy(c);
        return flashcl_fail(ctx, err, "allocating two KV pools of %zu bytes: %s", pool_bytes,
                            flashcl_status_string(err));
    }
    /* The stack is popped from the top: store the pages in reverse so they
     * are handed out as 0, 1, 2, ... unless a shuffle was asked for. */
    for (int i = 0; i < desc->num_pages; ++i)
        c->free_list[i] = desc->num_pages - 1 - i;
    if (desc->page_order_seed) {
        uint64_t state = desc->page_order_seed;
        for (int i = desc->num_pages - 1; i > 0; --i) {
            int j = (int)(mix(&state) % (uint64_t)(i + 1));
            int t = c->free_list[i];
            c->free_list[i] = c->free_list[j];
            c->free_list[j] = t;
        }
    }
    c->free_count = desc->num_pages;
    /* The first tables buffer: 4 entries per pool page (compact_tables doubles
     * the 2 asked for; it grows as needed). */
    st = compact_tables(c, desc->num_pages < (1 << 24) ? 2L * desc->num_pages : 1L << 25);
    if (st) {
        flashcl_kv_cache_destroy(c);
        return st;
    }
    *out = c;
    return FLASHCL_SUCCESS;
}

void flashcl_kv_cache_destroy(flashcl_kv_cache *c) {
    FLASHCL_LOCKED(c ? c->ctx : NULL);
    if (!c)
        return;
    if (c->k_pool)
        clReleaseMemObject(c->k_pool);
    if (c->v_pool)
        clReleaseMemObject(c->v_pool);
    if (c->tables)
        clReleaseMemObject(c->tables);
    if (c->scales)
        clReleaseMemObject(c->scales);
    free(c->k_scales);
    free(c->v_scales);
    if (c->slots)
        clReleaseMemObject(c->slots);
    if (c->slots_reader)
        clReleaseEvent(c->slots_reader);
    for (int i = 0; i < c->seq_count; ++i)
        free(c->seqs[i].pages);
    free(c->seqs);
    free(c->refcount);
    free(c->free_list);
    free(c);
}

cl_mem flashcl_kv_cache_k_pool(const flashcl_kv_cache *c) {
    return c ? c->k_pool : NULL;
}

cl_mem flashcl_kv_cache_v_pool(const flashcl_kv_cache *c) {
    return c ? c->v_pool : NULL;
}

const flashcl_kv_cache_desc *flashcl_kv_cache_get_desc(const flashcl_kv_cache *c) {
    return c ? &c->desc : NULL;
}

int flashcl_kv_cache_free_pages(const flashcl_kv_cache *c) {
    FLASHCL_LOCKED(c ? c->ctx : NULL);
    return c ? c->free_count : 0;
}

int flashcl_kv_cache_length(const flashcl_kv_cache *c, int seq) {
    FLASHCL_LOCKED(c ? c->ctx : NULL);
    const flashcl_kv_sequence *s = flashcl_kv_cache_sequence(c, seq);
    return s ? s->length : -1;
}

flashcl_status flashcl_kv_cache_page_table(const flashcl_kv_cache *c, int seq, int *pages, int capacity,
                                           int *count) {
    FLASHCL_LOCKED(c ? c->ctx : NULL);
    if (!c)
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    flashcl_clear_error(c->ctx);
    const flashcl_kv_sequence *s = flashcl_kv_cache_sequence(c, seq);
    if (!s)
        return flashcl_fail(c->ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "no live sequence %d", seq);
    if (!count || (capacity > 0 && !pages))
        return flashcl_fail(c->ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "pages or count is NULL");
    for (int i = 0; i < s->count && i < capacity; ++i)
        pages[i] = s->pages[i];
    *count = s->count;
    return FLASHCL_SUCCESS;
}

/* ---- sequences ---------------------------------------------------------------------- */

flashcl_status flashcl_kv_cache_add_sequence(flashcl_kv_cache *c, int *seq) {
    FLASHCL_LOCKED(c ? c->ctx : NULL);
    if (!c)
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    flashcl_clear_error(c->ctx);
    if (!seq)
        return flashcl_fail(c->ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "seq is NULL");
    int id;
    flashcl_kv_sequence *s = new_slot(c, &id);
    if (!s)
        return flashcl_fail(c->ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    s->live = 1;
    s->length = 0;
    s->count = 0;
    s->dev_cap = 0;
    *seq = id;
    return FLASHCL_SUCCESS;
}

flashcl_status flashcl_kv_cache_fork(flashcl_kv_cache *c, int src, int *seq) {
    FLASHCL_LOCKED(c ? c->ctx : NULL);
    if (!c)
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    flashcl_clear_error(c->ctx);
    if (!seq)
        return flashcl_fail(c->ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "seq is NULL");
    if (!flashcl_kv_cache_sequence(c, src))
        return flashcl_fail(c->ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "no live sequence %d to fork", src);
    int id;
    flashcl_kv_sequence *s = new_slot(c, &id); /* may move c->seqs: look src up again after */
    if (!s || !reserve_pages(s, c->seqs[src].count))
        return flashcl_fail(c->ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    /* The child's device table: a region of its own, filled from the parent's
     * on the device (the slot is not live yet, so a compaction skips it). */
    const int count = c->seqs[src].count, cap = count > 0 ? region_for(count) : 0;
    flashcl_status st = reserve_regions(c, cap);
    if (st)
        return st;
    if (count > 0) {
        /* Fenced by barriers both ways, so that on an out-of-order queue the
         * copy sees the parent's table as every command before it left it,
         * and every command after it sees the child's (forks are rare; on an
         * in-order queue a barrier costs next to nothing). */
        const size_t from_off = (size_t)c->seqs[src].dev_off * sizeof(int);
        const size_t to_off = (size_t)c->tables_used * sizeof(int);
        cl_int err = clEnqueueBarrierWithWaitList(c->ctx->queue, 0, NULL, NULL);
        if (err == CL_SUCCESS)
            err = clEnqueueCopyBuffer(c->ctx->queue, c->tables, c->tables, from_off, to_off,
                                      (size_t)count * sizeof(int), 0, NULL, NULL);
        if (err == CL_SUCCESS)
            err = clEnqueueBarrierWithWaitList(c->ctx->queue, 0, NULL, NULL);
        if (err != CL_SUCCESS)
            return flashcl_fail(c->ctx, err, "copying a page table for fork: %s", flashcl_status_string(err));
        s->dev_off = c->tables_used;
        c->tables_used += cap;
    }
    s->dev_cap = cap;
    const flashcl_kv_sequence *from = &c->seqs[src];
    for (int i = 0; i < from->count; ++i) {
        s->pages[i] = from->pages[i];
        c->refcount[from->pages[i]]++;
    }
    s->count = from->count;
    s->length = from->length;
    s->live = 1;
    *seq = id;
    return FLASHCL_SUCCESS;
}

flashcl_status flashcl_kv_cache_free_sequence(flashcl_kv_cache *c, int seq) {
    FLASHCL_LOCKED(c ? c->ctx : NULL);
    if (!c)
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    flashcl_clear_error(c->ctx);
    flashcl_kv_sequence *s = live_sequence(c, seq);
    if (!s)
        return flashcl_fail(c->ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "no live sequence %d", seq);
    for (int i = 0; i < s->count; ++i)
        if (--c->refcount[s->pages[i]] == 0)
            c->free_list[c->free_count++] = s->pages[i];
    s->live = 0;
    s->count = 0;
    s->length = 0;
    return FLASHCL_SUCCESS;
}

/* ---- append ------------------------------------------------------------------------- */

/* What one sequence's part of an append will do, worked out before any change. */
typedef struct append_plan {
    int old_pages, new_pages; /* table length before and after               */
    int cow_old;              /* shared last page to copy before writing, or -1 */
    int cow_page;             /* its private replacement, or -1               */
    int dev_off, dev_cap;     /* the new device region when it outgrows its own (dev_cap 0: it does not) */
} append_plan;

/* Whether a sequence of an append must copy its last page first: it is
 * partially filled and still shared. The planning loop counts each planned
 * copy out of the page's reference count while it runs (and restores them
 * after), so the last sharer of a page writes in place. */
static int needs_copy(const flashcl_kv_cache *c, const flashcl_kv_sequence *s, int tokens) {
    if (tokens == 0 || s->length % c->desc.page_size == 0)
        return 0;
    return c->refcount[s->pages[s->count - 1]] > 1;
}

static flashcl_status check_new_tokens(flashcl_kv_cache *c, const char *name, cl_mem buf,
                                       const flashcl_layout *in, int total, flashcl_layout *l) {
    const int hk = c->desc.heads_k, d = c->desc.head_dim;
    memset(l, 0, sizeof *l);
    if (in)
        *l = *in;
    if (!l->stride_seq && !l->stride_head) {
        l->stride_head = (size_t)d;
        l->stride_seq = (size_t)hk * (size_t)d;
    }
    if (!buf)
        return flashcl_fail(c->ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "%s buffer is NULL", name);
    size_t size = 0, end;
    cl_int err = clGetMemObjectInfo(buf, CL_MEM_SIZE, sizeof size, &size, NULL);
    if (err != CL_SUCCESS)
        return flashcl_fail(c->ctx, err, "%s: not a valid cl_mem", name);
    if (!flashcl_mul_add((size_t)(total - 1), l->stride_seq, l->offset + (size_t)d, &end) ||
        !flashcl_mul_add((size_t)(hk - 1), l->stride_head, end, &end) ||
        !flashcl_mul_add(end, flashcl_dtype_size(c->desc.dtype), 0, &end) || end > size)
        return flashcl_fail(c->ctx, FLASHCL_ERROR_OUT_OF_BOUNDS,
                            "%s: %d new tokens overrun the buffer of %zu bytes", name, total, size);
    return FLASHCL_SUCCESS;
}

flashcl_status flashcl_kv_cache_append(flashcl_kv_cache *c, int num_seqs, const int *seq_ids,
                                       const int *num_tokens, cl_mem k, const flashcl_layout *k_layout,
                                       cl_mem v, const flashcl_layout *v_layout, cl_event *event) {
    FLASHCL_LOCKED(c ? c->ctx : NULL);
    if (!c)
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    flashcl_context *ctx = c->ctx;
    flashcl_clear_error(ctx);
    if (num_seqs < 1 || !seq_ids || !num_tokens)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                            "append needs num_seqs >= 1 and the seq_ids and num_tokens arrays");
    const int ps = c->desc.page_size;
    long total = 0;
    flashcl_status st = flashcl_kv_cache_check_ids(c, ctx, seq_ids, num_seqs, " in one append");
    if (st)
        return st;
    for (int i = 0; i < num_seqs; ++i) {
        const flashcl_kv_sequence *s = &c->seqs[seq_ids[i]];
        if (num_tokens[i] < 0 || (long)s->length + num_tokens[i] > (long)ps * c->desc.num_pages)
            return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT,
                                "num_tokens[%d] = %d (>= 0, and the sequence must fit the pool)", i,
                                num_tokens[i]);
        total += num_tokens[i];
    }
    if (total > 0x7fffffffL)
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "more than 2^31 new tokens");
    flashcl_layout kl, vl;
    if (total > 0 && ((st = check_new_tokens(c, "k", k, k_layout, (int)total, &kl)) ||
                      (st = check_new_tokens(c, "v", v, v_layout, (int)total, &vl))))
        return st;

    /* 1. Plan: pages needed, copy-on-write of a shared partial last page. */
    append_plan *plan = calloc((size_t)num_seqs, sizeof *plan);
    if (!plan)
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    long need = 0;
    for (int i = 0; i < num_seqs; ++i) {
        const flashcl_kv_sequence *s = &c->seqs[seq_ids[i]];
        plan[i].old_pages = s->count;
        plan[i].new_pages = pages_for(s->length + num_tokens[i], ps);
        plan[i].cow_page = -1;
        plan[i].cow_old = needs_copy(c, s, num_tokens[i]) ? s->pages[s->count - 1] : -1;
        if (plan[i].cow_old >= 0)
            c->refcount[plan[i].cow_old]--;
        need += plan[i].new_pages - plan[i].old_pages + (plan[i].cow_old >= 0);
    }
    for (int i = 0; i < num_seqs; ++i)
        if (plan[i].cow_old >= 0)
            c->refcount[plan[i].cow_old]++;
    if (need > c->free_count) {
        free(plan);
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_PAGES,
                            "the append needs %ld pages but %d of %d are free; nothing was changed",
                            need, c->free_count, c->desc.num_pages);
    }
    for (int i = 0; i < num_seqs; ++i)
        if (!reserve_pages(&c->seqs[seq_ids[i]], plan[i].new_pages)) {
            free(plan);
            return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
        }
    /* Device regions for the tables that outgrow theirs (a compaction here
     * moves regions but changes no table). */
    long region_ints = 0;
    for (int i = 0; i < num_seqs; ++i) {
        const int cap = c->seqs[seq_ids[i]].dev_cap;
        plan[i].dev_cap = plan[i].new_pages > cap ? region_for(plan[i].new_pages) : 0;
        region_ints += plan[i].dev_cap;
    }
    if ((st = reserve_regions(c, region_ints))) {
        free(plan);
        return st;
    }
    for (int i = 0, at = c->tables_used; i < num_seqs; ++i)
        if (plan[i].dev_cap) {
            plan[i].dev_off = at;
            at += plan[i].dev_cap;
        }
    /* The device table entries this append creates, as (index, page) pairs
     * after the slots: new pages and a copy-on-write page, or a moved table's
     * every entry. */
    long pairs = 0;
    for (int i = 0; i < num_seqs; ++i)
        if (num_tokens[i] > 0)
            pairs += plan[i].dev_cap ? plan[i].new_pages
                                     : plan[i].new_pages - plan[i].old_pages + (plan[i].cow_old >= 0);
    if (total + 2 * pairs > 0x7fffffffL) {
        free(plan);
        return flashcl_fail(ctx, FLASHCL_ERROR_INVALID_ARGUMENT, "the append is too large for 32-bit indices");
    }
    /* The slots, then the pairs, are written into a by-value argument where
     * they fit one and META_ARGS is on, else straight into the staging copy
     * that the upload into the cache's slot buffer reads (step 2). */
    const size_t slot_bytes = (size_t)(total + 2 * pairs) * sizeof(int);
    const int arg_ints =
        total > 0 && flashcl_serving_by_value() ? flashcl_by_value_ints(ctx, (size_t)(total + 2 * pairs)) : 0;
    int by_value[FLASHCL_BY_VALUE_MAX_INTS];
    int *slots = arg_ints ? by_value : total > 0 ? flashcl_staging_take(ctx, slot_bytes) : NULL;
    if (arg_ints)
        memset(by_value, 0, (size_t)arg_ints * sizeof(int));
    if (total > 0 && !slots) {
        free(plan);
        return flashcl_fail(ctx, FLASHCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    }
    /* Pages are taken from the top of the free stack without popping yet;
     * new table entries go past each table's count, where nothing reads. */
    int top = c->free_count;
    long t = 0;
    cl_int err = CL_SUCCESS;
    int copies = 0;
    for (int i = 0; i < num_seqs && err == CL_SUCCESS; ++i) {
        flashcl_kv_sequence *s = &c->seqs[seq_ids[i]];
        if (num_tokens[i] == 0)
            continue;
        if (plan[i].cow_old >= 0) {
            const int old = plan[i].cow_old, fresh = c->free_list[--top];
            plan[i].cow_page = fresh;
            /* Only the filled rows matter, but the whole page is one copy.
             * The first copy waits behind a barrier: on an out-of-order queue
             * the fresh page may have just been freed by a sequence that an
             * attention call still reads. */
            size_t src = (size_t)old * c->page_bytes, dst = (size_t)fresh * c->page_bytes;
            if (!copies)
                err = clEnqueueBarrierWithWaitList(ctx->queue, 0, NULL, NULL);
            if (err == CL_SUCCESS)
                err = clEnqueueCopyBuffer(ctx->queue, c->k_pool, c->k_pool, src, dst, c->page_bytes, 0, NULL,
                                          NULL);
            if (err == CL_SUCCESS)
                err = clEnqueueCopyBuffer(ctx->queue, c->v_pool, c->v_pool, src, dst, c->page_bytes, 0,
                                          NULL, NULL);
            copies = 1;
        }
        for (int p = plan[i].old_pages; p < plan[i].new_pages; ++p)
            s->pages[p] = c->free_list[--top];
        for (int j = 0; j < num_tokens[i]; ++j) {
            const int n = s->length + j, lp = n / ps;
            const int page = lp == s->count - 1 && plan[i].cow_page >= 0 ? plan[i].cow_page : s->pages[lp];
            slots[t++] = page * ps + n % ps;
        }
    }
    if (err != CL_SUCCESS) {
        free(plan);
        return flashcl_fail(ctx, err, "copy-on-write of a KV page: %s", flashcl_status_string(err));
    }
    if (pairs > 0) {
        int *pair = slots + total;
        for (int i = 0; i < num_seqs; ++i) {
            const flashcl_kv_sequence *s = &c->seqs[seq_ids[i]];
            if (num_tokens[i] == 0)
                continue;
            const int base = plan[i].dev_cap ? plan[i].dev_off : s->dev_off;
            const int last = plan[i].old_pages - 1; /* the entry a copy-on-write replaces */
            for (int p = plan[i].dev_cap ? 0 : plan[i].old_pages; p < plan[i].new_pages; ++p) {
                *pair++ = base + p;
                *pair++ = p == last && plan[i].cow_page >= 0 ? plan[i].cow_page : s->pages[p];
            }
            if (!plan[i].dev_cap && plan[i].cow_page >= 0) {
                *pair++ = base + last;
                *pair++ = plan[i].cow_page;
            }
        }
    }

    /* 2. Enqueue the scatter kernel (or, with nothing to write, a marker so
     *    `event` still means "the append is done"). */
    if (total > 0) {
        char options[96];
        int at = snprintf(options, sizeof options, "-cl-std=CL1.2 -DDTYPE=%d", (int)c->desc.dtype);
        if (c->scales) /* FP8 pages: the kernel quantizes (cl/kv_cache.cl) */
            at += snprintf(options + at, sizeof options - (size_t)at, " -DKV_FP8=%d", (int)c->page_dtype);
        if (arg_ints)
            snprintf(options + at, sizeof options - (size_t)at, " -DSLOT_ARG_INTS=%d", arg_ints);
        cl_kernel kernel;
        st = flashcl_get_kernel(ctx, "kv_cache.cl", "kv_append", options, &kernel);
        /* The slot list (then the table entries) goes by value, or into the
         * cache's slot buffer from its staging copy, without blocking and
         * after the last append kernel that read it: no device allocation
         * per append. */
        cl_event written = NULL;
        if (st == FLASHCL_SUCCESS && !arg_ints)
            st = flashcl_staging_upload(ctx, &c->slots, &c->slots_cap, slot_bytes, c->slots_reader, &written,
                                        "the slot list");
        if (st == FLASHCL_SUCCESS) {
            /* By value the slots argument is never read, but must be a buffer:
             * k, read-only like it, so that no restrict argument aliases a
             * written one. */
            const cl_mem slot_buf = arg_ints ? k : c->slots;
            cl_ulong u[6] = {kl.offset, kl.stride_seq, kl.stride_head, vl.offset, vl.stride_seq, vl.stride_head};
            cl_int hk = c->desc.heads_k, hd = c->desc.head_dim, np = (cl_int)pairs;
            cl_uint a = 0;
            err = clSetKernelArg(kernel, a++, sizeof(cl_mem), &k);
            err |= clSetKernelArg(kernel, a++, sizeof(cl_mem), &v);
            err |= clSetKernelArg(kernel, a++, sizeof(cl_mem), &c->k_pool);
            err |= clSetKernelArg(kernel, a++, sizeof(cl_mem), &c->v_pool);
            err |= clSetKernelArg(kernel, a++, sizeof(cl_mem), &slot_buf);
            err |= clSetKernelArg(kernel, a++, sizeof(cl_mem), &c->tables);
            for (int i = 0; i < 6; ++i)
                err |= clSetKernelArg(kernel, a++, sizeof(cl_ulong), &u[i]);
            err |= clSetKernelArg(kernel, a++, sizeof(cl_int), &hk);
            err |= clSetKernelArg(kernel, a++, sizeof(cl_int), &hd);
            err |= clSetKernelArg(kernel, a++, sizeof(cl_int), &np);
            if (c->scales)
                err |= clSetKernelArg(kernel, a++, sizeof(cl_mem), &c->scales);
            if (arg_ints)
                err |= clSetKernelArg(kernel, a++, (size_t)arg_ints * sizeof(int), by_value);
            size_t global[3] = {(size_t)hd, (size_t)hk, (size_t)total};
            /* On an out-of-order queue the kernel must come after this
             * append's page copies (a barrier: they only follow a fork),
             * after the last attention call, which may still read the table
             * entries and pages it rewrites, and after the previous append
             * (through the upload, which waits for it, or directly). */
            if (err == CL_SUCCESS && copies)
                err = clEnqueueBarrierWithWaitList(ctx->queue, 0, NULL, NULL);
            cl_event after[2], appended = NULL;
            cl_uint num_after = 0;
            if (written || c->slots_reader)
                after[num_after++] = written ? written : c->slots_reader;
            if (ctx->serving_meta_reader)
                after[num_after++] = ctx->serving_meta_reader;
            if (err == CL_SUCCESS)
                err = clEnqueueNDRangeKernel(ctx->queue, kernel, 3, NULL, global, NULL, num_after,
                                             num_after ? after : NULL, &appended);
            if (err != CL_SUCCESS) {
                st = flashcl_fail(ctx, err, "launching kv_append: %s", flashcl_status_string(err));
            } else {
                if (c->slots_reader)
                    clReleaseEvent(c->slots_reader);
                c->slots_reader = appended; /* the next append waits for it */
                if (event) {
                    clRetainEvent(appended);
                    *event = appended;
                }
            }
        }
        if (written)
            clReleaseEvent(written);
    } else if (event) {
        err = clEnqueueMarkerWithWaitList(ctx->queue, 0, NULL, event);
        st = err == CL_SUCCESS ? FLASHCL_SUCCESS : flashcl_fail(ctx, err, "enqueueing a marker");
    } else {
        st = FLASHCL_SUCCESS;
    }
    if (st != FLASHCL_SUCCESS) {
        free(plan);
        return st;
    }

    /* 3. Commit: the pages taken leave the free list, tables and lengths grow. */
    c->free_count = top;
    c->tables_used += (int)region_ints;
    for (int i = 0; i < num_seqs; ++i) {
        flashcl_kv_sequence *s = &c->seqs[seq_ids[i]];
        if (plan[i].cow_page >= 0) {
            c->refcount[plan[i].cow_old]--; /* > 0: a later sharer still holds it */
            s->pages[s->count - 1] = plan[i].cow_page;
            c->refcount[plan[i].cow_page] = 1;
        }
        for (int p = plan[i].old_pages; p < plan[i].new_pages; ++p)
            c->refcount[s->pages[p]] = 1;
        s->count = plan[i].new_pages;
        s->length += num_tokens[i];
        if (plan[i].dev_cap) {
            s->dev_off = plan[i].dev_off;
            s->dev_cap = plan[i].dev_cap;
        }
    }
    free(plan);
    return FLASHCL_SUCCESS;
}
