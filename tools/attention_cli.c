/* attention_cli.c: `flashcl attention`: attention on .npy files (the forward; --backward is in
 * backward_cli.c). */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attention_cli.h"
#include "cp_cli.h"
#include "backward_cli.h"
#include "cli_util.h"
#include "flashcl.h"
#include "flashcl_ref.h"
#include "npy.h"
#include "serving_cli.h"

const char usage_attention[] =
    "usage: flashcl attention --q Q.npy --k K.npy --v V.npy --out O.npy [options]\n"
    "\n"
    "Computes out = softmax(scale * q k^T + mask) v on .npy files, float32 ('<f4')\n"
    "or float16 ('<f2'), C order, all three of one dtype:\n"
    "  q    (batch, seqlen_q, heads_q, head_dim)\n"
    "  k, v (batch, seqlen_k, heads_k, head_dim)   heads_q a multiple of heads_k\n"
    "  out  like q, in q's dtype (float32 with --dtype e4m3|e5m2);\n"
    "  lse  (batch, heads_q, seqlen_q) float32\n"
    "Outputs appear only once complete: nothing is left behind on an error.\n"
    "\n"
    "options:\n"
    "  --lse LSE.npy   also write each row's log-sum-exp (-inf for a row that sees no key)\n"
    "  --causal        causal mask, aligned bottom-right when seqlen_q != seqlen_k\n"
    "  --window L,R    local attention: row i sees keys i-L .. i+R (shifted by\n"
    "                  seqlen_k - seqlen_q); a negative side is unbounded; with\n"
    "                  --causal, R is 0\n"
    "  --softcap C     scores become C * tanh(s / C) (C > 0)\n"
    "  --scale S       score scale (default 1/sqrt(head_dim))\n"
    "  --paged P       store K/V in a paged KV cache of P-token pages (1..256) handed\n"
    "                  out in shuffled order and attend through the page tables\n"
    "                  (flashcl_paged_attention); the output equals the dense one\n"
    "                  within rounding (its sums run in another order)\n"
    "  --dtype e4m3|e5m2  FP8: quantize q, k, v (amax-scaled, one factor per tensor)\n"
    "                  with flashcl_fp8_quantize_host, run the FP8 forward, write out\n"
    "                  as float32, and print the RMSE against a float64 computation\n"
    "                  on the unquantized inputs (that reference takes a while at\n"
    "                  large sizes: B*H*N*N*D multiply-adds in double on one core)\n"
    "  --block-quant   with --dtype: FlashAttention-3's block quantization, a factor\n"
    "                  per 64 rows of each (batch, head) of q and k, per (batch,\n"
    "                  head) for v\n"
    "  --hadamard      with --dtype: incoherent processing, q and k rotated by the\n"
    "                  same random signed Hadamard matrix (fixed seed) before they\n"
    "                  are quantized, which leaves q k^T unchanged (head_dim a power\n"
    "                  of two <= 256)\n"
    "  --device SPEC   see 'flashcl --help'\n"
    "  --backward      gradients dq, dk, dv instead (its own options:\n"
    "                  flashcl attention --backward --help)\n"
    "  --context-parallel  under mpirun: ring attention across ranks (its own\n"
    "                  options: flashcl attention --context-parallel --help)\n";

static const char *const dim_names[4] = {"batch", "seqlen", "heads", "head_dim"};

/* Reads one input and checks what does not depend on the other inputs. */
static int load_input(const char *path, npy_array *array, char *shape_text, size_t shape_size) {
    char err[512];
    if (npy_read(path, array, err, sizeof err) != 0) {
        cli_errorf("%s: %s", path, err);
        return -1;
    }
    npy_format_shape(array->shape, array->ndim, shape_text, shape_size);
    if (array->ndim != 4) {
        cli_errorf("%s: shape %s has %d dimension%s, expected 4: (batch, seqlen, heads, head_dim)",
                   path, shape_text, array->ndim, array->ndim == 1 ? "" : "s");
        return -1;
    }
    for (int i = 0; i < 4; i++) {
        if (array->shape[i] == 0) {
            cli_errorf("%s: shape %s has a zero dimension (%s)", path, shape_text, dim_names[i]);
            return -1;
        }
        if (array->shape[i] > INT_MAX) {
            cli_errorf("%s: shape %s: %s %zu is too large", path, shape_text, dim_names[i],
                       array->shape[i]);
            return -1;
        }
    }
    if (array->shape[3] > 256) {
        cli_errorf("%s: shape %s: head_dim %zu exceeds flashcl's limit of 256", path, shape_text,
                   array->shape[3]);
        return -1;
    }
    return 0;
}

