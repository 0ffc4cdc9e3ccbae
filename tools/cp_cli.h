/* cp_cli.h: the CLI's context-parallel pieces (tools/cp_cli.c, built with MPI only). */
#ifndef FLASHCL_TOOLS_CP_CLI_H
#define FLASHCL_TOOLS_CP_CLI_H

/* `flashcl attention --context-parallel ...` (bench 0) and `flashcl bench
 * --context-parallel ...` (bench 1), run under mpirun: initialises and
 * finalises MPI itself. Returns the tool's exit status (the same on every rank). */
int cli_context_parallel(int argc, char **argv, int bench);
extern const char cli_usage_attention_cp[];
extern const char cli_usage_bench_cp[];

#endif
