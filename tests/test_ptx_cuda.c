/* test_ptx_cuda.c: bench/ptx_cuda.c's PTX text rewrites on hand-written PTX, without a GPU.
 *
 * Why a test for a bench tool: the NVIDIA profiling harness (bench/ptx_harness.c) and its study of
 * tiles past 48 KB run only on a lent GPU, with minutes of device time; a rewrite that stopped
 * matching the kernels' PTX (a renamed tile array, a changed declaration) would waste that time.
 * The texts below follow the two shapes seen: clang's (the tile array declared inside the entry)
 * and a module-scope declaration, with OpenCL's launch-environment registers, .ptr qualifiers and
 * src/program.c's sm_90a markers. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "ptx_cuda.h"

static int failures;

static const char function_scope[] =
    ".version 8.3\n"
    ".target sm_90\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry flash_bwd_dkdv_sm90(\n"
    "\t.param .u64 .ptr .global .align 2 flash_bwd_dkdv_sm90_param_0,\n"
    "\t.param .u32 flash_bwd_dkdv_sm90_param_1\n"
    ")\n"
    "{\n"
    "\t.reg .b32 %r<4>;\n"
    "\t.shared .align 1024 .b8 flash_bwd_dkdv_sm90_$_smem_raw[1024];\n"
    "\t.shared .align 4 .b8 flash_bwd_dkdv_sm90_$_stats[256];\n"
    "\tmov.b32 %r1, %envreg6;\n"
    "\tmov.b32 %r2, %envreg3;\n"
    "//@sm90a wgmma.fence.sync.aligned;\n"
    "\tret;\n"
    "}\n";

static const char module_scope[] =
    ".version 8.3\n"
    ".target sm_90a\n"
    ".address_size 64\n"
    "\n"
    ".shared .align 1024 .b8 flash_bwd_dq_sm90$smem_raw[1024];\n"
    "\n"
    ".visible .entry flash_bwd_dq_sm90(\n"
    "\t.param .u64 flash_bwd_dq_sm90_param_0\n"
    ")\n"
    "{\n"
    "\tret;\n"
    "}\n";

/* How often needle occurs in text. */
static int count(const char *text, const char *needle) {
    int n = 0;
    for (const char *at = text; (at = strstr(at, needle)) != NULL; at += strlen(needle))
        ++n;
    return n;
}

int main(void) {
    char *unmasked = unmask_sm90a(function_scope);
    expect(strstr(unmasked, ".target sm_90a\n") && !strstr(unmasked, "//@sm90a") &&
               strstr(unmasked, "\nwgmma.fence.sync.aligned;"),
           "unmask_sm90a: the target becomes sm_90a and the markers go", &failures);
    int envregs = 0;
    char *translated = translate(unmasked, &envregs);
    expect(translated && !strstr(translated, ".ptr") && !strstr(translated, "%envreg") &&
               strstr(translated, "mov.u32 %r1, %nctaid.x;") && strstr(translated, "mov.b32 %r2, 0;") &&
               envregs == ((1 << 6) | (1 << 3)),
           "translate: .ptr qualifiers dropped, %envreg6 is %nctaid.x (mov.u32), %envreg3 is 0", &failures);
    char bad[] = "mov.b32 %r1, %envreg12;\n";
    int seen = 0;
    char *refused = translate(bad, &seen);
    expect(refused == NULL, "translate refuses an %envreg with no CUDA equivalent", &failures);
    free(refused);

    char *dyn = translated ? dynamic_tiles(translated) : NULL;
    const char *ext = dyn ? strstr(dyn, ".extern .shared .align 1024 .b8 flash_bwd_dkdv_sm90_$_smem_raw[];") : NULL;
    const char *entry = dyn ? strstr(dyn, ".visible .entry flash_bwd_dkdv_sm90(") : NULL;
    expect(dyn && ext && entry && ext < entry && !strstr(dyn, "smem_raw[1024]") &&
               count(dyn, "smem_raw") == 1 && strstr(dyn, "flash_bwd_dkdv_sm90_$_stats[256];"),
           "dynamic_tiles: a function-scope tile array becomes one module-scope .extern before the entry, "
           "the other arrays stay",
           &failures);
    char *dyn2 = dynamic_tiles(module_scope);
    ext = dyn2 ? strstr(dyn2, ".extern .shared .align 1024 .b8 flash_bwd_dq_sm90$smem_raw[];") : NULL;
    entry = dyn2 ? strstr(dyn2, ".visible .entry flash_bwd_dq_sm90(") : NULL;
    expect(dyn2 && ext && entry && ext < entry && count(dyn2, "smem_raw") == 1,
           "dynamic_tiles: a module-scope declaration is replaced in place", &failures);
    expect(dynamic_tiles(".version 8.3\n.visible .entry k()\n{\n\tret;\n}\n") == NULL,
           "dynamic_tiles: no tile array, no rewrite (NULL)", &failures);

    char name[64];
    size_t sizes[8];
    int is_ptr[8] = {0};
    expect(find_entry(function_scope, "flash_bwd_dkdv", NULL, name, sizeof name) &&
               !strcmp(name, "flash_bwd_dkdv_sm90") && entry_params(function_scope, name, sizes, is_ptr, 8) == 2 &&
               sizes[0] == 8 && sizes[1] == 4 && is_ptr[0] == 1 && is_ptr[1] == 0,
           "find_entry and entry_params read the entry's name, parameter sizes and pointers", &failures);
    free(unmasked), free(translated), free(dyn), free(dyn2);
    printf("%s\n", failures ? "FAILED" : "all passed");
    return failures ? 1 : 0;
}
