/* test_errors.c: every invalid argument gets its error code and message, and outputs stay untouched. */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "harness.h"

static int failures;

enum { B = 2, H = 4, HK = 2, N = 24, D = 32 };
#define ELEMS ((size_t)B * N * H * D)
#define LSE_ELEMS ((size_t)B * H * N)

typedef struct fixture {
    flashcl_context *ctx;
    cl_mem q, k, v, out, lse, small;
    float pattern[ELEMS];
} fixture;

static cl_mem make(flashcl_context *ctx, size_t bytes, const void *init) {
    cl_int err;
    cl_mem m = clCreateBuffer(flashcl_context_cl_context(ctx), CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                              bytes, (void *)init, &err);
    if (!m) {
        fprintf(stderr, "clCreateBuffer: %d\n", err);
        exit(1);
    }
    return m;
}

static flashcl_attention_desc valid_desc(void) {
    flashcl_attention_desc d = test_attention_desc(FLASHCL_FLOAT32, B, H, HK, 0, 0, 0);
    d.seqlen_q = d.seqlen_k = N;
    d.head_dim = D;
    d.window_left = d.window_right = -1;
    return d;
}

/* The output buffer must still hold the pattern written at the start. */
static int out_untouched(fixture *f) {
    static float back[ELEMS];
    clEnqueueReadBuffer(flashcl_context_cl_queue(f->ctx), f->out, CL_TRUE, 0, sizeof back, back, 0,
                        NULL, NULL);
    return memcmp(back, f->pattern, sizeof back) == 0;
}

/* One bad call: the expected status, a message, and untouched outputs. */
static void bad(fixture *f, const char *what, flashcl_status want, flashcl_status got) {
    const char *msg = flashcl_last_error(f->ctx);
    int ok = got == want && msg && msg[0] && out_untouched(f);
    char line[160];
    snprintf(line, sizeof line, "%s -> %s", what, flashcl_status_string(want));
    expect(ok, line, &failures);
    if (!ok)
        printf("    got %d (%s), message '%s'\n", got, flashcl_status_string(got), msg);
}

static flashcl_status fwd(fixture *f, const flashcl_attention_desc *d) {
    return flashcl_attention_forward(f->ctx, d, f->q, f->k, f->v, f->out, f->lse, 0, NULL);
}

/* The platform a context's device is on. */
static cl_platform_id platform_of(flashcl_context *ctx) {
    cl_platform_id platform = NULL;
    clGetDeviceInfo(flashcl_context_cl_device(ctx), CL_DEVICE_PLATFORM, sizeof platform, &platform,
                    NULL);
    return platform;
}

/* 1 where spec makes a context on a device of `platform` (and, where device is not NULL, on it). */
static int spec_picks(const char *spec, cl_platform_id platform, cl_device_id device) {
    flashcl_context *c = NULL;
    if (flashcl_context_create(&c, spec) != FLASHCL_SUCCESS)
        return 0;
    const int ok = !flashcl_context_is_host(c) && platform_of(c) == platform &&
                   (!device || flashcl_context_cl_device(c) == device);
    flashcl_context_destroy(c);
    return ok;
}

/* 1 where spec fails with FLASHCL_ERROR_NO_DEVICE and a message holding why. */
static int spec_refused(const char *spec, const char *why) {
    flashcl_context *c = NULL;
    const flashcl_status st = flashcl_context_create(&c, spec);
    const int ok = st == FLASHCL_ERROR_NO_DEVICE && !c && strstr(flashcl_last_error(NULL), why);
    if (!ok)
        printf("    '%s': %s, '%s'\n", spec, flashcl_status_string(st), flashcl_last_error(NULL));
    flashcl_context_destroy(c);
    return ok;
}

