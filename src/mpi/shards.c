/* shards.c: cutting a whole host tensor into a rank's zigzag shard and gathering the shards
 * back (include/flashcl_mpi.h), for callers that hold the global tensor on the host: tests,
 * tools, data loaders. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "flashcl_mpi.h"

/* The arguments both helpers share: a packed [outer][seqlen][row_bytes] tensor. */
static int shape_ok(int outer, int seqlen, size_t row_bytes, int nranks, int rank) {
    return outer >= 0 && seqlen >= 0 && row_bytes > 0 && nranks >= 1 && rank >= 0 && rank < nranks;
}

/* Copies rank's rows from global into its shard (to_shard) or back. */
static void copy_rows(char *global, char *shard, int to_shard, int outer, int seqlen,
                      size_t row_bytes, int nranks, int rank) {
    const int n = flashcl_cp_local_len(seqlen, nranks, rank);
    for (int o = 0; o < outer; ++o)
        for (int l = 0; l < n; ++l) {
            char *g = global + ((size_t)o * (size_t)seqlen +
                                (size_t)flashcl_cp_global_row(seqlen, nranks, rank, l)) *
                                   row_bytes;
            char *s = shard + ((size_t)o * (size_t)n + (size_t)l) * row_bytes;
            memcpy(to_shard ? s : g, to_shard ? g : s, row_bytes);
        }
}

flashcl_status flashcl_cp_take_shard(const void *global, void *shard, int outer, int seqlen,
                                     size_t row_bytes, int nranks, int rank) {
    if (!shape_ok(outer, seqlen, row_bytes, nranks, rank))
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    if (outer > 0 && flashcl_cp_local_len(seqlen, nranks, rank) > 0 && (!global || !shard))
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    copy_rows((char *)global, shard, 1, outer, seqlen, row_bytes, nranks, rank);
    return FLASHCL_SUCCESS;
}

flashcl_status flashcl_cp_gather_shards(MPI_Comm comm, int root, const void *shard, void *global,
                                        int outer, int seqlen, size_t row_bytes) {
    int rank = 0, size = 0;
    if (MPI_Comm_rank(comm, &rank) != MPI_SUCCESS || MPI_Comm_size(comm, &size) != MPI_SUCCESS)
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    /* outer, seqlen, row_bytes and root agree across ranks, as for any
     * collective, so every rank refuses bad sizes alike, before any message. */
    if (!shape_ok(outer, seqlen, row_bytes, size, 0) || row_bytes > INT_MAX || root < 0 ||
        root >= size)
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    int *counts = malloc(sizeof(int) * (size_t)size), *displs = malloc(sizeof(int) * (size_t)size);
    size_t total = 0;
    int fits = 1;
    for (int r = 0; fits && r < size; ++r) {
        /* MPI counts and displacements are int. */
        const size_t per = (size_t)flashcl_cp_local_len(seqlen, size, r) * row_bytes; /* < 2^62 */
        fits = per <= INT_MAX && (outer == 0 || per <= INT_MAX / (size_t)outer);
        const size_t c = fits ? per * (size_t)outer : 0;
        fits = fits && total <= INT_MAX - c;
        if (fits && counts && displs) {
            counts[r] = (int)c;
            displs[r] = (int)total;
        }
        total += c;
    }
    if (!fits) {
        free(counts), free(displs);
        return FLASHCL_ERROR_INVALID_ARGUMENT;
    }
    char *all = counts && displs && rank == root ? malloc(total + 1) : NULL;
    /* Only the pointers and the allocations are local: one allreduce of the
     * worst local problem (0 none, 1 a NULL where bytes are due, 2 out of
     * memory) gives every rank the same answer before any data moves. */
    int problem = !counts || !displs || (rank == root && !all)                     ? 2
                  : (!shard && counts[rank]) || (rank == root && !global && total) ? 1
                                                                                   : 0,
        worst = 0;
    MPI_Allreduce(&problem, &worst, 1, MPI_INT, MPI_MAX, comm);
    flashcl_status st = worst == 2   ? FLASHCL_ERROR_OUT_OF_HOST_MEMORY
                        : worst == 1 ? FLASHCL_ERROR_INVALID_ARGUMENT
                                     : FLASHCL_SUCCESS;
    if (st == FLASHCL_SUCCESS) {
        MPI_Gatherv(shard, counts[rank], MPI_BYTE, all, counts, displs, MPI_BYTE, root, comm);
        for (int r = 0; rank == root && r < size; ++r)
            copy_rows(global, all + displs[r], 0, outer, seqlen, row_bytes, size, r);
    }
    free(all);
    free(counts);
    free(displs);
    return st;
}
