/* bench_cli.h: `flashcl bench`, the forward benchmark (tools/bench_cli.c). */
#ifndef FLASHCL_TOOLS_BENCH_CLI_H
#define FLASHCL_TOOLS_BENCH_CLI_H

extern const char usage_bench[];
int cmd_bench(int argc, char **argv);

#endif
