/* spec.h: what spec.c and spec_host.c share: the resolved constants of a verification. */
#ifndef FLASHCL_SPEC_H
#define FLASHCL_SPEC_H

#include <stdint.h>

#include "internal.h"

/* Numbers every implementation derives from a desc the same way. */
typedef struct spec_consts {
    uint64_t lo, hi; /* accepted fixed-point row sums, [ceil((1-tol) 2^39), floor((1+tol) 2^39)] */
    float s;         /* logits scale log2(e) / temperature rounded to float (1 when unused) */
} spec_consts;

void flashcl_spec_consts(const flashcl_spec_desc *desc, spec_consts *c);

/* The C implementation (src/spec_host.c), bit-exact with the kernel and
 * host_ref; writes accepted and tokens like the kernel. Returns 0, or -1 when
 * out of memory (nothing written). */
int flashcl_spec_host_verify(const flashcl_spec_desc *desc, const spec_consts *c, const int *draft,
                             const float *q, const float *p, int *accepted, int *tokens);

#endif
