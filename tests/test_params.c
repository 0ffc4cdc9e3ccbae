/* test_params.c: the forward's parameter database: its lookup order, the tuning file (good, bad, huge,
 * fuzzed), overrides, the FP8 wgmma choice, the PTX rewrites of src/program.c. test_params_tables.c
 * has the backward's and decode's tables and the tuning file's entries for them. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "params_common.h"

static int failures;

/* ---- the parser on its own ------------------------------------------------------------ */

static const char good_doc[] =
    "{\"flashcl_tuning\": 1, \"entries\": [\n"
    "  {\"device\": \"dev\", \"variant\": \"cpu\", \"dtype\": \"f16\", \"head_dim_min\": 1,"
    " \"head_dim_max\": 64, \"phase\": \"prefill\", \"causal\": false, \"block_m\": 16,"
    " \"block_n\": 32, \"comment\": \"caf\\u00e9 \\ud83d\\ude00\", \"measured\": {\"ms\": [1.5e0, -2]}},\n"
    "  {\"device\": \"dev\", \"variant\": \"future-kernel\", \"dtype\": \"any\", \"block_m\": 1,"
    " \"block_n\": 1},\n"
    "  {\"device\": \"dev\", \"driver\": \"9\", \"variant\": \"portable\", \"dtype\": \"any\","
    " \"causal\": null, \"block_m\": 8, \"block_n\": 16, \"threads_per_row\": 4}\n"
    "], \"serving\": [\n"
    "  {\"device\": \"dev\", \"kernel\": \"decode\", \"max_rows\": 4, \"work_group_size\": 128,"
    " \"unroll\": 2, \"stages\": 3, \"wgs_per_cu\": 8, \"min_split_keys\": 256, \"comment\": \"c\"},\n"
    "  {\"device\": \"dev\", \"driver\": \"9\", \"kernel\": \"tiled\", \"wgs_per_cu\": 2,"
    " \"min_split_keys\": 64, \"future\": [1]}\n"
    "], \"backward\": [\n"
    "  {\"device\": \"dev\", \"head_dim_max\": 128, \"block_m\": 16, \"block_n\": 16,"
    " \"work_group_size\": 128}\n"
    "]}\n";

static int parses(const char *text, size_t len, size_t *count, char *err, size_t n) {
    return parses2(text, len, count, NULL, err, n);
}

static void test_parser(void) {
    char err[256];
    size_t count = 0, other = 0;
    expect(parses2(good_doc, strlen(good_doc), &count, &other, err, sizeof err) && count == 2 && other == 3,
           "valid file: 2 entries read, unknown variant skipped, unknown keys ignored; 2 serving, 1 backward",
           &failures);

    static const struct {
        const char *text, *what;
    } bad[] = {
        {"", "empty file"},
        {"[]", "top level not an object"},
        {"{\"entries\": []}", "no version"},
        {"{\"flashcl_tuning\": 2, \"entries\": []}", "future version"},
        {"{\"flashcl_tuning\": 1}", "no entries"},
        {"{\"flashcl_tuning\": 1, \"entries\": {}}", "entries not an array"},
        {"{\"flashcl_tuning\": 1, \"entries\": []} x", "text after the document"},
        {"{\"flashcl_tuning\": 1, \"flashcl_tuning\": 1, \"entries\": []}", "duplicate key"},
        {"{\"flashcl_tuning\": 1, \"entries\": [1]}", "entry not an object"},
        {"{\"flashcl_tuning\": 1, \"entries\": [{\"variant\": \"cpu\", \"dtype\": \"f16\", "
         "\"block_m\": 1, \"block_n\": 8}]}", "missing device"},
        {"{\"flashcl_tuning\": 1, \"entries\": [{\"device\": 7, \"variant\": \"cpu\", "
         "\"dtype\": \"f16\", \"block_m\": 1, \"block_n\": 8}]}", "device is a number"},
        {"{\"flashcl_tuning\": 1, \"entries\": [{\"device\": \"d\", \"variant\": \"cpu\", "
         "\"dtype\": \"f16\", \"block_m\": \"16\", \"block_n\": 8}]}", "block_m is a string"},
        {"{\"flashcl_tuning\": 1, \"entries\": [{\"device\": \"d\", \"variant\": \"cpu\", "
         "\"dtype\": \"f16\", \"block_m\": 16.5, \"block_n\": 8}]}", "block_m not an integer"},
        {"{\"flashcl_tuning\": 1, \"entries\": [{\"device\": \"d\", \"variant\": \"cpu\", "
         "\"dtype\": \"f16\", \"block_m\": 0, \"block_n\": 8}]}", "block_m 0"},
        {"{\"flashcl_tuning\": 1, \"entries\": [{\"device\": \"d\", \"variant\": \"cpu\", "
         "\"dtype\": \"f16\", \"block_m\": 1e300, \"block_n\": 8}]}", "block_m 1e300"},
        {"{\"flashcl_tuning\": 1, \"entries\": [{\"device\": \"d\", \"variant\": \"cpu\", "
         "\"dtype\": \"f64\", \"block_m\": 16, \"block_n\": 8}]}", "unknown dtype"},
        {"{\"flashcl_tuning\": 1, \"entries\": [{\"device\": \"d\", \"variant\": \"cpu\", "
         "\"dtype\": \"f16\", \"causal\": 1, \"block_m\": 16, \"block_n\": 8}]}", "causal is 1"},
        {"{\"flashcl_tuning\": 1, \"entries\": [{\"device\": \"d\", \"variant\": \"portable\", "
         "\"dtype\": \"f16\", \"block_m\": 16, \"block_n\": 8}]}", "portable without threads_per_row"},
        {"{\"flashcl_tuning\": 1, \"entries\": [{\"device\": \"d\", \"variant\": \"cpu\", "
         "\"dtype\": \"f16\", \"head_dim_min\": 100, \"head_dim_max\": 50, \"block_m\": 16, "
         "\"block_n\": 8}]}", "empty head_dim range"},
        {"{\"flashcl_tuning\": 1, \"entries\": [{\"device\": \"a\\u0000b\"}]}", "NUL in a string"},
        {"{\"flashcl_tuning\": 1, \"entries\": [{\"device\": \"\\ud800\"}]}", "lone surrogate"},
        {"{\"flashcl_tuning\": 01, \"entries\": []}", "leading zero"},
        {"{\"flashcl_tuning\": 1, \"entries\": [],}", "trailing comma"},
        {"{'flashcl_tuning': 1, 'entries': []}", "single quotes"},
        {"{\"flashcl_tuning\": 1, \"entries\": [\"\t\"]}", "raw tab in a string"},
        /* The serving and backward arrays: as strict as the forward entries. */
#define SRV(fields) "{\"flashcl_tuning\": 1, \"entries\": [], \"serving\": [{\"device\": \"d\", " fields "}]}"
#define BWD(fields) "{\"flashcl_tuning\": 1, \"entries\": [], \"backward\": [{\"device\": \"d\", " fields "}]}"
        {"{\"flashcl_tuning\": 1, \"entries\": [], \"serving\": {}}", "serving not an array"},
        {"{\"flashcl_tuning\": 1, \"entries\": [], \"backward\": null}", "backward not an array"},
        {BWD("\"block_m\": 4, \"block_n\": 8, \"work_group_size\": 16, \"max_registers\": 8"), "max_registers 8"},
        {BWD("\"block_m\": 4, \"block_n\": 8, \"work_group_size\": 16, \"max_registers\": 256"), "max_registers 256"},
        {BWD("\"block_m\": 4, \"block_n\": 8, \"work_group_size\": 16, \"own_regs\": 2"), "own_regs 2"},
        {BWD("\"block_m\": 4, \"block_n\": 8, \"work_group_size\": 16, \"variant\": \"nv-mma\", \"own_regs\": 1"),
         "own_regs on nv-mma"},
        {"{\"flashcl_tuning\": 1, \"entries\": [], \"serving\": [7]}", "serving entry not an object"},
        {SRV("\"kernel\": \"fast\", \"wgs_per_cu\": 2, \"min_split_keys\": 64"), "unknown serving kernel"},
        {SRV("\"kernel\": 1, \"wgs_per_cu\": 2, \"min_split_keys\": 64"), "serving kernel a number"},
        {SRV("\"wgs_per_cu\": 2, \"min_split_keys\": 64"), "serving entry without a kernel"},
        {"{\"flashcl_tuning\": 1, \"entries\": [], \"serving\": [{\"kernel\": \"tiled\", \"wgs_per_cu\": 2, "
         "\"min_split_keys\": 64}]}", "serving entry without a device"},
        {SRV("\"kernel\": \"tiled\", \"min_split_keys\": 64"), "serving entry without wgs_per_cu"},
        {SRV("\"kernel\": \"tiled\", \"wgs_per_cu\": \"2\", \"min_split_keys\": 64"), "wgs_per_cu a string"},
        {SRV("\"kernel\": \"tiled\", \"wgs_per_cu\": 0, \"min_split_keys\": 64"), "wgs_per_cu 0"},
        {SRV("\"kernel\": \"tiled\", \"wgs_per_cu\": 2, \"min_split_keys\": 2097152"), "min_split_keys 2^21"},
        {SRV("\"kernel\": \"decode\", \"work_group_size\": 128, \"stages\": 2, \"wgs_per_cu\": 2, "
             "\"min_split_keys\": 64"), "decode entry without unroll"},
        {SRV("\"kernel\": \"decode\", \"work_group_size\": 128, \"unroll\": 2, \"stages\": 2, \"max_rows\": 16, "
             "\"wgs_per_cu\": 2, \"min_split_keys\": 64"), "decode entry with max_rows 16"},
        {SRV("\"kernel\": \"mma\", \"stages\": 1, \"wgs_per_cu\": 2, \"min_split_keys\": 64"), "mma stages 1"},
        {SRV("\"kernel\": \"tiled\", \"unroll\": 99, \"wgs_per_cu\": 2, \"min_split_keys\": 64"),
         "tiled entry with an unroll out of range"},
        {SRV("\"kernel\": \"tiled\", \"wgs_per_cu\": 2, \"min_split_keys\": 64, \"comment\": 5"),
         "serving comment not a string"},
        {BWD("\"block_m\": \"16\", \"block_n\": 16, \"work_group_size\": 128"), "backward block_m a string"},
        {BWD("\"block_m\": 2048, \"block_n\": 16, \"work_group_size\": 128"), "backward block_m 2048"},
        {BWD("\"block_m\": 16, \"block_n\": 16"), "backward entry without work_group_size"},
        {BWD("\"head_dim_min\": 129, \"head_dim_max\": 128, \"block_m\": 16, \"block_n\": 16, "
             "\"work_group_size\": 128"), "backward head_dim range empty"},
        {BWD("\"driver\": false, \"block_m\": 16, \"block_n\": 16, \"work_group_size\": 128"),
         "backward driver not a string"},
#undef SRV
#undef BWD
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        char what[120];
        err[0] = '\0';
        int ok = !parses(bad[i].text, strlen(bad[i].text), NULL, err, sizeof err) && err[0];
        snprintf(what, sizeof what, "rejected: %s", bad[i].what);
        expect(ok, what, &failures);
        if (!ok || getenv("VERBOSE"))
            printf("    message: %s\n", err);
    }

    /* Every truncation of the valid file is rejected with a message. */
    size_t len = strlen(good_doc), rejected = 0;
    for (size_t n = 0; n < len; ++n) {
        /* The trailing newline is whitespace: cutting only it still parses. */
        int ok = parses(good_doc, n, NULL, err, sizeof err);
        rejected += !ok || n == len - 1;
    }
    expect(rejected == len, "every truncation of a valid file is rejected", &failures);

    /* Nesting deeper than the limit: an error, not a stack overflow. */
    size_t deep = 100000;
    char *nest = malloc(deep * 2 + 64);
    if (!nest)
        exit(1);
    memset(nest, '[', deep);
    memset(nest + deep, ']', deep);
    expect(!parses(nest, deep * 2, NULL, err, sizeof err) && strstr(err, "deep"),
           "100000 nested arrays rejected as too deep", &failures);
    free(nest);

    /* Fuzz: random byte edits of the valid file never crash (ASan builds check
     * the memory side); whatever parses must still have sane entries. */
    flashcl_ref_rng rng;
    flashcl_ref_rng_seed(&rng, test_seed());
    char buf[sizeof good_doc];
    int sane = 1;
    for (int it = 0; it < 4000; ++it) {
        memcpy(buf, good_doc, len);
        int edits = 1 + (int)(flashcl_ref_rng_next(&rng) % 4);
        for (int e = 0; e < edits; ++e) {
            size_t at = (size_t)(flashcl_ref_rng_next(&rng) % len);
            static const char pool[] = "{}[]\",:0123456789-+.eE \\utfn\x01\xff";
            buf[at] = pool[flashcl_ref_rng_next(&rng) % (sizeof pool - 1)];
        }
        flashcl_tuning_data tf;
        memset(&tf, 0, sizeof tf);
        if (flashcl_tuning_parse(buf, len, &tf, err, sizeof err) == 0) {
            for (size_t i = 0; i < tf.count; ++i)
                sane &= tf.entries[i].block_m >= 1 && tf.entries[i].block_m <= 4096 &&
                        tf.entries[i].head_dim_min <= tf.entries[i].head_dim_max && tf.entries[i].match;
            for (size_t i = 0; i < tf.num_serving; ++i)
                sane &= tf.serving[i].match && tf.serving[i].kernel >= FLASHCL_SERVING_TILED &&
                        tf.serving[i].kernel <= FLASHCL_SERVING_DECODE_MMA && tf.serving[i].stages >= 2 &&
                        tf.serving[i].stages <= 8 && tf.serving[i].wgs_per_cu >= 1 && tf.serving[i].min_split_keys >= 1;
            for (size_t i = 0; i < tf.num_backward; ++i)
                sane &= tf.backward[i].match && tf.backward[i].block_m >= 1 && tf.backward[i].block_m <= 1024 &&
                        tf.backward[i].head_dim_min <= tf.backward[i].head_dim_max;
        } else {
            sane &= err[0] != '\0';
        }
        flashcl_tuning_free(&tf);
    }
    expect(sane, "4000 fuzzed files: no crash, sane entries or a message", &failures);
}

