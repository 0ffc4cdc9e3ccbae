/* mask_probe.cl: MASK_16 (cl/common_nv.cl), the tensor-core forward kernels' mask, on any device,
 * for tests/test_forward.c. Case i is seven ints: n0, t (the lane's column in its quad), lo[0],
 * lo[1], hi[0], hi[1], with_lo. Its 16 n8 blocks of scores (128 keys: the FP8 kernel's tile) start
 * at 1 and go through the macro; bit 4j + e of masked[3i + (j >= 8)] says (j, e) became -inf, and
 * masked[3i + 2] counts the scores it left neither 1 nor -inf (none should be). */
#define PROBE_FRAGS 16

__kernel void mask_probe(__global const int *cases, __global uint *masked, int n) {
    const int i = (int)get_global_id(0);
    if (i >= n)
        return;
    __global const int *c = cases + 7 * i;
    const int n0 = c[0], t = c[1], with_lo = c[6];
    const int lo[2] = {c[2], c[3]}, hi[2] = {c[4], c[5]};
    float s[PROBE_FRAGS][4];
    for (int j = 0; j < PROBE_FRAGS; ++j)
        for (int e = 0; e < 4; ++e)
            s[j][e] = 1.0f;
    MASK_16(s, PROBE_FRAGS, n0, lo, hi, with_lo);
    uint bits[2] = {0u, 0u}, other = 0u;
    for (int j = 0; j < PROBE_FRAGS; ++j)
        for (int e = 0; e < 4; ++e) {
            if (s[j][e] == -INFINITY)
                bits[j >> 3] |= 1u << (4 * (j & 7) + e);
            other += s[j][e] != -INFINITY && s[j][e] != 1.0f;
        }
    masked[3 * i] = bits[0];
    masked[3 * i + 1] = bits[1];
    masked[3 * i + 2] = other;
}