/* 1 where a platform's name, vendor or version holds word (as the library matches it). */
static int platform_holds(cl_platform_id platform, const char *word) {
    static const cl_platform_info fields[] = {CL_PLATFORM_NAME, CL_PLATFORM_VENDOR,
                                              CL_PLATFORM_VERSION};
    char low[256];
    size_t n = 0;
    for (; word[n] && n < sizeof low - 1; ++n)
        low[n] = (char)tolower((unsigned char)word[n]);
    low[n] = '\0';
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; ++i) {
        size_t size = 0;
        if (clGetPlatformInfo(platform, fields[i], 0, NULL, &size) != CL_SUCCESS || !size)
            continue;
        char *text = test_xmalloc(size + 1);
        text[0] = '\0';
        clGetPlatformInfo(platform, fields[i], size, text, NULL);
        text[size] = '\0';
        for (char *t = text; *t; ++t)
            *t = (char)tolower((unsigned char)*t);
        const int holds = strstr(text, low) != NULL;
        free(text);
        if (holds)
            return 1;
    }
    return 0;
}

/* A word in a later platform's name that an earlier platform's device name holds (PoCL's
 * "pthread-...-Intel(R) Xeon(R)" before "Intel(R) OpenCL"), when the machine has such a pair:
 * that word must pick the platform it names, not the device. */
static void word_names_platform_first(const cl_platform_id *plats, cl_uint nplat) {
    for (cl_uint b = 1; b < nplat; ++b) {
        char name[256] = "";
        clGetPlatformInfo(plats[b], CL_PLATFORM_NAME, sizeof name - 1, name, NULL);
        for (char *save = NULL, *w = strtok_r(name, " ,", &save); w;
             w = strtok_r(NULL, " ,", &save)) {
            /* the library reads these as device types, and a ':' as PLATFORM:DEVICE */
            if (strlen(w) < 3 || strchr(w, ':') || !strcasecmp(w, "cpu") || !strcasecmp(w, "gpu") ||
                !strcasecmp(w, "accelerator") || !strcasecmp(w, "host"))
                continue;
            int earlier_platform = 0, earlier_device = 0;
            for (cl_uint a = 0; a < b; ++a) {
                earlier_platform |= platform_holds(plats[a], w);
                cl_device_id devs[64];
                cl_uint ndev = 0;
                clGetDeviceIDs(plats[a], CL_DEVICE_TYPE_ALL, 64, devs, &ndev);
                for (cl_uint d = 0; d < ndev && d < 64; ++d) {
                    char dev[256] = "";
                    clGetDeviceInfo(devs[d], CL_DEVICE_NAME, sizeof dev - 1, dev, NULL);
                    earlier_device |= strstr(dev, w) != NULL;
                }
            }
            cl_device_id any;
            cl_uint nb = 0;
            if (earlier_platform || !earlier_device ||
                clGetDeviceIDs(plats[b], CL_DEVICE_TYPE_ALL, 1, &any, &nb) != CL_SUCCESS || !nb)
                continue;
            char what[400];
            snprintf(what, sizeof what,
                     "'%s' picks the platform it names, not an earlier platform's device named so",
                     w);
            expect(spec_picks(w, plats[b], NULL), what, &failures);
            return;
        }
    }
    printf("no word here names one platform and an earlier platform's device: that order is not "
           "checked on this machine\n");
}