/* ---- the file through a context ---------------------------------------------------------- */

static void test_file(void) {
    char path[300], text[4096], source[600], problem[600];
    const char *pr;
    flashcl_params p;
    const char *name = device_name();
    /* These cases expect the device-type default below the file (cpu or
     * portable). On NVIDIA sm_80+ built-in tensor-core entries sit between
     * the two, so the portable kernel is asked for there. */
    char variant_was[64] = "";
    if (getenv("FLASHCL_VARIANT"))
        snprintf(variant_was, sizeof variant_was, "%s", getenv("FLASHCL_VARIANT"));
    setenv("FLASHCL_VARIANT", "portable", 1);
    flashcl_attention_desc d = desc_of(FLASHCL_FLOAT16, 100, 64, 0);
    flashcl_context *ctx = test_context();
    flashcl_params def;
    flashcl_attention_params(ctx, &d, &def);
    int cpu = !strcmp(def.variant, "cpu");
    flashcl_context_destroy(ctx);

    snprintf(path, sizeof path, "%s/missing.json", dir);
    params_with_file(path, &d, &p, source, sizeof source, &pr, problem, sizeof problem);
    expect(!strncmp(source, "default: ", 9) && !pr, "no tuning file: the type default, no problem",
           &failures);

    /* A tuned entry for this device: used, and named in the source. */
    snprintf(path, sizeof path, "%s/tuned.json", dir);
    snprintf(text, sizeof text,
             "{\"flashcl_tuning\": 1, \"entries\": [\n"
             " {\"device\": \"%s\", \"variant\": \"%s\", \"dtype\": \"f16\", \"head_dim_min\": 1,"
             " \"head_dim_max\": 64, \"block_m\": 8, \"block_n\": 16%s},\n"
             " {\"device\": \"%s\", \"driver\": \"not-this-driver\", \"variant\": \"%s\","
             " \"dtype\": \"f16\", \"causal\": true, \"block_m\": 4, \"block_n\": 8%s}]}\n",
             name, def.variant, cpu ? "" : ", \"threads_per_row\": 4", name, def.variant,
             cpu ? "" : ", \"threads_per_row\": 4");
    write_file(path, text);
    char want[400];
    snprintf(want, sizeof want, "tuned: %s", path);
    params_with_file(path, &d, &p, source, sizeof source, &pr, problem, sizeof problem);
    expect(!strcmp(source, want) && p.block_m == 8 && p.block_n == 16, "tuned entry is used", &failures);
    flashcl_attention_desc other = desc_of(FLASHCL_FLOAT16, 100, 128, 0);
    params_with_file(path, &other, &p, source, sizeof source, NULL, NULL, 0);
    expect(!strncmp(source, "default: ", 9), "tuned entry for D<=64 does not apply to D=128", &failures);
    other = desc_of(FLASHCL_FLOAT16, 100, 64, 1);
    params_with_file(path, &other, &p, source, sizeof source, NULL, NULL, 0);
    expect(!strcmp(source, want) && p.block_m == 8,
           "entry for another driver is not used (the any-driver entry is)", &failures);

    /* FLASHCL_PARAMS still applies on top of a tuned entry. */
    setenv("FLASHCL_PARAMS", "BLOCK_N=32", 1);
    params_with_file(path, &d, &p, source, sizeof source, NULL, NULL, 0);
    expect(!strcmp(source, "FLASHCL_PARAMS") && p.block_m == 8 && p.block_n == 32,
           "FLASHCL_PARAMS overrides single values of the tuned entry", &failures);
    /* Malformed lists, whatever the variant (the strict parser is shared with
     * FLASHCL_BWD_PARAMS and FLASHCL_DECODE_PARAMS). */
    static const char *const bad_env[] = {"BLOCK_N=oops", "BLOCK_M", "BLOCK_M=", "BLOCK_M=16,", ",BLOCK_M=16",
                                          "BLOCK_M=16,,BLOCK_N=16", "FOO=3", "BLOCK_M=0", "BLOCK_M=4097"};
    for (size_t i = 0; i < sizeof bad_env / sizeof bad_env[0]; ++i) {
        char what[120];
        setenv("FLASHCL_PARAMS", bad_env[i], 1);
        snprintf(what, sizeof what, "malformed FLASHCL_PARAMS=\"%s\" is still an error", bad_env[i]);
        expect(params_with_file(path, &d, &p, source, sizeof source, NULL, NULL, 0) == FLASHCL_ERROR_MALFORMED_ENV,
               what, &failures);
    }
    setenv("FLASHCL_PARAMS", "block_n=16", 1);
    params_with_file(path, &d, &p, source, sizeof source, NULL, NULL, 0);
    expect(!strcmp(source, "FLASHCL_PARAMS") && p.block_n == 16, "FLASHCL_PARAMS keys in any case", &failures);
    unsetenv("FLASHCL_PARAMS");

    /* The tuned entry computes correctly. */
    setenv("FLASHCL_TUNING_FILE", path, 1);
    ctx = test_context();
    test_case tc = {FLASHCL_FLOAT16, 1, 2, 2, 37, 53, 64, 0, -1, -1, 0, 0, LAYOUT_PACKED, 0};
    expect(run_case(ctx, &tc, test_seed(), 0), "forward with the tuned entry matches the reference",
           &failures);
    flashcl_context_destroy(ctx);

    /* Bad files: ignored whole, with the reason; the defaults apply. */
    static const char *const broken[] = {
        "{\"flashcl_tuning\": 1, \"entries\": [{\"device\": \"x\", \"variant\": \"cpu\"",
        "{\"flashcl_tuning\": 1, \"entries\": [{\"device\": \"x\", \"variant\": \"cpu\", "
        "\"dtype\": \"f16\", \"block_m\": true, \"block_n\": 8}]}",
        "not json at all",
    };
    for (size_t i = 0; i < 3; ++i) {
        char bad_path[320];
        snprintf(bad_path, sizeof bad_path, "%s/broken%zu.json", dir, i);
        write_file(bad_path, broken[i]);
        params_with_file(bad_path, &d, &p, source, sizeof source, &pr, problem, sizeof problem);
        char what[80];
        snprintf(what, sizeof what, "broken file %zu ignored whole with a reason", i);
        expect(pr && strstr(problem, "line") && strstr(problem, "ignored") &&
                   !strncmp(source, "default: ", 9),
               what, &failures);
        if (getenv("VERBOSE"))
            printf("    problem: %s\n", problem);
    }
    /* A valid entry followed by garbage: nothing from the file is used. */
    snprintf(text + strlen(text) - 2, 40, " trailing garbage\n");
    write_file(path, text);
    params_with_file(path, &d, &p, source, sizeof source, &pr, problem, sizeof problem);
    expect(pr && !strncmp(source, "default: ", 9), "valid entry + trailing garbage: whole file ignored",
           &failures);

    /* Huge: over 1 MiB (valid JSON padded with spaces) is ignored unread. */
    FILE *f = fopen(path, "w");
    fputs("{\"flashcl_tuning\": 1, \"entries\": []", f);
    for (int i = 0; i < (1 << 20); ++i)
        fputc(' ', f);
    fputs("}", f);
    fclose(f);
    params_with_file(path, &d, &p, source, sizeof source, &pr, problem, sizeof problem);
    expect(pr && strstr(problem, "limit") && !strncmp(source, "default: ", 9),
           "a 1 MiB+ file is ignored whole", &failures);

    /* A tuned entry that does not fit the device: passed over, the default used. */
    snprintf(text, sizeof text,
             "{\"flashcl_tuning\": 1, \"entries\": [{\"device\": \"%s\", \"variant\": \"%s\","
             " \"dtype\": \"any\", \"block_m\": 4096, \"block_n\": 4096%s}]}",
             name, def.variant, cpu ? "" : ", \"threads_per_row\": 64");
    write_file(path, text);
    params_with_file(path, &d, &p, source, sizeof source, &pr, problem, sizeof problem);
    expect(!pr && !strncmp(source, "default: ", 9) && p.block_m == def.block_m,
           "a tuned entry that no longer fits is passed over for the default", &failures);
    setenv("FLASHCL_TUNING_FILE", path, 1);
    ctx = test_context();
    expect(run_case(ctx, &tc, test_seed(), 0), "... and forward still runs correctly", &failures);
    flashcl_context_destroy(ctx);
    if (variant_was[0])
        setenv("FLASHCL_VARIANT", variant_was, 1);
    else
        unsetenv("FLASHCL_VARIANT");
}

