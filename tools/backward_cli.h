/* backward_cli.h: the CLI's backward pieces: `attention --backward` and `bench --backward`. */
#ifndef FLASHCL_TOOLS_BACKWARD_CLI_H
#define FLASHCL_TOOLS_BACKWARD_CLI_H

#include "flashcl.h"

/* `flashcl attention --backward ...` and `flashcl bench --backward ...`:
 * their own options (see the usage texts). */
extern const char cli_usage_attention_backward[];
extern const char cli_usage_bench_backward[];
int cli_attention_backward(int argc, char **argv);
int cli_bench_backward(int argc, char **argv);

#endif