/* Device specs naming a platform, "PLATFORM:DEVICE" by index or by word, on the test's device. */
static void device_specs(flashcl_context *ctx) {
    cl_platform_id plats[32], platform = platform_of(ctx);
    cl_device_id device = flashcl_context_cl_device(ctx), devs[64];
    cl_uint nplat = 0, ndev = 0;
    char name[256] = "", dev_name[256] = "", spec[600];
    clGetPlatformIDs(32, plats, &nplat);
    nplat = nplat < 32 ? nplat : 32;
    cl_uint p = 0, d = 0;
    while (p < nplat && plats[p] != platform)
        ++p;
    clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 64, devs, &ndev);
    while (d < ndev && d < 64 && devs[d] != device)
        ++d;
    clGetPlatformInfo(platform, CL_PLATFORM_NAME, sizeof name - 1, name, NULL);
    clGetDeviceInfo(device, CL_DEVICE_NAME, sizeof dev_name - 1, dev_name, NULL);
    snprintf(spec, sizeof spec, "%u:%u", p, d);
    expect(spec_picks(spec, platform, device), "device spec \"P:D\" by indices", &failures);
    snprintf(spec, sizeof spec, "%u:", p);
    expect(spec_picks(spec, platform, NULL), "device spec \"P:\": a device of platform P",
           &failures);
    snprintf(spec, sizeof spec, "%u:", nplat);
    expect(spec_refused(spec, "no platform"), "a platform index past the platforms -> no device",
           &failures);
    expect(spec_refused("no-such-platform-anywhere:",
                        "no OpenCL platform named 'no-such-platform-anywhere'"),
           "a platform named by nothing -> no device, and says so", &failures);
    word_names_platform_first(plats, nplat);
    /* By the platform's name: where no earlier platform's name, vendor or version holds it
     * ("Intel(R) OpenCL" before "Intel(R) OpenCL Graphics" would take that one). */
    int first = !strchr(name, ':');
    for (cl_uint a = 0; a < p && first; ++a)
        first = !platform_holds(plats[a], name);
    if (!first) {
        printf("the platform's name '%s' is not one platform's first: its word specs are not "
               "checked\n",
               name);
        return;
    }
    snprintf(spec, sizeof spec, "%s:%u", name, d);
    expect(spec_picks(spec, platform, device),
           "device spec \"NAME:D\": the platform by name, the device by index", &failures);
    /* the device by its name, where no earlier device of the platform holds it (twin GPUs) */
    int unique = 1;
    for (cl_uint e = 0; e < d; ++e) {
        char other[256] = "";
        clGetDeviceInfo(devs[e], CL_DEVICE_NAME, sizeof other - 1, other, NULL);
        unique &= strstr(other, dev_name) == NULL;
    }
    snprintf(spec, sizeof spec, "%s:%s", name, dev_name);
    expect(spec_picks(spec, platform, unique ? device : NULL),
           "device spec \"NAME:DEVICE\": both by name", &failures);
    snprintf(spec, sizeof spec, "%s:", name);
    expect(spec_picks(spec, platform, NULL),
           "device spec \"NAME:\": a device of the named platform", &failures);
    expect(spec_picks(name, platform, NULL),
           "a word naming a platform picks that platform's device", &failures);
    snprintf(spec, sizeof spec, "%s:no-such-device-anywhere", name);
    expect(spec_refused(spec, "no device 'no-such-device-anywhere'"),
           "a device the named platform lacks -> no device, and says so", &failures);
    snprintf(spec, sizeof spec, "%s:%u", name, ndev);
    expect(spec_refused(spec, "no device"), "a device index past the platform's -> no device",
           &failures);
}

