/* ex2_probe.cl: ex2_fma (cl/common.cl) over an array, for tests/test_fp8_forward.c. */
__kernel void ex2_probe(__global const float *x, __global float *y, int n) {
    const int i = (int)get_global_id(0);
    if (i < n)
        y[i] = ex2_fma(x[i]);
}