/* The seed --hadamard rotates q and k with: any fixed value does (both must
 * use the same one); this is the golden ratio's bits. */
#define CLI_HADAMARD_SEED 0x9e3779b97f4a7c15ull

/* --dtype e4m3|e5m2: the FP8 copies of q, k, v and their descale factors. */
typedef struct fp8_inputs {
    unsigned char *x[3];
    float *descale[3];
} fp8_inputs;

static void fp8_inputs_free(fp8_inputs *f) {
    for (int t = 0; t < 3; t++)
        free(f->x[t]), free(f->descale[t]);
}

/* Quantizes q, k, v (desc's float dtype, packed) into f and points fd (a
 * copy of desc made FP8, out float32) at the factors; 0 on success. */
static int fp8_quantize_inputs(const flashcl_attention_desc *desc, flashcl_dtype format, int block_quant,
                               int hadamard, const void *const src[3], fp8_inputs *f, flashcl_attention_desc *fd) {
    memset(f, 0, sizeof *f);
    *fd = *desc;
    fd->dtype = format;
    fd->out_dtype = FLASHCL_FLOAT32;
    fd->fp8.per_head = block_quant;
    fd->fp8.block_rows = block_quant ? 64 : 0;
    for (int t = 0; t < 3; t++) {
        flashcl_fp8_quant_desc qd;
        memset(&qd, 0, sizeof qd);
        qd.format = format;
        qd.src_dtype = desc->dtype;
        qd.batch = desc->batch;
        qd.seqlen = t ? desc->seqlen_k : desc->seqlen_q;
        qd.heads = t ? desc->heads_k : desc->heads_q;
        qd.head_dim = desc->head_dim;
        qd.src = t == 0 ? desc->q : t == 1 ? desc->k : desc->v;
        qd.per_head = block_quant;
        qd.block_rows = block_quant && t < 2 ? 64 : 0; /* v's factor scales the output: per head */
        qd.hadamard_seed = hadamard && t < 2 ? CLI_HADAMARD_SEED : 0;
        const size_t n = (size_t)qd.batch * (size_t)qd.seqlen * (size_t)qd.heads * (size_t)qd.head_dim;
        const size_t groups =
            block_quant ? (size_t)qd.batch * (size_t)qd.heads * (qd.block_rows ? ((size_t)qd.seqlen + 63) / 64 : 1) : 1;
        f->x[t] = malloc(n);
        f->descale[t] = malloc(groups * sizeof(float));
        if (f->x[t] == NULL || f->descale[t] == NULL) {
            cli_errorf("out of memory for the FP8 inputs");
            return -1;
        }
        const flashcl_status st = flashcl_fp8_quantize_host(&qd, src[t], f->x[t], f->descale[t]);
        if (st != FLASHCL_SUCCESS) {
            cli_errorf("quantizing %s: %s", t == 0 ? "q" : t == 1 ? "k" : "v", flashcl_last_error(NULL));
            return -1;
        }
    }
    /* The quantized copies are packed whatever the .npy strides were. */
    memset(&fd->q, 0, sizeof fd->q), memset(&fd->k, 0, sizeof fd->k), memset(&fd->v, 0, sizeof fd->v);
    fd->fp8.q_descale = f->descale[0];
    fd->fp8.k_descale = f->descale[1];
    fd->fp8.v_descale = f->descale[2];
    return 0;
}

/* RMSE of out (float32, packed like q) against float64 attention on the
 * unquantized inputs; NaN when the reference could not run. */
