/* kv_cache.cl: appending new K/V tokens of many sequences into the paged KV pool in one launch.
 *
 * The pool holds fixed-size pages; a token's place is a "slot", page * page_size + offset:
 *
 *   k_pool, v_pool: [num_pages][page_size][heads_k][head_dim]   (= [slot][heads_k][head_dim])
 *
 * The host allocator (src/kv_cache.c) has already chosen every new token's
 * slot (new pages, copy-on-write copies) and passes them as slots[token],
 * then the device page-table entries the append creates;
 * the kernel is a gather-free scatter: work-item (d, h, token) copies one element
 * of the caller's packed new tokens, k_new[token][h][d] (offset + strides),
 * to its slot. Copies go through float, which is exact for all three storage
 * types (half and bfloat16 widen losslessly), because OpenCL 1.2 without
 * cl_khr_fp16 cannot move a `half` other than through vload/vstore.
 *
 * FP8 pages (built with -DKV_FP8=3 or 4, common.cl): the pools are bytes and
 * each element is quantized on the way in, byte = encode(x * inv[h]), inv
 * being the kv head's 1.0f / scale from `scales` ([heads_k][4]: k descale,
 * v descale, k inverse, v inverse; src/kv_cache.c rounds the inverses once on
 * the host). A multiply by a host-rounded inverse, not a division on the
 * device, so the bytes are the host helper's flashcl_fp8_encode(x * inv) on
 * every device. The scales are static per kv head: a later append into a
 * partly filled or shared page never has to touch bytes already written.
 * Nothing is tunable; sizes are run-time arguments.
 */

/* Built with SLOT_ARG_INTS > 0 the list (slots, then pairs) comes by value
 * in slot_arg, after the other arguments, instead of in `slots` (unread
 * then): an append is then one kernel launch, no upload. */
#ifndef SLOT_ARG_INTS
#define SLOT_ARG_INTS 0
#endif
#if SLOT_ARG_INTS
typedef struct slot_list {
    int v[SLOT_ARG_INTS];
} slot_list;
#define SLOT_LIST_ARG , slot_list slot_arg
#define SLOT(i) slot_arg.v[i]
#else
#define SLOT_LIST_ARG
#define SLOT(i) slots[i]
#endif

#if KV_FP8
#define KV_SCALES_ARG , __global const float *restrict scales
#define K_IN(x, h) ((x) * scales[4 * (h) + 2]) /* times the quantizing multiplier 1.0f / scale */
#define V_IN(x, h) ((x) * scales[4 * (h) + 3])
#else
#define KV_SCALES_ARG
#define K_IN(x, h) (x) /* 16/32-bit pages: a plain copy, bit for bit */
#define V_IN(x, h) (x)
#endif

__kernel void kv_append(__global const elem_t *restrict k_new, __global const elem_t *restrict v_new,
                        __global kv_t *restrict k_pool, __global kv_t *restrict v_pool,
                        __global const int *restrict slots, __global int *restrict tables, ulong k_off,
                        ulong k_ss, ulong k_sh, ulong v_off, ulong v_ss, ulong v_sh, int heads_k,
                        int head_dim, int num_pairs KV_SCALES_ARG SLOT_LIST_ARG) {
    const int d = (int)get_global_id(0);
    const int h = (int)get_global_id(1);
    const int t = (int)get_global_id(2);
    /* The device page tables' new entries, (index, page) pairs after the
     * slots, shared out over the tokens' first work-items. */
    if (d == 0 && h == 0) {
        const int total = (int)get_global_size(2);
        for (int p = t; p < num_pairs; p += total)
            tables[SLOT(total + 2 * p)] = SLOT(total + 2 * p + 1);
    }
    /* Pool rows are packed: heads_k * head_dim elements per slot. */
    const ulong dst = ((ulong)SLOT(t) * heads_k + h) * head_dim + d;
    STORE_KV(k_pool, dst, K_IN(LOAD_ELEM(k_new, k_off + (ulong)t * k_ss + (ulong)h * k_sh + d), h));
    STORE_KV(v_pool, dst, V_IN(LOAD_ELEM(v_new, v_off + (ulong)t * v_ss + (ulong)h * v_sh + d), h));
}
