/* test_cache.c: the on-disk program cache: a second process-like start hits, corrupt files are ignored. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

static int failures;
static int hits, misses;

static void count(void *user, const char *line) {
    (void)user;
    if (strstr(line, "disk cache hit"))
        ++hits;
    else if (strstr(line, "disk cache miss"))
        ++misses;
}

/* A fresh context (as a new process would have), one forward of tc, checked. */
static int run_fresh(const test_case *tc, uint64_t seed) {
    hits = misses = 0;
    flashcl_context *ctx = test_context();
    int ok = run_case(ctx, tc, seed, 0);
    flashcl_context_destroy(ctx);
    return ok;
}

/* The program the cache tests start from. */
static int run_once(uint64_t seed) {
    const test_case tc = {FLASHCL_FLOAT16, 1, 2, 1, 19, 45, 24, 1, -1, -1, 0.0f, 0.0f, LAYOUT_PACKED, 1.0};
    return run_fresh(&tc, seed);
}

/* Applies fn to every *.bin file of dir; returns how many there were. */
static int for_each_bin(const char *dir, void (*fn)(const char *path)) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len > 4 && !strcmp(e->d_name + len - 4, ".bin")) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            if (fn)
                fn(path);
            ++n;
        }
    }
    if (d)
        closedir(d);
    return n;
}

/* The size of a file in bytes, -1 if it cannot be opened. */
static long file_size(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    return size;
}

static void scramble(const char *path) {
    long size = file_size(path);
    FILE *f = size < 0 ? NULL : fopen(path, "r+b");
    if (!f)
        return;
    fseek(f, size / 2, SEEK_SET);
    fputs("corrupted by test_cache", f);
    fclose(f);
}

static void delete_file(const char *path) {
    remove(path);
}

static void truncate_half(const char *path) {
    long size = file_size(path);
    if (size < 0)
        return;
    if (truncate(path, size / 2) != 0)
        perror("truncate");
}

/* A second program (other dtype and head dim: other options, other file). */
static int run_other(uint64_t seed) {
    const test_case tc = {FLASHCL_FLOAT32, 1, 1, 1, 7, 9, 8, 0, -1, -1, 0.0f, 0.0f, LAYOUT_PACKED, 1.0};
    return run_fresh(&tc, seed);
}

static uint64_t fnv1a(uint64_t h, const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; ++i)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* The whole file in memory; NULL on failure. */
static unsigned char *slurp(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = n > 0 ? malloc((size_t)n) : NULL;
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *size = (size_t)n;
    return b;
}

static int spit(const char *path, const unsigned char *b, size_t n) {
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(b, 1, n, f) == n;
    return f && fclose(f) == 0 && ok;
}

/* A header that agrees with a truncated payload: magic, key, then size and a
 * plain FNV-1a of what follows the 32 bytes (the layout before the key text
 * was stored), the binary cut in half. Such a file crashed the driver. */
static void truncate_rehash(const char *path) {
    size_t n = 0;
    unsigned char *b = slurp(path, &n);
    if (!b || n < 64) {
        free(b);
        return;
    }
    uint64_t size = (n - 32) / 2, hash = fnv1a(0xcbf29ce484222325ull, b + 32, (size_t)size);
    memcpy(b + 16, &size, 8);
    memcpy(b + 24, &hash, 8);
    spit(path, b, 32 + (size_t)size);
    free(b);
}

/* Two cache file names, for copying one over the other. */
static char bins[2][4096];
static int nbins;
static void remember(const char *path) {
    if (nbins < 2)
        snprintf(bins[nbins++], sizeof bins[0], "%s", path);
}

/* Copies `from` over `to` with the header's key rewritten to to's (the hex
 * file name): a self-consistent header naming the wrong program. */
static int copy_as(const char *from, const char *to) {
    size_t n = 0;
    unsigned char *b = slurp(from, &n);
    const char *name = strrchr(to, '/');
    uint64_t key = name ? strtoull(name + 1, NULL, 16) : 0;
    int ok = b && n > 16;
    if (ok) {
        memcpy(b + 8, &key, 8);
        ok = spit(to, b, n);
    }
    free(b);
    return ok;
}