/* ---- overrides and saving --------------------------------------------------------------- */

static void test_overrides(void) {
    char path[300], bad_path[320];
    snprintf(path, sizeof path, "%s/saved.json", dir);
    setenv("FLASHCL_TUNING_FILE", path, 1);
    flashcl_context *ctx = test_context();
    flashcl_attention_desc d = desc_of(FLASHCL_FLOAT32, 50, 40, 1);
    flashcl_params def, p, q;
    flashcl_attention_params(ctx, &d, &def);
    /* The sets below: the CPU variant on CPUs; elsewhere the portable kernel,
     * whatever the default is (nv-tf32 on NVIDIA takes no 4-row blocks). */
    flashcl_params base = def;
    if (strcmp(def.variant, "cpu") != 0) {
        base.variant = "portable";
        base.block_n = 8;
        base.threads_per_row = 2;
    }

    p = base;
    p.block_m = 4;
    expect(flashcl_set_params(ctx, &d, &p) == FLASHCL_SUCCESS, "flashcl_set_params accepts a fitting set",
           &failures);
    flashcl_attention_params(ctx, &d, &q);
    expect(q.block_m == 4 && q.block_n == p.block_n && !strcmp(q.source, "set: flashcl_set_params"),
           "the override is used for its class", &failures);
    test_case tc = {FLASHCL_FLOAT32, 1, 2, 2, 50, 50, 40, 1, -1, -1, 0, 0, LAYOUT_PACKED, 0};
    expect(run_case(ctx, &tc, test_seed(), 0), "forward with the override matches the reference", &failures);
    flashcl_attention_desc other = desc_of(FLASHCL_FLOAT32, 50, 40, 0);
    flashcl_attention_params(ctx, &other, &q);
    expect(strcmp(q.source, "set: flashcl_set_params") != 0, "... and not for another class (non-causal)",
           &failures);

    p.block_m = 4096;
    p.block_n = 4096;
    flashcl_status st = flashcl_set_params(ctx, &d, &p);
    expect(st == FLASHCL_ERROR_INVALID_PARAMS && strstr(flashcl_last_error(ctx), "local memory"),
           "an override that does not fit is refused with a message", &failures);
    flashcl_attention_params(ctx, &d, &q);
    expect(q.block_m == 4, "... and the previous override stays", &failures);
    p = def;
    p.variant = "nv-mma";
    expect(flashcl_set_params(ctx, &d, &p) == FLASHCL_ERROR_INVALID_PARAMS, "nv-mma on float32 is refused",
           &failures);
    p.variant = "warp-speed";
    expect(flashcl_set_params(ctx, &d, &p) == FLASHCL_ERROR_INVALID_PARAMS, "unknown variant is refused",
           &failures);
    expect(flashcl_set_params(ctx, &d, NULL) == FLASHCL_SUCCESS &&
               flashcl_attention_params(ctx, &d, &q) == FLASHCL_SUCCESS && !strcmp(q.source, def.source),
           "NULL removes the override", &failures);

    /* Save, then a new context reads it back. */
    p = base;
    p.block_m = 8;
    expect(flashcl_tuning_file_save(ctx, NULL, &d, &p, "test \"entry\"") == FLASHCL_SUCCESS,
           "flashcl_tuning_file_save writes the default path", &failures);
    p.block_m = 16;
    expect(flashcl_tuning_file_save(ctx, NULL, &d, &p, NULL) == FLASHCL_SUCCESS, "saving again replaces",
           &failures);
    /* The file has no FP8 class: an FP8 desc would be stored as dtype "any" and override every
     * dtype's entry. */
    flashcl_attention_desc d8 = d;
    d8.dtype = FLASHCL_FLOAT8_E4M3;
    expect(flashcl_tuning_file_save(ctx, NULL, &d8, &p, NULL) == FLASHCL_ERROR_INVALID_ARGUMENT &&
               strstr(flashcl_last_error(ctx), "FP8"),
           "flashcl_tuning_file_save refuses an FP8 desc, says why", &failures);
    flashcl_context_destroy(ctx);
    char err[200];
    size_t count = 0;
    char *text = read_all(path);
    expect(parses(text, strlen(text), &count, err, sizeof err) && count == 1, "the saved file holds one entry",
           &failures);
    ctx = test_context();
    flashcl_attention_params(ctx, &d, &q);
    expect(q.block_m == 16 && !strncmp(q.source, "tuned: ", 7), "a new context uses the saved entry", &failures);

    /* Saving into a file that cannot be read leaves it alone. */
    snprintf(bad_path, sizeof bad_path, "%s/keep.json", dir);
    write_file(bad_path, "{\"mine\": ");
    st = flashcl_tuning_file_save(ctx, bad_path, &d, &p, NULL);
    expect(st == FLASHCL_ERROR_TUNING_FILE && !strcmp(read_all(bad_path), "{\"mine\": "),
           "saving over an unreadable file is refused and the file kept", &failures);

    /* A store that would make the file larger than the loader reads is
     * refused with a message naming the limit, and the file kept: before,
     * it was written, then ignored whole, and every later store refused. */
    char big_path[4200];
    snprintf(big_path, sizeof big_path, "%s/big.json", dir);
    expect(flashcl_tuning_file_save(ctx, big_path, &d, &p, "small") == FLASHCL_SUCCESS, "a small store", &failures);
    char *before = strdup(read_all(big_path)); /* read_all reuses one buffer */
    size_t big = FLASHCL_TUNING_MAX_BYTES - 64;
    char *comment = malloc(big + 1);
    if (comment) {
        memset(comment, 'x', big);
        comment[big] = '\0';
    }
    st = flashcl_tuning_file_save(ctx, big_path, &d, &p, comment);
    char *after = strdup(read_all(big_path));
    expect(comment && st == FLASHCL_ERROR_TUNING_FILE && strstr(flashcl_last_error(ctx), "limit") && before &&
               after && !strcmp(before, after),
           "a store past FLASHCL_TUNING_MAX_BYTES is refused, the file kept", &failures);
    expect(flashcl_tuning_file_save(ctx, big_path, &d, &p, "again") == FLASHCL_SUCCESS,
           "... and the next small store still works", &failures);
    free(comment);
    free(before);
    free(after);
    remove(big_path);

    /* A FIFO as FLASHCL_TUNING_FILE is not opened (it blocked forever). */
    char fifo[4200];
    snprintf(fifo, sizeof fifo, "%s/fifo.json", dir);
    flashcl_context_destroy(ctx);
    if (mkfifo(fifo, 0600) == 0) {
        char *old_file = getenv("FLASHCL_TUNING_FILE") ? strdup(getenv("FLASHCL_TUNING_FILE")) : NULL;
        setenv("FLASHCL_TUNING_FILE", fifo, 1);
        alarm(120); /* a blocked open would hang until CTest's timeout */
        ctx = test_context();
        expect(flashcl_attention_params(ctx, &d, &q) == FLASHCL_SUCCESS && strncmp(q.source, "tuned: ", 7) != 0,
               "a FIFO as FLASHCL_TUNING_FILE is skipped, not opened", &failures);
        alarm(0);
        flashcl_context_destroy(ctx);
        if (old_file)
            setenv("FLASHCL_TUNING_FILE", old_file, 1);
        else
            unsetenv("FLASHCL_TUNING_FILE");
        free(old_file);
        remove(fifo);
    } else {
        expect(0, "mkfifo for the FIFO check", &failures);
    }
}