static double rmse_vs_float64(const flashcl_attention_desc *desc, const void *q, const void *k, const void *v,
                              const float *out, size_t count) {
    double *ref = malloc(count * sizeof *ref);
    if (ref == NULL)
        return NAN;
    flashcl_ref_attention_forward(desc, q, k, v, ref, NULL, NULL, NULL);
    double se = 0.0;
    for (size_t i = 0; i < count; i++)
        se += ((double)out[i] - ref[i]) * ((double)out[i] - ref[i]);
    free(ref);
    return sqrt(se / (double)count);
}

/* Writes both outputs to temporary files, then renames them into place, so
 * that an output path names either a complete result or nothing new. out is
 * out_dtype (q's dtype, or float32 for an FP8 run). */
static int write_outputs(const char *out_path, const npy_array *q, npy_dtype out_dtype, const void *out,
                         const char *lse_path, const size_t *lse_shape, const float *lse) {
    char err[512];
    char *tmp_out = NULL, *tmp_lse = NULL;
    int rc = -1, out_renamed = 0;

    if (npy_write_temp(out_path, out_dtype, q->shape, 4, out, &tmp_out, err, sizeof err) != 0) {
        cli_errorf("%s: %s", out_path, err);
        goto done;
    }
    if (lse_path != NULL &&
        npy_write_temp(lse_path, NPY_FLOAT32, lse_shape, 3, lse, &tmp_lse, err, sizeof err) != 0) {
        cli_errorf("%s: %s", lse_path, err);
        goto done;
    }
    if (rename(tmp_out, out_path) != 0) {
        cli_errorf("%s: cannot move the finished file into place: %s", out_path, strerror(errno));
        goto done;
    }
    out_renamed = 1;
    if (tmp_lse != NULL && rename(tmp_lse, lse_path) != 0) {
        cli_errorf("%s: cannot move the finished file into place: %s", lse_path, strerror(errno));
        /* Keep the pair consistent: no out without the lse that was asked for. */
        unlink(out_path);
        goto done;
    }
    rc = 0;
done:
    if (tmp_out != NULL && !out_renamed)
        unlink(tmp_out);
    if (tmp_lse != NULL && rc != 0)
        unlink(tmp_lse);
    free(tmp_out);
    free(tmp_lse);
    return rc;
}