int main(void) {
    static fixture f;
    f.ctx = test_context();
    for (size_t i = 0; i < ELEMS; ++i)
        f.pattern[i] = (float)i * 0.25f;
    f.q = make(f.ctx, sizeof f.pattern, f.pattern);
    f.k = make(f.ctx, sizeof f.pattern, f.pattern);
    f.v = make(f.ctx, sizeof f.pattern, f.pattern);
    f.out = make(f.ctx, sizeof f.pattern, f.pattern);
    f.lse = make(f.ctx, LSE_ELEMS * sizeof(float), f.pattern);
    f.small = make(f.ctx, 64, f.pattern);

    flashcl_attention_desc d = valid_desc();
    expect(fwd(&f, &d) == FLASHCL_SUCCESS && clFinish(flashcl_context_cl_queue(f.ctx)) == CL_SUCCESS,
           "a valid call succeeds", &failures);
    /* Put the pattern back: every call below must leave it alone. */
    clEnqueueWriteBuffer(flashcl_context_cl_queue(f.ctx), f.out, CL_TRUE, 0, sizeof f.pattern,
                         f.pattern, 0, NULL, NULL);

    bad(&f, "NULL desc", FLASHCL_ERROR_INVALID_ARGUMENT,
        flashcl_attention_forward(f.ctx, NULL, f.q, f.k, f.v, f.out, NULL, 0, NULL));
    bad(&f, "NULL q", FLASHCL_ERROR_INVALID_ARGUMENT,
        flashcl_attention_forward(f.ctx, &d, NULL, f.k, f.v, f.out, NULL, 0, NULL));
    bad(&f, "NULL k", FLASHCL_ERROR_INVALID_ARGUMENT,
        flashcl_attention_forward(f.ctx, &d, f.q, NULL, f.v, f.out, NULL, 0, NULL));
    bad(&f, "NULL v", FLASHCL_ERROR_INVALID_ARGUMENT,
        flashcl_attention_forward(f.ctx, &d, f.q, f.k, NULL, f.out, NULL, 0, NULL));
    bad(&f, "NULL out", FLASHCL_ERROR_INVALID_ARGUMENT,
        flashcl_attention_forward(f.ctx, &d, f.q, f.k, f.v, NULL, NULL, 0, NULL));

    struct {
        const char *what;
        int field, value;
        flashcl_status want;
    } shapes[] = {
        {"batch 0", 0, 0, FLASHCL_ERROR_INVALID_SHAPE},
        {"heads_q -1", 1, -1, FLASHCL_ERROR_INVALID_SHAPE},
        {"heads_k 0", 2, 0, FLASHCL_ERROR_INVALID_SHAPE},
        {"seqlen_q 0", 3, 0, FLASHCL_ERROR_INVALID_SHAPE},
        {"seqlen_k -5", 4, -5, FLASHCL_ERROR_INVALID_SHAPE},
        {"head_dim 0", 5, 0, FLASHCL_ERROR_INVALID_SHAPE},
        {"head_dim 257", 5, 257, FLASHCL_ERROR_INVALID_SHAPE},
        {"heads_q 4 over heads_k 3", 2, 3, FLASHCL_ERROR_INVALID_SHAPE},
        {"unknown dtype 7", 6, 7, FLASHCL_ERROR_INVALID_ARGUMENT},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; ++i) {
        flashcl_attention_desc x = valid_desc();
        int *fields[] = {&x.batch, &x.heads_q, &x.heads_k, &x.seqlen_q, &x.seqlen_k, &x.head_dim};
        if (shapes[i].field < 6)
            *fields[shapes[i].field] = shapes[i].value;
        else
            x.dtype = (flashcl_dtype)shapes[i].value;
        bad(&f, shapes[i].what, shapes[i].want, fwd(&f, &x));
    }

    flashcl_attention_desc x = valid_desc();
    x.scale = -1.0f;
    bad(&f, "negative scale", FLASHCL_ERROR_INVALID_ARGUMENT, fwd(&f, &x));
    x = valid_desc();
    x.softcap = strtof("nan", NULL);
    bad(&f, "NaN softcap", FLASHCL_ERROR_INVALID_ARGUMENT, fwd(&f, &x));

    /* Layouts that overrun a buffer. */
    x = valid_desc();
    x.seqlen_q = N + 1;
    bad(&f, "seqlen_q larger than the buffers", FLASHCL_ERROR_OUT_OF_BOUNDS, fwd(&f, &x));
    x = valid_desc();
    x.k.offset = ELEMS / 2 + 1; /* k needs half the buffer (HK = H/2): one element too far */
    x.k.stride_head = D;
    x.k.stride_seq = (size_t)HK * D;
    x.k.stride_batch = (size_t)N * HK * D;
    bad(&f, "k offset one past a full buffer", FLASHCL_ERROR_OUT_OF_BOUNDS, fwd(&f, &x));
    x = valid_desc();
    x.v.stride_seq = (size_t)1 << 62;
    x.v.stride_head = D;
    x.v.stride_batch = 1;
    bad(&f, "stride that overflows size_t", FLASHCL_ERROR_OUT_OF_BOUNDS, fwd(&f, &x));
    x = valid_desc();
    bad(&f, "out buffer too small", FLASHCL_ERROR_OUT_OF_BOUNDS,
        flashcl_attention_forward(f.ctx, &x, f.q, f.k, f.v, f.small, NULL, 0, NULL));
    bad(&f, "lse buffer too small", FLASHCL_ERROR_OUT_OF_BOUNDS,
        flashcl_attention_forward(f.ctx, &x, f.q, f.k, f.v, f.out, f.small, 0, NULL));
    bad(&f, "lse offset past the end", FLASHCL_ERROR_OUT_OF_BOUNDS,
        flashcl_attention_forward(f.ctx, &x, f.q, f.k, f.v, f.out, f.lse, 1, NULL));
    x.dtype = FLASHCL_FLOAT16; /* half the bytes: fits; bf16 likewise. float64 does not exist */
    expect(fwd(&f, &x) == FLASHCL_SUCCESS, "float16 view of the same buffers is valid", &failures);
    clFinish(flashcl_context_cl_queue(f.ctx));
    clEnqueueWriteBuffer(flashcl_context_cl_queue(f.ctx), f.out, CL_TRUE, 0, sizeof f.pattern,
                         f.pattern, 0, NULL, NULL);

    /* Parameters from the environment: malformed, unknown, or too big. */
    const char *bad_params[] = {"BLOCK_M", "BLOCK_M=", "BLOCK_M=abc", "BLOCK_M=16,", "FOO=3",
                                "BLOCK_M=0", "BLOCK_M=4096,TPR=64", "BLOCK_N=24,TPR=16"};
    flashcl_params p;
    flashcl_status st = flashcl_attention_params(f.ctx, &d, &p);
    int portable = st == FLASHCL_SUCCESS && p.threads_per_row > 0;
    for (size_t i = 0; portable && i < sizeof bad_params / sizeof bad_params[0]; ++i) {
        setenv("FLASHCL_PARAMS", bad_params[i], 1);
        char what[96];
        snprintf(what, sizeof what, "FLASHCL_PARAMS=\"%s\"", bad_params[i]);
        /* The first six do not parse (or a value is out of 1..4096): a
         * malformed variable, not parameters that do not fit. */
        bad(&f, what, i < 6 ? FLASHCL_ERROR_MALFORMED_ENV : FLASHCL_ERROR_INVALID_PARAMS, fwd(&f, &d));
        if (i < 6)
            expect(strstr(flashcl_last_error(f.ctx), "FLASHCL_PARAMS") != NULL, "... and the message names it",
                   &failures);
    }
    unsetenv("FLASHCL_PARAMS");
    /* Build options too long for the forward's option string: refused, not cut short (a cut
     * define could disagree with what the host sized the launch for). */
    {
        char longopts[700];
        size_t n = 0;
        while (n + 8 < sizeof longopts)
            n += (size_t)snprintf(longopts + n, sizeof longopts - n, "-DX%02zu=1 ", n % 100);
        setenv("FLASHCL_BUILD_OPTIONS", longopts, 1);
        const flashcl_status got = fwd(&f, &d);
        unsetenv("FLASHCL_BUILD_OPTIONS");
        bad(&f, "FLASHCL_BUILD_OPTIONS of about 700 characters", FLASHCL_ERROR_INVALID_PARAMS, got);
        expect(strstr(flashcl_last_error(f.ctx), "FLASHCL_BUILD_OPTIONS") != NULL, "... and the message names it",
               &failures);
        if (!strstr(flashcl_last_error(f.ctx), "FLASHCL_BUILD_OPTIONS"))
            printf("    message: '%s'\n", flashcl_last_error(f.ctx));
    }
    /* The tensor-core variants take no 8-row blocks: the portable kernel there. */
    const char *variant_was = getenv("FLASHCL_VARIANT");
    char variant_copy[32] = "";
    if (variant_was)
        snprintf(variant_copy, sizeof variant_copy, "%s", variant_was);
    if (st == FLASHCL_SUCCESS && !strncmp(p.variant, "nv-", 3))
        setenv("FLASHCL_VARIANT", "portable", 1);
    /* 4 rows: the portable kernel's 8 work-items a row make 32, rusticl's most */
    setenv("FLASHCL_PARAMS", "BLOCK_M=4,BLOCK_N=16", 1);
    st = flashcl_attention_params(f.ctx, &d, &p);
    expect(st == FLASHCL_SUCCESS && p.block_m == 4 && p.block_n == 16 && !strcmp(p.source, "FLASHCL_PARAMS"),
           "FLASHCL_PARAMS override is used", &failures);
    if (st != FLASHCL_SUCCESS)
        printf("    %s\n", flashcl_last_error(f.ctx));
    unsetenv("FLASHCL_PARAMS");
    if (variant_was)
        setenv("FLASHCL_VARIANT", variant_copy, 1);
    else
        unsetenv("FLASHCL_VARIANT");

    /* Contexts and handles. */
    flashcl_context *none = NULL;
    expect(flashcl_context_create(&none, "no-such-device-anywhere") == FLASHCL_ERROR_NO_DEVICE && !none,
           "unknown device spec -> no device", &failures);
    /* A failed creation leaves no context: its message is the thread's, under NULL. */
    expect(strstr(flashcl_last_error(NULL), "no-such-device-anywhere") != NULL,
           "a failed create says why through flashcl_last_error(NULL)", &failures);
    setenv("FLASHCL_DEVICE", "nvidiaa-nowhere", 1);
    expect(flashcl_context_create(&none, NULL) == FLASHCL_ERROR_NO_DEVICE && !none &&
               strstr(flashcl_last_error(NULL), "nvidiaa-nowhere") &&
               strstr(flashcl_last_error(NULL), "FLASHCL_DEVICE"),
           "a FLASHCL_DEVICE that matches nothing is named with where it came from", &failures);
    unsetenv("FLASHCL_DEVICE");
    expect(flashcl_context_create(&none, "99:0") == FLASHCL_ERROR_NO_DEVICE && !none,
           "platform index out of range -> no device", &failures);
    if (!flashcl_context_is_host(f.ctx))
        device_specs(f.ctx);
    expect(flashcl_context_create(NULL, NULL) == FLASHCL_ERROR_INVALID_ARGUMENT, "NULL out pointer",
           &failures);
    expect(flashcl_attention_forward(NULL, &d, f.q, f.k, f.v, f.out, NULL, 0, NULL) ==
               FLASHCL_ERROR_INVALID_ARGUMENT,
           "NULL context", &failures);
    expect(flashcl_context_adopt(&none, flashcl_context_cl_context(f.ctx), flashcl_context_cl_device(f.ctx),
                                 NULL) == FLASHCL_ERROR_INVALID_ARGUMENT &&
               strstr(flashcl_last_error(NULL), "queue is NULL"),
           "adopt without a queue", &failures);
    if (!flashcl_context_is_host(f.ctx)) {
        /* A queue of another OpenCL context than the one passed. */
        cl_int err;
        cl_device_id dev = flashcl_context_cl_device(f.ctx);
        cl_context other = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
        expect(other && flashcl_context_adopt(&none, other, dev, flashcl_context_cl_queue(f.ctx)) ==
                            FLASHCL_ERROR_INVALID_ARGUMENT &&
                   !none && strstr(flashcl_last_error(NULL), "belongs to another context"),
               "adopt with a queue of another context says so", &failures);
        if (other)
            clReleaseContext(other);
    }
    flashcl_context_destroy(NULL);
    expect(flashcl_last_error(NULL)[0] != '\0' && strcmp(flashcl_status_string(-2099), "unknown status") == 0 &&
               strcmp(flashcl_status_string(CL_OUT_OF_RESOURCES), "CL_OUT_OF_RESOURCES") == 0,
           "NULL-safe accessors and status strings", &failures);

    /* Adopting the application's own objects works like a created context. */
    flashcl_context *adopted = NULL;
    expect(flashcl_context_adopt(&adopted, flashcl_context_cl_context(f.ctx), flashcl_context_cl_device(f.ctx),
                                 flashcl_context_cl_queue(f.ctx)) == FLASHCL_SUCCESS &&
               flashcl_attention_forward(adopted, &d, f.q, f.k, f.v, f.out, NULL, 0, NULL) == FLASHCL_SUCCESS,
           "adopted context runs", &failures);
    clFinish(flashcl_context_cl_queue(f.ctx));
    flashcl_context_destroy(adopted);

    /* A host context refuses cl_mem buffers with its own code. */
    flashcl_context *host = NULL;
    expect(flashcl_context_create(&host, "host") == FLASHCL_SUCCESS && flashcl_context_is_host(host) &&
               flashcl_attention_forward(host, &d, f.q, f.k, f.v, f.out, NULL, 0, NULL) ==
                   FLASHCL_ERROR_UNSUPPORTED &&
               flashcl_last_error(host)[0],
           "host context with cl_mem -> unsupported", &failures);
    expect(flashcl_attention_forward_host(host, &d, NULL, f.pattern, f.pattern, f.pattern, NULL) ==
               FLASHCL_ERROR_INVALID_ARGUMENT,
           "host API with a NULL pointer", &failures);
    flashcl_context_destroy(host);

    cl_mem all[] = {f.q, f.k, f.v, f.out, f.lse, f.small};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
        clReleaseMemObject(all[i]);
    flashcl_context_destroy(f.ctx);
    printf("%d failures\n", failures);
    return failures ? 1 : 0;
}