/* ---- the levels, on a pretend device ------------------------------------------------------ */

static void test_levels(void) {
    char path[300], text[1024];
    flashcl_params p;
    snprintf(path, sizeof path, "%s/h200.json", dir);
    setenv("FLASHCL_TUNING_FILE", path, 1);
    unlink(path);
    flashcl_context *ctx = test_context();
    pretend_h200(ctx);
    flashcl_attention_desc d16 = desc_of(FLASHCL_FLOAT16, 1000, 128, 0);
    flashcl_attention_desc d32 = desc_of(FLASHCL_FLOAT32, 1000, 128, 0);
    flashcl_attention_params(ctx, &d16, &p);
    expect(!strcmp(p.source, "built-in arch: sm_90") && !strcmp(p.variant, "nv-wgmma") && p.block_m == 64 &&
               p.block_n == 64 && p.work_group_size == 128 && flashcl_forward_local_bytes(&p, 128) <= 48000,
           "sm_90, f16: the sm_90 arch entry (nv-wgmma 64x64, 4 warps)", &failures);
    flashcl_attention_desc d16c = desc_of(FLASHCL_FLOAT16, 1000, 96, 1);
    flashcl_attention_params(ctx, &d16c, &p);
    expect(!strcmp(p.source, "built-in arch: sm_90") && !strcmp(p.variant, "nv-wgmma") && p.block_m == 64 &&
               p.block_n == 64 && p.work_group_size == 128,
           "sm_90, f16 causal D=96: the causal sm_90 entry (nv-wgmma 64x64, 4 warps)", &failures);
    /* One warpgroup of 48-key tiles: Q keeps its own block beside K and V
     * (Q_PER_TILE) and the build caps registers at 168; nowhere else above D=64. */
    flashcl_params narrow = {64, 48, 0, 128, "nv-wgmma", NULL};
    expect(flashcl_forward_local_bytes(&narrow, 96) == 64 * 256 + 2 * 48 * 256 + 1024 &&
               flashcl_nv_wgmma_max_registers(&narrow, 96) == 168 &&
               flashcl_nv_wgmma_max_registers(&narrow, 64) == 0,
           "nv-wgmma 64x48 D=96: Q's own block, 41 KB, and a 168-register cap", &failures);
    flashcl_params wide = {64, 64, 0, 128, "nv-wgmma", NULL}, two = {128, 48, 0, 256, "nv-wgmma", NULL};
    expect(flashcl_forward_local_bytes(&wide, 128) == 2 * 64 * 256 + 1024 &&
               flashcl_nv_wgmma_max_registers(&wide, 128) == 0 && flashcl_nv_wgmma_max_registers(&two, 128) == 0,
           "nv-wgmma D=128, 64-key tiles or two warpgroups: Q under K and V, no cap", &failures);
    flashcl_params fp8 = {64, 128, 0, 128, "nv-wgmma-fp8", NULL};
    expect(flashcl_nv_wgmma_max_registers(&fp8, 128) == 168 && flashcl_nv_wgmma_max_registers(&fp8, 80) == 168 &&
               flashcl_nv_wgmma_max_registers(&fp8, 64) == 128,
           "nv-wgmma-fp8: three work-groups an SM above D=64 (168 registers), four at D <= 64 (128)", &failures);
    flashcl_attention_desc d16_64 = desc_of(FLASHCL_FLOAT16, 1000, 64, 0);
    flashcl_attention_params(ctx, &d16_64, &p);
    expect(!strcmp(p.variant, "nv-wgmma") && p.block_m == 64 && p.work_group_size == 128 &&
               flashcl_forward_local_bytes(&p, 64) == 2 * 64 * 128 + 1024,
           "sm_90, f16 D=64: nv-wgmma, 1 warpgroup, Q in registers, its __local under K and V", &failures);
    flashcl_attention_desc bf16_40 = desc_of(FLASHCL_BFLOAT16, 1000, 40, 0);
    flashcl_attention_params(ctx, &bf16_40, &p);
    expect(!strcmp(p.source, "built-in arch: sm_90") && !strcmp(p.variant, "nv-wgmma") && p.block_m == 64 &&
               p.work_group_size == 128,
           "sm_90, bf16 D=40: the sm_90 arch entry (nv-wgmma 64x64, 4 warps)", &failures);
    flashcl_attention_desc d16_64c = desc_of(FLASHCL_FLOAT16, 1000, 64, 1);
    flashcl_attention_params(ctx, &d16_64c, &p);
    expect(!strcmp(p.source, "built-in arch: sm_90") && !strcmp(p.variant, "nv-wgmma") && p.block_m == 64 &&
               p.block_n == 64 && p.work_group_size == 128,
           "sm_90, f16 causal D=64: the causal sm_90 entry (nv-wgmma 64x64, 4 warps)", &failures);
    flashcl_params wg64 = {64, 48, 0, 128, "nv-wgmma", NULL};
    expect(flashcl_set_params(ctx, &d16_64c, &wg64) == FLASHCL_SUCCESS &&
               flashcl_attention_params(ctx, &d16_64c, &p) == FLASHCL_SUCCESS && !strcmp(p.variant, "nv-wgmma") &&
               !strcmp(p.source, "set: flashcl_set_params") && p.block_m == 64 && p.block_n == 48,
           "sm_90, f16 causal D=64: other nv-wgmma tiles through flashcl_set_params (test_forward wgmma forces them)",
           &failures);
    flashcl_set_params(ctx, &d16_64c, NULL);
    flashcl_attention_desc d16_16 = desc_of(FLASHCL_FLOAT16, 1000, 16, 0);
    flashcl_attention_params(ctx, &d16_16, &p);
    expect(strcmp(p.variant, "nv-wgmma") != 0, "sm_90, f16 D=16: not nv-wgmma (it takes 32..128)", &failures);
    setenv("FLASHCL_VARIANT", "nv-mma", 1);
    flashcl_attention_params(ctx, &d16, &p);
    expect(!strcmp(p.source, "built-in arch: sm_80+") && !strcmp(p.variant, "nv-mma") && p.block_n == 64 &&
               p.work_group_size == 128,
           "FLASHCL_VARIANT=nv-mma: the sm_80+ arch entry (nv-mma 64x64, 4 warps)", &failures);
    unsetenv("FLASHCL_VARIANT");
    ctx->no_sm90a = 1;
    flashcl_attention_params(ctx, &d16, &p);
    expect(!strcmp(p.variant, "nv-mma"), "after an nv-wgmma build failure: nv-mma", &failures);
    ctx->no_sm90a = 0;
    ctx->info.nv_cc_minor = 9;
    flashcl_attention_params(ctx, &d16, &p);
    expect(!strcmp(p.variant, "nv-mma"), "compute capability 9.9: not sm_90a, nv-mma", &failures);
    ctx->info.nv_cc_minor = 0;
    flashcl_params wg = {64, 64, 0, 256, "nv-wgmma", NULL};
    expect(flashcl_set_params(ctx, &d16, &wg) == FLASHCL_ERROR_INVALID_PARAMS &&
               strstr(flashcl_last_error(ctx), "16*WARPS"),
           "nv-wgmma with BLOCK_M other than 16*WARPS is refused", &failures);
    /* FLASHCL_PARAMS is held to the same rules as flashcl_set_params. */
    setenv("FLASHCL_PARAMS", "WARPS=8,BLOCK_M=64", 1);
    expect(flashcl_attention_params(ctx, &d16, &p) == FLASHCL_ERROR_INVALID_PARAMS &&
               strstr(flashcl_last_error(ctx), "16*WARPS"),
           "FLASHCL_PARAMS: nv-wgmma with BLOCK_M other than 16*WARPS is refused, and says why", &failures);
    setenv("FLASHCL_VARIANT", "nv-mma", 1); /* 64 rows are not a multiple of 16 * 8 warps */
    expect(flashcl_attention_params(ctx, &d16, &p) == FLASHCL_ERROR_INVALID_PARAMS &&
               strstr(flashcl_last_error(ctx), "16*WARPS"),
           "FLASHCL_PARAMS: nv-mma with BLOCK_M not a multiple of 16*WARPS is refused before any build",
           &failures);
    unsetenv("FLASHCL_VARIANT");
    unsetenv("FLASHCL_PARAMS");
    wg = (flashcl_params){128, 64, 0, 256, "nv-wgmma", NULL};
    expect(flashcl_set_params(ctx, &d32, &wg) == FLASHCL_ERROR_INVALID_PARAMS &&
               strstr(flashcl_last_error(ctx), "nv-wgmma kernel does not apply"),
           "nv-wgmma on float32 is refused", &failures);
    snprintf(ctx->info.name, sizeof ctx->info.name, "NVIDIA H200");
    flashcl_attention_params(ctx, &d16, &p);
    expect(!strcmp(p.source, "built-in device: NVIDIA H200") && !strcmp(p.variant, "nv-wgmma") &&
               p.block_m == 64 && p.block_n == 64 && p.work_group_size == 128,
           "the H200 by name: its exact-device entry (the measured winner)", &failures);
    snprintf(ctx->info.name, sizeof ctx->info.name, "Pretend NVIDIA sm_90 GPU");
    flashcl_attention_params(ctx, &d32, &p);
    expect(!strcmp(p.source, "built-in arch: sm_80+") && !strcmp(p.variant, "nv-tf32") && p.block_m == 48 &&
               p.block_n == 16 && p.work_group_size == 96 && flashcl_forward_local_bytes(&p, 128) <= 48000,
           "sm_90, f32 D=128: the float32 tensor-core entry (nv-tf32 48x16, 3 warps)", &failures);
    /* The host's estimate is the kernel's SMEM_FLOATS (ptxas on the H200: 34832 and 36112 bytes,
     * 16 of them its own): D=64 two stages of 32 keys at 68 floats a row over the Q block; D=128
     * the Q block, then one stage, Q and K rows at DIM_PERM's 144 floats, V's at 132. */
    flashcl_params tf64 = {64, 32, 0, 128, "nv-tf32", NULL}, tf128 = {32, 16, 0, 64, "nv-tf32", NULL},
                   tf128w3 = {48, 16, 0, 96, "nv-tf32", NULL};
    expect(flashcl_forward_local_bytes(&tf64, 64) == 2 * 32 * (68 + 68) * 4 &&
               flashcl_forward_local_bytes(&tf128, 128) == (32 * 144 + 16 * (144 + 132)) * 4 &&
               flashcl_forward_local_bytes(&tf128w3, 128) == (48 * 144 + 16 * (144 + 132)) * 4,
           "nv-tf32 __local: two 32-key stages at D=64; Q, then one 16-key stage at D=128 (2 or 3 warps)",
           &failures);
    flashcl_attention_desc d32_256 = desc_of(FLASHCL_FLOAT32, 1000, 256, 0);
    flashcl_attention_params(ctx, &d32_256, &p);
    expect(!strcmp(p.source, "default: GPU") && !strcmp(p.variant, "portable"),
           "sm_90, f32 D=256: no tensor-core kernel applies, the GPU default", &failures);
    setenv("FLASHCL_VARIANT", "portable", 1);
    flashcl_attention_params(ctx, &d16, &p);
    expect(!strcmp(p.variant, "portable"), "FLASHCL_VARIANT=portable skips nv-mma entries", &failures);
    flashcl_attention_params(ctx, &d32, &p);
    expect(!strcmp(p.variant, "portable"), "FLASHCL_VARIANT=portable skips nv-tf32 entries", &failures);
    unsetenv("FLASHCL_VARIANT");
    /* nv-tf32's own rules, for explicit parameters */
    flashcl_params bad = {64, 16, 0, 64, "nv-tf32", NULL};
    expect(flashcl_set_params(ctx, &d32, &bad) == FLASHCL_ERROR_INVALID_PARAMS &&
               strstr(flashcl_last_error(ctx), "16*WARPS"),
           "nv-tf32 with BLOCK_M other than 16*WARPS is refused", &failures);
    bad = (flashcl_params){32, 16, 0, 64, "nv-tf32", NULL};
    expect(flashcl_set_params(ctx, &d16, &bad) == FLASHCL_ERROR_INVALID_PARAMS &&
               strstr(flashcl_last_error(ctx), "nv-tf32 kernel does not apply"),
           "nv-tf32 on float16 is refused", &failures);
    bad = (flashcl_params){64, 128, 0, 128, "nv-tf32", NULL};
    expect(flashcl_set_params(ctx, &d32, &bad) == FLASHCL_ERROR_INVALID_PARAMS &&
               strstr(flashcl_last_error(ctx), "48000"),
           "nv-tf32 tiles over 48000 bytes are refused", &failures);
    ctx->info.local_mem = 16 * 1024; /* the arch entry's 34 KB no longer fits */
    flashcl_attention_params(ctx, &d16, &p);
    expect(!strcmp(p.variant, "portable") && strstr(p.source, "default: GPU") &&
               flashcl_forward_local_bytes(&p, 128) <= 16 * 1024,
           "an arch entry that does not fit is passed over; the default shrinks to fit", &failures);
    flashcl_context_destroy(ctx);

    /* A tuned entry beats the arch entry, and may pick another variant. */
    snprintf(text, sizeof text,
             "{\"flashcl_tuning\": 1, \"entries\": [{\"device\": \"Pretend NVIDIA sm_90 GPU\", \"variant\": "
             "\"portable\", \"dtype\": \"f16\", \"head_dim_min\": 65, \"head_dim_max\": 128, \"phase\": "
             "\"prefill\", \"block_m\": 32, \"block_n\": 32, \"threads_per_row\": 4}]}");
    ctx = pretend_h200_tuned(path, text);
    flashcl_attention_params(ctx, &d16, &p);
    expect(!strncmp(p.source, "tuned: ", 7) && !strcmp(p.variant, "portable") && p.block_m == 32,
           "tuned entry beats the arch entry and picks the portable variant", &failures);
    flashcl_attention_desc decode = desc_of(FLASHCL_FLOAT16, 1, 128, 0);
    decode.seqlen_k = 1000;
    flashcl_attention_params(ctx, &decode, &p);
    expect(!strcmp(p.source, "built-in arch: sm_90"), "the prefill entry does not apply to decode (Nq=1)",
           &failures);
    p.variant = "nv-mma";
    p.block_m = 64;
    p.block_n = 64;
    p.work_group_size = 128;
    expect(flashcl_set_params(ctx, &d16, &p) == FLASHCL_SUCCESS, "override on the pretend device", &failures);
    flashcl_attention_params(ctx, &d16, &p);
    expect(!strcmp(p.source, "set: flashcl_set_params") && !strcmp(p.variant, "nv-mma"),
           "flashcl_set_params beats the tuning file", &failures);
    p.block_m = 48; /* not a multiple of 16 * 4 warps */
    expect(flashcl_set_params(ctx, &d16, &p) == FLASHCL_ERROR_INVALID_PARAMS,
           "nv-mma BLOCK_M not a multiple of 16*WARPS is refused", &failures);
    p.block_m = 128;
    p.block_n = 128;
    expect(flashcl_set_params(ctx, &d16, &p) == FLASHCL_ERROR_INVALID_PARAMS &&
               strstr(flashcl_last_error(ctx), "48000"),
           "nv-mma tiles over 48000 bytes are refused", &failures);
    flashcl_context_destroy(ctx);

    /* A tuned nv-tf32 entry (warps required, as for nv-mma) is read and used for float32. */
    snprintf(text, sizeof text,
             "{\"flashcl_tuning\": 1, \"entries\": [{\"device\": \"Pretend NVIDIA sm_90 GPU\", \"variant\": "
             "\"nv-tf32\", \"dtype\": \"f32\", \"head_dim_min\": 65, \"head_dim_max\": 128, \"phase\": "
             "\"prefill\", \"block_m\": 64, \"block_n\": 8, \"warps\": 4}]}");
    ctx = pretend_h200_tuned(path, text);
    flashcl_attention_params(ctx, &d32, &p);
    expect(!strncmp(p.source, "tuned: ", 7) && !strcmp(p.variant, "nv-tf32") && p.block_m == 64 &&
               p.block_n == 8 && p.work_group_size == 128,
           "a tuned nv-tf32 entry is used for float32", &failures);
    flashcl_context_destroy(ctx);

    /* Architectures. */
    ctx = test_context();
    pretend_h200(ctx);
    ctx->info.nv_cc_major = 7;
    ctx->info.nv_cc_minor = 5;
    char arch[64];
    flashcl_device_arch(ctx, arch, sizeof arch);
    snprintf(ctx->info.name, sizeof ctx->info.name, "Tesla T4");
    flashcl_attention_params(ctx, &d16, &p);
    expect(!strcmp(arch, "sm_75") && !strcmp(p.source, "default: GPU"), "sm_75: no tensor-core entry", &failures);
    snprintf(ctx->info.name, sizeof ctx->info.name, "gfx90a:sramecc+:xnack-");
    ctx->info.nv_cc_major = 0;
    ctx->info.is_nvidia = 0;
    flashcl_device_arch(ctx, arch, sizeof arch);
    expect(!strcmp(arch, "gfx90a"), "AMD arch from the gfx name", &failures);
    flashcl_context_destroy(ctx);
    unlink(path);
}