int main(void) {
    char dir[] = "/tmp/flashcl-cache-test-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    setenv("FLASHCL_CACHE_DIR", dir, 1);
    unsetenv("FLASHCL_CACHE");
    flashcl_set_log(count, NULL);
    uint64_t seed = test_seed();

    flashcl_context *probe = test_context();
    int host = flashcl_context_is_host(probe);
    flashcl_context_destroy(probe);
    if (host) {
        printf("host context: no programs to cache, nothing to test\n");
        return 0;
    }

    expect(run_once(seed) && misses == 1 && hits == 0, "first build misses and is correct", &failures);
    expect(for_each_bin(dir, NULL) == 1, "one cache file written", &failures);
    expect(run_once(seed + 1) && hits == 1 && misses == 0, "second start hits the disk cache", &failures);

    for_each_bin(dir, scramble);
    expect(run_once(seed + 2) && hits == 0 && misses == 1, "corrupted file ignored, still correct", &failures);
    expect(run_once(seed + 3) && hits == 1, "the rebuilt binary replaced it", &failures);

    for_each_bin(dir, truncate_half);
    expect(run_once(seed + 4) && hits == 0 && misses == 1, "truncated file ignored, still correct", &failures);

    /* Header rewritten to agree with a truncated payload: not given to the
     * driver. (Before the key text was checked, this and the copy below
     * crashed or aborted inside PoCL: the test dies rather than fails.) */
    expect(run_once(seed + 20) && hits == 1, "the rebuilt binary replaced the truncated one", &failures);
    for_each_bin(dir, truncate_rehash);
    expect(run_once(seed + 21), "truncated and re-hashed file ignored, still correct", &failures);

    /* Another program's file under this one's name, its header key rewritten. */
    expect(run_once(seed + 22) && run_other(seed + 23), "two programs cached", &failures);
    nbins = 0;
    for_each_bin(dir, remember);
    expect(nbins == 2 && copy_as(bins[0], bins[1]), "one cache file copied over the other's name", &failures);
    expect(run_once(seed + 24) && run_other(seed + 25),
           "a file under another key's name is not used, both still correct", &failures);

    /* A FIFO as a cache file must not block the open (run under a timeout). */
    for_each_bin(dir, delete_file);
    expect(run_once(seed + 26), "rebuilt", &failures);
    nbins = 0;
    for_each_bin(dir, remember);
    expect(nbins == 1 && remove(bins[0]) == 0 && mkfifo(bins[0], 0600) == 0, "a FIFO in place of the cache file",
           &failures);
    alarm(120); /* a blocked open would otherwise hang the test until CTest's timeout */
    expect(run_once(seed + 27) && hits == 0, "a FIFO cache file is skipped, not opened", &failures);
    alarm(0);
    remove(bins[0]);

    setenv("FLASHCL_CACHE", "0", 1);
    for_each_bin(dir, delete_file);
    expect(run_once(seed + 5) && hits == 0 && misses == 0 && for_each_bin(dir, NULL) == 0,
           "FLASHCL_CACHE=0 neither reads nor writes", &failures);
    unsetenv("FLASHCL_CACHE");

    /* A cache directory that cannot be created: silently builds from source. */
    setenv("FLASHCL_CACHE_DIR", "/proc/flashcl-cannot-write-here", 1);
    expect(run_once(seed + 6), "unwritable cache directory still works", &failures);

    /* FLASHCL_KERNEL_DIR: sources from disk; a directory without them fails cleanly. */
    setenv("FLASHCL_CACHE", "0", 1);
    setenv("FLASHCL_KERNEL_DIR", dir, 1);
    flashcl_context *ctx = test_context();
    flashcl_attention_desc d;
    size_t elems[4];
    test_case tc = {FLASHCL_FLOAT32, 1, 1, 1, 8, 8, 8, 0, -1, -1, 0.0f, 0.0f, LAYOUT_PACKED, 1.0};
    case_desc(&tc, &d, elems);
    float buf[64] = {0};
    flashcl_status st = flashcl_attention_forward_host(ctx, &d, buf, buf, buf, buf, NULL);
    expect(st == FLASHCL_ERROR_BUILD_FAILED && strstr(flashcl_last_error(ctx), "FLASHCL_KERNEL_DIR"),
           "FLASHCL_KERNEL_DIR without sources -> build failed with a message", &failures);
    flashcl_context_destroy(ctx);
#ifdef FLASHCL_SOURCE_CL_DIR
    setenv("FLASHCL_KERNEL_DIR", FLASHCL_SOURCE_CL_DIR, 1);
    expect(run_once(seed + 7), "FLASHCL_KERNEL_DIR=cl/ builds from disk", &failures);
#endif
    unsetenv("FLASHCL_KERNEL_DIR");
    rmdir(dir);
    printf("%d failures\n", failures);
    return failures ? 1 : 0;
}
