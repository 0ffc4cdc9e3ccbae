/* serving_cli.h: the CLI's serving pieces: `attention --paged` and `bench --decode`. */
#ifndef FLASHCL_TOOLS_SERVING_CLI_H
#define FLASHCL_TOOLS_SERVING_CLI_H

#include "flashcl.h"

/* flashcl_attention_forward_host's job done through a paged KV cache: each
 * batch entry becomes a sequence whose K/V are appended to a cache of
 * `page_size`-token pages handed out in a shuffled order, then attended with
 * flashcl_paged_attention. desc must be resolved, with packed layouts and no
 * window other than causal. lse (may be NULL) as the forward's
 * [batch][heads_q][seqlen_q]. Prints the reason on failure. */
flashcl_status cli_paged_forward_host(flashcl_context *ctx, const flashcl_attention_desc *desc,
                                      int page_size, const void *q, const void *k, const void *v,
                                      void *out, float *lse);

/* `flashcl bench --decode ...`: its own options (see the usage text). */
extern const char cli_usage_bench_decode[];
int cli_bench_decode(int argc, char **argv);

#endif