/* The FP8 warpgroup-MMA forward (nv-wgmma-fp8) on the pretend H200: the table's choice for FP8
 * q, k, v, and what FLASHCL_PARAMS gets, only where cl/flash_fwd_sm90_fp8.cl's conditions hold;
 * elsewhere the table falls to the portable kernel and an explicit request is refused. */
static void test_fp8_wgmma_choice(void) {
    flashcl_context *ctx = test_context();
    pretend_h200(ctx);
    flashcl_params p;
    flashcl_attention_desc d8 = desc_of(FLASHCL_FLOAT8_E4M3, 1000, 128, 0);
    d8.out_dtype = FLASHCL_FLOAT16;
    expect(flashcl_attention_params(ctx, &d8, &p) == FLASHCL_SUCCESS && !strcmp(p.variant, "nv-wgmma-fp8") &&
               p.block_m == 64 && p.block_n == 128 && !strncmp(p.source, "built-in arch: sm_90", 20),
           "sm_90, e4m3 D=128 out f16: the table chooses nv-wgmma-fp8", &failures);
    flashcl_attention_desc d5 = d8;
    d5.dtype = FLASHCL_FLOAT8_E5M2, d5.head_dim = 64, d5.out_dtype = FLASHCL_BFLOAT16;
    expect(flashcl_attention_params(ctx, &d5, &p) == FLASHCL_SUCCESS && !strcmp(p.variant, "nv-wgmma-fp8"),
           "sm_90, e5m2 D=64 out bf16: nv-wgmma-fp8", &failures);
    d5 = d8, d5.out_dtype = FLASHCL_FLOAT32;
    expect(flashcl_attention_params(ctx, &d5, &p) == FLASHCL_SUCCESS && !strcmp(p.variant, "portable"),
           "sm_90, e4m3 out f32 (not the kernel's): the portable kernel", &failures);
    d5 = d8, d5.head_dim = 72;
    expect(flashcl_attention_params(ctx, &d5, &p) == FLASHCL_SUCCESS && !strcmp(p.variant, "portable"),
           "sm_90, e4m3 D=72 (not a multiple of 16): the portable kernel", &failures);
    d5 = d8, d5.seqlen_q = 1;
    expect(flashcl_attention_params(ctx, &d5, &p) == FLASHCL_SUCCESS && !strcmp(p.variant, "portable"),
           "sm_90, e4m3 decode (one query row): the portable kernel", &failures);
    ctx->no_sm90a = 1;
    expect(flashcl_attention_params(ctx, &d8, &p) == FLASHCL_SUCCESS && !strcmp(p.variant, "portable"),
           "sm_90, e4m3 after an sm_90a build failure: the portable kernel", &failures);
    ctx->no_sm90a = 0;
    ctx->no_fp8_wgmma = 1;
    expect(flashcl_attention_params(ctx, &d8, &p) == FLASHCL_SUCCESS && !strcmp(p.variant, "portable"),
           "sm_90, e4m3 after an nv-wgmma-fp8 build failure: the portable kernel", &failures);
    setenv("FLASHCL_PARAMS", "VARIANT=nv-wgmma-fp8", 1);
    expect(flashcl_attention_params(ctx, &d8, &p) == FLASHCL_SUCCESS && !strcmp(p.variant, "nv-wgmma-fp8"),
           "... which FLASHCL_PARAMS may still ask for (its build then fails as an error)", &failures);
    unsetenv("FLASHCL_PARAMS");
    ctx->no_fp8_wgmma = 0;
    setenv("FLASHCL_PARAMS", "VARIANT=nv-wgmma-fp8", 1);
    expect(flashcl_attention_params(ctx, &d8, &p) == FLASHCL_SUCCESS && !strcmp(p.variant, "nv-wgmma-fp8") &&
               p.block_m == 64 && p.block_n == 128 && p.work_group_size == 128 &&
               flashcl_forward_local_bytes(&p, 128) == (128 + 128 + 64) * 128 + 1024 &&
               flashcl_forward_local_bytes(&p, 64) == (128 + 64 + 64) * 128 + 1024,
           "FLASHCL_PARAMS=VARIANT=nv-wgmma-fp8: one warpgroup, 64 rows, 128-key tiles; __local K + Vt + Q",
           &failures);
    /* Two warpgroups taking turns (PINGPONG): a 128-row Q block beside K and Vt fits 48 KB only at
     * one 64-dim panel; other shapes are refused before anything is built. */
    flashcl_attention_desc d64 = d8;
    d64.head_dim = 64;
    setenv("FLASHCL_PARAMS", "VARIANT=nv-wgmma-fp8,WARPS=8,BLOCK_M=128", 1);
    expect(flashcl_attention_params(ctx, &d64, &p) == FLASHCL_SUCCESS && p.work_group_size == 256 &&
               p.block_m == 128 && flashcl_forward_local_bytes(&p, 64) == (128 + 64 + 128) * 128 + 1024,
           "FLASHCL_PARAMS=VARIANT=nv-wgmma-fp8,WARPS=8,BLOCK_M=128 at D=64: two warpgroups, 128 rows", &failures);
    expect(flashcl_attention_params(ctx, &d8, &p) == FLASHCL_ERROR_INVALID_PARAMS &&
               strstr(flashcl_last_error(ctx), "48000"),
           "... at D=128 refused: K, Vt and a 128-row Q exceed 48 KB", &failures);
    setenv("FLASHCL_PARAMS", "VARIANT=nv-wgmma-fp8,WARPS=8", 1);
    expect(flashcl_attention_params(ctx, &d64, &p) == FLASHCL_ERROR_INVALID_PARAMS &&
               strstr(flashcl_last_error(ctx), "BLOCK_M 16*WARPS"),
           "FLASHCL_PARAMS=VARIANT=nv-wgmma-fp8,WARPS=8 with 64 rows refused", &failures);
    setenv("FLASHCL_PARAMS", "VARIANT=nv-wgmma-fp8", 1); /* what the refusals below ask for */
    struct {
        const char *what;
        flashcl_attention_desc d;
    } refused[8];
    int n = 0;
    refused[n].what = "a float32 output", refused[n].d = d8, refused[n++].d.out_dtype = FLASHCL_FLOAT32;
    refused[n].what = "head_dim 72 (not a multiple of 16)", refused[n].d = d8, refused[n++].d.head_dim = 72;
    refused[n].what = "head_dim 144", refused[n].d = d8, refused[n++].d.head_dim = 144;
    refused[n].what = "float16 q, k, v", refused[n].d = d8, refused[n++].d.dtype = FLASHCL_FLOAT16;
    refused[n].what = "row blocks of 12 factors", refused[n].d = d8;
    refused[n].d.fp8.per_head = 1, refused[n++].d.fp8.block_rows = 12;
    refused[n].what = "k rows 8 bytes apart from 16-byte alignment", refused[n].d = d8;
    refused[n].d.k.stride_head = 136, refused[n].d.k.stride_seq = 2 * 136, refused[n++].d.k.stride_batch = 2 * 136 * 1000;
    refused[n].what = "a v offset of 8 bytes", refused[n].d = d8, refused[n++].d.v.offset = 8;
    for (int i = 0; i < n; ++i) {
        char what[160];
        snprintf(what, sizeof what, "FLASHCL_PARAMS=VARIANT=nv-wgmma-fp8 with %s is refused, and says why",
                 refused[i].what);
        expect(flashcl_attention_params(ctx, &refused[i].d, &p) == FLASHCL_ERROR_INVALID_PARAMS &&
                   strstr(flashcl_last_error(ctx), "nv-wgmma-fp8") &&
                   strstr(flashcl_last_error(ctx), "16-byte aligned rows"),
               what, &failures);
    }
    flashcl_attention_desc blocks = d8;
    blocks.fp8.per_head = 1, blocks.fp8.block_rows = 64;
    expect(flashcl_attention_params(ctx, &blocks, &p) == FLASHCL_SUCCESS && !strcmp(p.variant, "nv-wgmma-fp8"),
           "FLASHCL_PARAMS=VARIANT=nv-wgmma-fp8 with 64-row blocks of factors", &failures);
    /* what holds the kernel off is named, not the device's needs, which it meets */
    setenv("FLASHCL_VARIANT", "portable", 1);
    expect(flashcl_attention_params(ctx, &d8, &p) == FLASHCL_ERROR_INVALID_PARAMS &&
               strstr(flashcl_last_error(ctx), "FLASHCL_VARIANT=portable"),
           "FLASHCL_VARIANT=portable keeps nv-wgmma-fp8 off too, and says so", &failures);
    setenv("FLASHCL_VARIANT", "nv-mma", 1);
    expect(flashcl_attention_params(ctx, &d8, &p) == FLASHCL_ERROR_INVALID_PARAMS &&
               strstr(flashcl_last_error(ctx), "FLASHCL_VARIANT=nv-mma"),
           "FLASHCL_VARIANT=nv-mma keeps nv-wgmma-fp8 off (no wgmma forward), and says so",
           &failures);
    unsetenv("FLASHCL_VARIANT");
    ctx->no_sm90a = 1;
    expect(flashcl_attention_params(ctx, &d8, &p) == FLASHCL_ERROR_INVALID_PARAMS &&
               strstr(flashcl_last_error(ctx), "sm_90a code failed to build"),
           "after an sm_90a build failure nv-wgmma-fp8 does not apply, and says why", &failures);
    ctx->no_sm90a = 0;
    unsetenv("FLASHCL_PARAMS");
    flashcl_params fp8_tiles = {64, 128, 0, 128, "nv-wgmma-fp8", NULL}, other = {64, 64, 0, 128, "nv-wgmma-fp8", NULL};
    expect(flashcl_set_params(ctx, &d8, &fp8_tiles) == FLASHCL_SUCCESS &&
               flashcl_attention_params(ctx, &d8, &p) == FLASHCL_SUCCESS && !strcmp(p.variant, "nv-wgmma-fp8") &&
               !strcmp(p.source, "set: flashcl_set_params"),
           "flashcl_set_params: nv-wgmma-fp8 for an FP8 class", &failures);
    expect(flashcl_set_params(ctx, &d8, &other) == FLASHCL_ERROR_INVALID_PARAMS &&
               strstr(flashcl_last_error(ctx), "FP8 wgmma kernel"),
           "flashcl_set_params: nv-wgmma-fp8 with 64-key tiles is refused, and says why", &failures);
    /* After the kernel failed to build, the lookup passes a set entry for it over, so setting
     * one is refused at once rather than stored and then ignored. */
    flashcl_set_params(ctx, &d8, NULL);
    ctx->no_fp8_wgmma = 1;
    expect(flashcl_set_params(ctx, &d8, &fp8_tiles) == FLASHCL_ERROR_INVALID_PARAMS &&
               strstr(flashcl_last_error(ctx), "failed to build"),
           "flashcl_set_params: nv-wgmma-fp8 after its build failed is refused, and says why",
           &failures);
    ctx->no_fp8_wgmma = 0;
    flashcl_set_params(ctx, &d8, NULL);
    flashcl_context_destroy(ctx);
}