int cmd_attention(int argc, char **argv) {
    const char *q_path = NULL, *k_path = NULL, *v_path = NULL, *out_path = NULL;
    const char *lse_path = NULL, *device = NULL, *value;
    int causal = 0, window_left = -1, window_right = -1, paged = 0, block_quant = 0, hadamard = 0;
    flashcl_dtype fp8 = FLASHCL_FLOAT32; /* FLASHCL_FLOAT32: not an FP8 run */
    flashcl_attention_desc fdesc;
    fp8_inputs f8;
    const void *run_q, *run_k, *run_v;
    double softcap = 0.0, scale = 0.0, t0, elapsed = 0.0, first = 0.0;
    npy_array q, k, v;
    char q_shape[256], k_shape[256], v_shape[256];
    flashcl_attention_desc desc;
    flashcl_context *ctx = NULL;
    flashcl_status status;
    void *out = NULL;
    float *lse = NULL;
    size_t lse_shape[3], lse_count;
    int rc = CLI_EXIT_FAIL;

    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], "--context-parallel") == 0) /* ring attention over MPI: tools/cp_cli.c */
            return cli_context_parallel(argc, argv, 0);
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], "--backward") == 0) /* gradients: tools/backward_cli.c */
            return cli_attention_backward(argc, argv);
    memset(&q, 0, sizeof q);
    memset(&k, 0, sizeof k);
    memset(&v, 0, sizeof v);
    memset(&f8, 0, sizeof f8);
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i];
        int r;
        if (cli_help(arg, usage_attention)) {
            return CLI_EXIT_OK;
        } else if ((r = cli_take_value(argc, argv, &i, "--q", &q_path)) != 0 ||
                   (r = cli_take_value(argc, argv, &i, "--k", &k_path)) != 0 ||
                   (r = cli_take_value(argc, argv, &i, "--v", &v_path)) != 0 ||
                   (r = cli_take_value(argc, argv, &i, "--out", &out_path)) != 0 ||
                   (r = cli_take_value(argc, argv, &i, "--lse", &lse_path)) != 0 ||
                   (r = cli_take_value(argc, argv, &i, "--device", &device)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
        } else if ((r = cli_take_value(argc, argv, &i, "--window", &value)) != 0) {
            long w[2];
            int n = 0;
            if (r < 0)
                return CLI_EXIT_USAGE;
            if (cli_parse_long_list(value, -(long)INT_MAX, INT_MAX, w, 2, &n) != 0 || n != 2)
                return cli_usage_error(usage_attention, "--window wants L,R (integers), not '%s'",
                                       value);
            window_left = w[0] < 0 ? -1 : (int)w[0];
            window_right = w[1] < 0 ? -1 : (int)w[1];
        } else if ((r = cli_take_softcap_scale(usage_attention, argc, argv, &i, &softcap,
                                               &scale)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
        } else if ((r = cli_take_value(argc, argv, &i, "--paged", &value)) != 0) {
            long p;
            if (r < 0)
                return CLI_EXIT_USAGE;
            if (cli_parse_long(value, 1, 256, &p) != 0)
                return cli_usage_error(usage_attention,
                                       "--paged wants a page size 1..256, not '%s'", value);
            paged = (int)p;
        } else if ((r = cli_take_value(argc, argv, &i, "--dtype", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            if (cli_parse_dtype_fp8(value, &fp8) != 0 ||
                (fp8 != FLASHCL_FLOAT8_E4M3 && fp8 != FLASHCL_FLOAT8_E5M2))
                return cli_usage_error(usage_attention,
                                       "--dtype wants e4m3 or e5m2 (float inputs otherwise run in their own "
                                       "dtype), not '%s'",
                                       value);
        } else if (strcmp(arg, "--block-quant") == 0) {
            block_quant = 1;
        } else if (strcmp(arg, "--hadamard") == 0) {
            hadamard = 1;
        } else if (strcmp(arg, "--causal") == 0) {
            causal = 1;
        } else {
            return cli_unknown_option(usage_attention, arg);
        }
    }
    if ((block_quant || hadamard) && fp8 == FLASHCL_FLOAT32)
        return cli_usage_error(usage_attention, "%s quantizes to FP8: it needs --dtype e4m3 or e5m2",
                               block_quant ? "--block-quant" : "--hadamard");
    if (paged && fp8 != FLASHCL_FLOAT32)
        return cli_usage_error(usage_attention, "%s", "--paged does not take FP8 (--dtype): the paged "
                                                      "attention reads f16, bf16 or f32 pools");
    if (q_path == NULL || k_path == NULL || v_path == NULL || out_path == NULL)
        return cli_usage_error(usage_attention, "%s", "attention needs --q, --k, --v and --out");
    /* By file identity, not by name: "--out ./q.npy" or a link to q.npy
     * would truncate an input before it is read. */
    {
        const char *const names[5] = {"--q", "--k", "--v", "--out", "--lse"};
        const char *const paths[5] = {q_path, k_path, v_path, out_path, lse_path};
        if (cli_check_outputs(names, paths, 3, 5) != 0)
            return CLI_EXIT_USAGE;
    }

    /* Each file is checked on its own first, then against q, so that every
     * message names the file at fault. */
    if (load_input(q_path, &q, q_shape, sizeof q_shape) != 0 ||
        load_input(k_path, &k, k_shape, sizeof k_shape) != 0)
        goto done;
    if (k.dtype != q.dtype) {
        cli_errorf("%s: dtype %s does not match q's %s", k_path, npy_dtype_name(k.dtype),
                   npy_dtype_name(q.dtype));
        goto done;
    }
    if (k.shape[0] != q.shape[0]) {
        cli_errorf("%s: shape %s does not match q's batch %zu", k_path, k_shape, q.shape[0]);
        goto done;
    }
    if (k.shape[3] != q.shape[3]) {
        cli_errorf("%s: shape %s does not match q's head_dim %zu", k_path, k_shape, q.shape[3]);
        goto done;
    }
    if (q.shape[2] % k.shape[2] != 0) {
        cli_errorf("%s: shape %s: heads_k %zu does not divide q's heads %zu", k_path, k_shape,
                   k.shape[2], q.shape[2]);
        goto done;
    }
    if (load_input(v_path, &v, v_shape, sizeof v_shape) != 0)
        goto done;
    if (v.dtype != q.dtype) {
        cli_errorf("%s: dtype %s does not match q's %s", v_path, npy_dtype_name(v.dtype),
                   npy_dtype_name(q.dtype));
        goto done;
    }
    if (memcmp(v.shape, k.shape, 4 * sizeof k.shape[0]) != 0) {
        cli_errorf("%s: shape %s does not match k's shape %s", v_path, v_shape, k_shape);
        goto done;
    }

    desc = cli_npy_desc(&q, &k, causal, window_left, window_right, softcap, scale);
    status = flashcl_attention_desc_resolve(&desc);
    if (status != FLASHCL_SUCCESS) {
        cli_report_status(NULL, "invalid attention problem", status);
        goto done;
    }

    run_q = q.data, run_k = k.data, run_v = v.data;
    fdesc = desc;
    if (fp8 != FLASHCL_FLOAT32) {
        const void *const src[3] = {q.data, k.data, v.data};
        if (fp8_quantize_inputs(&desc, fp8, block_quant, hadamard, src, &f8, &fdesc) != 0)
            goto done;
        run_q = f8.x[0], run_k = f8.x[1], run_v = f8.x[2];
    }

    lse_shape[0] = q.shape[0];
    lse_shape[1] = q.shape[2];
    lse_shape[2] = q.shape[1];
    lse_count = lse_shape[0] * lse_shape[1] * lse_shape[2];
    out = malloc(q.count * (fp8 != FLASHCL_FLOAT32 ? sizeof(float) : npy_dtype_size(q.dtype)));
    lse = lse_path != NULL ? malloc(lse_count * sizeof *lse) : NULL;
    if (out == NULL || (lse_path != NULL && lse == NULL)) {
        cli_errorf("out of memory for the outputs");
        goto done;
    }

    ctx = cli_open_context(device);
    if (ctx == NULL)
        goto done;
    /* Two runs: the first builds (or loads) the kernels and is not what the printed time
     * measures; the second is timed and its outputs are written. */
    for (int run = 0; run < 2; run++) {
        t0 = cli_now();
        if (paged) /* prints its own reason on failure */
            status = cli_paged_forward_host(ctx, &desc, paged, q.data, k.data, v.data, out, lse);
        else
            status = flashcl_attention_forward_host(ctx, &fdesc, run_q, run_k, run_v, out, lse);
        if (run == 0)
            first = cli_now() - t0;
        elapsed = cli_now() - t0;
        if (status != FLASHCL_SUCCESS)
            break;
    }
    if (status != FLASHCL_SUCCESS) {
        if (!paged)
            cli_report_status(ctx, "attention failed", status);
        goto done;
    }
    if (write_outputs(out_path, &q, fp8 != FLASHCL_FLOAT32 ? NPY_FLOAT32 : q.dtype, out, lse_path, lse_shape, lse) !=
        0)
        goto done;
    {
        /* The device's name, without the "(platform, version...)" tail. */
        const char *name = flashcl_context_device_name(ctx);
        const char *paren = strstr(name, " (");
        printf("%s: %s %s, %.1f ms on %.*s (after an untimed first run of %.1f ms, which builds or "
               "loads "
               "the kernels)\n",
               out_path, q_shape, npy_dtype_name(q.dtype), elapsed * 1e3,
               paren ? (int)(paren - name) : (int)strlen(name), name, first * 1e3);
    }
    if (fp8 != FLASHCL_FLOAT32) {
        /* Quantization's error, not the kernel's: the float64 reference runs
         * on the inputs as they were before quantizing. */
        const double rmse = rmse_vs_float64(&desc, q.data, k.data, v.data, out, q.count);
        printf("%s: %s, %s quantization%s, out float32: RMSE %.4g against float64 attention on the unquantized "
               "inputs\n",
               out_path, cli_dtype_name(fp8), block_quant ? "per-head 64-row block" : "per-tensor",
               hadamard ? " with Hadamard rotation of q and k" : "", rmse);
    }
    rc = CLI_EXIT_OK;
done:
    flashcl_context_destroy(ctx);
    fp8_inputs_free(&f8);
    free(out);
    free(lse);
    npy_free(&q);
    npy_free(&k);
    npy_free(&v);
    return rc;
}
