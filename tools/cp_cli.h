/* cp_cli.h: the CLI's context-parallel pieces (tools/cp_cli.c, built with MPI only). */
#ifndef FLASHCL_TOOLS_CP_CLI_H
#define FLASHCL_TOOLS_CP_CLI_H

/* `flashcl attention --context-parallel ...` (bench 0) and `flashcl bench
 * --context-parallel ...` (bench 1), run under mpirun: initialises and
 * finalises MPI itself. Returns the tool's exit status (the same on every rank). */
#ifdef FLASHCL_WITH_MPI
int cli_context_parallel(int argc, char **argv, int bench);
extern const char cli_usage_attention_cp[];
extern const char cli_usage_bench_cp[];
#else
#include <stdio.h>
/* Built without MPI (FLASHCL_WITH_MPI off): --context-parallel says so. */
static inline int cli_context_parallel(int argc, char **argv, int bench) {
    (void)argc, (void)argv, (void)bench;
    fprintf(stderr, "flashcl: --context-parallel needs MPI, and this flashcl was built without it "
                    "(install libopenmpi-dev and rebuild with -DFLASHCL_WITH_MPI=ON)\n");
    return 2;
}
#endif

#endif