/* Which masks take the longest blocks first (LPT_HEADS, cl/common_nv.cl): those
 * whose later rows see more keys. */
static void test_block_order(void) {
    struct {
        int causal, windowed, left, right, lpt;
        const char *what;
    } cases[] = {
        {0, 0, 0, 0, 0, "no mask: blocks by head"},
        {1, 0, 0, 0, 8, "causal: longest first, chunks of 8 pairs"},
        {1, 1, 100, -1, 0, "causal with a left window of 100: equal blocks, by head"},
        {0, 1, -1, 7, 8, "a window bounded on the right only: longest first"},
        {0, 1, 50, 50, 0, "a window bounded on both sides: by head"},
        {0, 1, 20, -1, 0, "a window bounded on the left only: by head"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
        for (int head_dim = 64; head_dim <= 128; head_dim += 64) {
            flashcl_attention_desc d = desc_of(FLASHCL_FLOAT16, 300, head_dim, cases[i].causal);
            d.windowed = cases[i].windowed;
            d.window_left = cases[i].left;
            d.window_right = cases[i].right;
            expect(flashcl_attention_desc_resolve(&d) == FLASHCL_SUCCESS &&
                       flashcl_lpt_heads(&d, "nv-mma") == cases[i].lpt,
                   cases[i].what, &failures);
            /* float32's tensor-core kernel orders the same blocks in chunks of 16, the FP8 one
             * at D=64 too */
            expect(flashcl_lpt_heads(&d, "nv-tf32") == 2 * cases[i].lpt,
                   "nv-tf32: chunks of 16 pairs", &failures);
            expect(flashcl_lpt_heads(&d, "nv-wgmma-fp8") == (head_dim <= 64 ? 2 : 1) * cases[i].lpt,
                   "nv-wgmma-fp8: chunks of 16 pairs at D=64, 8 at D=128", &failures);
        }
    /* How the host passes it (and the register cap): unless the user's
     * FLASHCL_BUILD_OPTIONS already define it. */
    char opt[32];
    flashcl_host_define(opt, sizeof opt, NULL, "LPT_HEADS", 8);
    expect(!strcmp(opt, " -DLPT_HEADS=8"), "host define: \" -DLPT_HEADS=8\"", &failures);
    flashcl_host_define(opt, sizeof opt, "-DOVERLAP=1 -DLPT_HEADS=32", "LPT_HEADS", 8);
    expect(!strcmp(opt, ""), "host define: the user's LPT_HEADS wins", &failures);
    flashcl_host_define(opt, sizeof opt, "-DLPT_HEADS=32", "FLASHCL_NV_MAXNREG", 168);
    expect(!strcmp(opt, " -DFLASHCL_NV_MAXNREG=168"), "host define: another name is still passed", &failures);
    flashcl_host_define(opt, sizeof opt, NULL, "LPT_HEADS", 0);
    expect(!strcmp(opt, ""), "host define: 0 passes nothing", &failures);
}

/* The register cap's PTX edit (program.c): ".maxnreg" lands between each
 * kernel entry's parameter list (and its other directives) and its body,
 * and nowhere else. */
static void test_ptx_cap(void) {
    static const char ptx[] = "//\n.version 9.0\n.target sm_90\n.address_size 64\n"
                              ".func (.param .b32 r) helper(.param .b32 x)\n{\n\tret;\n}\n"
                              ".entry flash_a(\n\t.param .u64 a_0\n)\n.reqntid 128, 1, 1\n{\n\tret;\n}\n"
                              "\t// .globl\tflash_b\n.visible .entry flash_b(\n\t.param .u64 b_0\n)\n{\n\tret;\n}\n";
    static const char want[] = "//\n.version 9.0\n.target sm_90\n.address_size 64\n"
                               ".func (.param .b32 r) helper(.param .b32 x)\n{\n\tret;\n}\n"
                               ".entry flash_a(\n\t.param .u64 a_0\n)\n.reqntid 128, 1, 1\n.maxnreg 168\n{\n\tret;\n}\n"
                               "\t// .globl\tflash_b\n.visible .entry flash_b(\n\t.param .u64 b_0\n)\n.maxnreg 168\n{\n"
                               "\tret;\n}\n";
    size_t n = 0, entries = 0;
    unsigned char *out = flashcl_ptx_cap_registers((const unsigned char *)ptx, sizeof ptx - 1, 168, &n, &entries);
    expect(out && entries == 2 && n == sizeof want - 1 && !memcmp(out, want, n),
           "PTX register cap: .maxnreg before each entry's body only", &failures);
    free(out);
    static const char no_body[] = ".version 9.0\n.entry flash_a(\n\t.param .u64 a_0\n)";
    out = flashcl_ptx_cap_registers((const unsigned char *)no_body, sizeof no_body - 1, 168, &n, &entries);
    expect(!out, "PTX register cap: an entry without a body is refused (the uncapped program stays)", &failures);
    free(out);
    static const char no_entry[] = ".version 9.0\n.func f()\n{\n}\n";
    out = flashcl_ptx_cap_registers((const unsigned char *)no_entry, sizeof no_entry - 1, 168, &n, &entries);
    expect(!out && entries == 0, "PTX register cap: text without kernels is left alone", &failures);
    free(out);
    /* ".entry " in a comment or mid-line is not an entry, an indented one
     * is; the trailing NUL a driver's binary may carry is kept. */
    static const char commented[] = ".version 9.0\n// the .entry point follows\n.func f()\n{\n}\n"
                                    "\t.entry k(\n)\n{\n\tret;\n}\n";
    static const char commented_want[] = ".version 9.0\n// the .entry point follows\n.func f()\n{\n}\n"
                                         "\t.entry k(\n)\n.maxnreg 96\n{\n\tret;\n}\n";
    out = flashcl_ptx_cap_registers((const unsigned char *)commented, sizeof commented, 96, &n, &entries);
    expect(out && entries == 1 && n == sizeof commented_want && !memcmp(out, commented_want, n),
           "PTX register cap: a commented \".entry\" is passed over, the trailing NUL kept", &failures);
    free(out);
    /* sm_90a: the markers go, the target becomes sm_90a; other targets and
     * unmarked PTX are refused. */
    static const char masked[] = ".version 9.0\n.target sm_90, texmode_independent\n"
                                 "\t// begin inline asm\n//@sm90a wgmma.fence.sync.aligned;\n"
                                 "//@sm90a {\n//@sm90a wgmma.commit_group.sync.aligned;\n//@sm90a }\n";
    static const char unmasked[] = ".version 9.0\n.target sm_90a, texmode_independent\n"
                                   "\t// begin inline asm\nwgmma.fence.sync.aligned;\n"
                                   "{\nwgmma.commit_group.sync.aligned;\n}\n";
    size_t markers = 0;
    out = flashcl_ptx_enable_sm90a((const unsigned char *)masked, sizeof masked - 1, &n, &markers);
    expect(out && markers == 4 && n == sizeof unmasked - 1 && !memcmp(out, unmasked, n),
           "sm_90a PTX: markers removed, .target sm_90a", &failures);
    free(out);
    static const char sm80[] = ".version 9.0\n.target sm_80\n//@sm90a wgmma.fence.sync.aligned;\n";
    static const char sm100[] = ".version 9.0\n.target sm_100\n//@sm90a wgmma.fence.sync.aligned;\n";
    static const char plain[] = ".version 9.0\n.target sm_90\nret;\n";
    expect(!flashcl_ptx_enable_sm90a((const unsigned char *)sm80, sizeof sm80 - 1, &n, &markers) &&
               !flashcl_ptx_enable_sm90a((const unsigned char *)sm100, sizeof sm100 - 1, &n, &markers) &&
               !flashcl_ptx_enable_sm90a((const unsigned char *)plain, sizeof plain - 1, &n, &markers) &&
               !flashcl_ptx_enable_sm90a((const unsigned char *)unmasked, sizeof unmasked - 1, &n, &markers),
           "sm_90a PTX: sm_80, sm_100, sm_90a and unmarked PTX are refused", &failures);
    /* The last -DFLASHCL_NV_MAXNREG wins: FLASHCL_BUILD_OPTIONS comes after the table's. */
    expect(flashcl_nv_register_cap("-cl-std=CL1.2 -DHEAD_DIM=64") == 0 && flashcl_nv_register_cap(NULL) == 0 &&
               flashcl_nv_register_cap("-DWG=128 -DFLASHCL_NV_MAXNREG=168 -cl-nv-verbose") == 168 &&
               flashcl_nv_register_cap("-DFLASHCL_NV_MAXNREG=168 -DFLASHCL_NV_MAXNREG=128") == 128,
           "build options: the register cap is the last -DFLASHCL_NV_MAXNREG's value", &failures);
}

/* The TMA maps' byte strides (src/nv_tma.c): the driver takes multiples of
 * 16 below 2^40, and an extent-1 dimension's stride must be valid though
 * never stepped. */
static void test_tma_strides(void) {
    uint64_t bytes[3];
    /* [B][H][N][D] at D=128: rows 256 bytes, heads N rows, batches H heads */
    const uint64_t dims[4] = {128, 4096, 32, 4}, bhnd[3] = {128, 4096 * 128, 32 * 4096 * 128};
    expect(flashcl_tma_strides(dims, bhnd, 2, bytes) && bytes[0] == 256 && bytes[1] == 2 * 4096 * 128 &&
               bytes[2] == 2 * 32 * 4096 * 128,
           "TMA strides: [B][H][N][D] in bytes", &failures);
    /* [B][N][H][D] (heads inside a row of tokens): not monotonic, still valid */
    const uint64_t bnhd[3] = {32 * 128, 128, 4096 * 32 * 128};
    expect(flashcl_tma_strides(dims, bnhd, 2, bytes) && bytes[0] == 2 * 32 * 128 && bytes[1] == 256,
           "TMA strides: [B][N][H][D]", &failures);
    const uint64_t odd_row[3] = {100, 4096 * 100, 32 * 4096 * 100}; /* 200-byte rows */
    expect(!flashcl_tma_strides(dims, odd_row, 2, bytes), "TMA strides: a row of 200 bytes is refused", &failures);
    const uint64_t zero_head[3] = {128, 0, 4096 * 128}; /* heads broadcast */
    expect(!flashcl_tma_strides(dims, zero_head, 2, bytes), "TMA strides: a zero head stride is refused", &failures);
    /* one head, one batch: their strides (here 8 bytes, invalid) are replaced */
    const uint64_t one[4] = {64, 77, 1, 1}, junk[3] = {64, 4, 4};
    expect(flashcl_tma_strides(one, junk, 2, bytes) && bytes[0] == 128 && bytes[1] == 128 * 77 && bytes[2] == 128 * 77,
           "TMA strides: extent-1 dimensions get valid strides", &failures);
    const uint64_t huge[3] = {(uint64_t)1 << 40, 128, 128};
    expect(!flashcl_tma_strides(dims, huge, 2, bytes), "TMA strides: 2^41 bytes is refused", &failures);
    /* FP8 (one byte an element): [B][N][H][D] rows of 128 bytes are stepped by bytes, not pairs;
     * a row of 72 bytes is refused (the nv-wgmma-fp8 forward's K then arrives by cp.async) */
    const uint64_t fp8_bnhd[3] = {32 * 128, 128, 4096 * 32 * 128}, fp8_odd[3] = {72, 4096 * 72, 32 * 4096 * 72};
    expect(flashcl_tma_strides(dims, fp8_bnhd, 1, bytes) && bytes[0] == 32 * 128 && bytes[1] == 128 &&
               bytes[2] == (uint64_t)4096 * 32 * 128,
           "TMA strides: FP8 [B][N][H][D] in bytes", &failures);
    expect(!flashcl_tma_strides(dims, fp8_odd, 1, bytes), "TMA strides: an FP8 row of 72 bytes is refused", &failures);
}

/* A kernel asked for by name is that kernel or an error: where not one row of the cpu kernel fits
 * the device's local memory (D=256 in 16 KB), a default takes the portable kernel, but
 * FLASHCL_PARAMS=VARIANT=cpu is refused (it once ran the portable kernel, reported as the
 * user's choice). */
static void test_named_variant_fits(void) {
    flashcl_context *ctx = test_context();
    pretend_plain(ctx);
    ctx->info.type = CL_DEVICE_TYPE_CPU;
    ctx->info.local_mem = 16 * 1024;
    flashcl_attention_desc d = desc_of(FLASHCL_FLOAT32, 300, 256, 0);
    flashcl_params p;
    expect(flashcl_attention_params(ctx, &d, &p) == FLASHCL_SUCCESS && !strcmp(p.variant, "portable"),
           "D=256 in 16 KB: the default is the portable kernel", &failures);
    setenv("FLASHCL_PARAMS", "VARIANT=cpu", 1);
    const flashcl_status st = flashcl_attention_params(ctx, &d, &p);
    unsetenv("FLASHCL_PARAMS");
    expect(st == FLASHCL_ERROR_INVALID_PARAMS && strstr(flashcl_last_error(ctx), "local memory"),
           "D=256 in 16 KB: FLASHCL_PARAMS=VARIANT=cpu is refused, and says why", &failures);
    d.head_dim = 64;
    setenv("FLASHCL_PARAMS", "VARIANT=cpu", 1);
    expect(flashcl_attention_params(ctx, &d, &p) == FLASHCL_SUCCESS && !strcmp(p.variant, "cpu"),
           "D=64 in 16 KB: FLASHCL_PARAMS=VARIANT=cpu is the cpu kernel", &failures);
    unsetenv("FLASHCL_PARAMS");
    /* a tensor-core kernel named either way off NVIDIA (an f16 problem it would take there):
     * both refusals say what it needs */
    const flashcl_attention_desc h = desc_of(FLASHCL_FLOAT16, 300, 64, 0);
    ctx->info.nv_cc_major = ctx->info.nv_cc_minor = 0; /* the pretend CPU, on an NVIDIA GPU too */
    flashcl_params by_env_p;
    setenv("FLASHCL_PARAMS", "VARIANT=nv-mma", 1);
    const flashcl_status by_env = flashcl_attention_params(ctx, &h, &by_env_p);
    unsetenv("FLASHCL_PARAMS");
    const int env_says = strstr(flashcl_last_error(ctx), "it needs NVIDIA sm_80+") != NULL;
    flashcl_params mma = {64, 64, 0, 128, "nv-mma", NULL};
    expect(by_env == FLASHCL_ERROR_INVALID_PARAMS && env_says &&
               flashcl_set_params(ctx, &h, &mma) == FLASHCL_ERROR_INVALID_PARAMS &&
               strstr(flashcl_last_error(ctx), "it needs NVIDIA sm_80+"),
           "nv-mma off NVIDIA: FLASHCL_PARAMS and flashcl_set_params both refuse it, saying what "
           "it needs",
           &failures);
    /* on rusticl the cpu kernels are refused by name, and the message says why */
    ctx->info.is_rusticl = 1;
    flashcl_params cpu = p;
    expect(flashcl_set_params(ctx, &d, &cpu) == FLASHCL_ERROR_INVALID_PARAMS &&
               strstr(flashcl_last_error(ctx), "rusticl"),
           "rusticl: flashcl_set_params with the cpu kernel is refused, and says why", &failures);
    flashcl_context_destroy(ctx);
}

int main(void) {
    if (!params_make_dir("flashcl-test-params"))
        return 1;
    test_parser();
    test_ptx_cap();
    test_block_order();
    test_tma_strides();
    flashcl_context *ctx = test_context();
    int host = flashcl_context_is_host(ctx);
    flashcl_context_destroy(ctx);
    if (host) {
        printf("host context: no kernel parameters; database tests skipped\n");
    } else {
        test_file();
        test_overrides();
        test_levels();
        test_fp8_wgmma_choice();
        test_named_variant_fits();
    }
    params_remove_dir();
    printf("%s\n", failures ? "FAILED" : "all passed");
    return failures ? 1 : 0;
}
