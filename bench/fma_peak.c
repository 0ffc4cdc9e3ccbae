/* fma_peak.c: the float32 FMA throughput this CPU reaches, the ceiling the CPU benchmarks are read against.
 *
 * Each thread runs CHAINS independent vector FMA chains (enough to cover the
 * FMA latency on current x86 and Arm cores) in a loop the compiler cannot
 * shorten; GFLOP/s = 2 * lanes * CHAINS * iterations / seconds, summed over
 * threads. Built by bench/cpu.sh with -O2 -march=native, so the vectors are
 * the widest this machine has (GCC/Clang vector extensions, no intrinsics).
 *
 *   fma_peak [THREADS]       (default: the online CPUs)
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#if defined(__AVX512F__)
#define LANES 16
#elif defined(__AVX__)
#define LANES 8
#else
#define LANES 4
#endif
#define CHAINS 16
#define ITERS 50000000L

typedef float vec __attribute__((vector_size(LANES * sizeof(float))));

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *run(void *out) {
    vec acc[CHAINS], a, b;
    for (int i = 0; i < LANES; ++i) {
        a[i] = 0.999999f;
        b[i] = 1e-7f;
    }
    for (int c = 0; c < CHAINS; ++c)
        acc[c] = a * (float)c;
    for (long it = 0; it < ITERS; ++it) {
        /* The asm makes a and b opaque each round, so the loop stays a loop of FMAs. */
        __asm__ volatile("" : "+x"(a), "+x"(b));
#pragma GCC unroll 16 /* the chains must live in registers, not in acc[] in memory */
        for (int c = 0; c < CHAINS; ++c)
            acc[c] = acc[c] * a + b;
    }
    float sum = 0.0f;
    for (int c = 0; c < CHAINS; ++c)
        for (int i = 0; i < LANES; ++i)
            sum += acc[c][i];
    *(float *)out = sum;
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads < 1 || threads > 1024) {
        fprintf(stderr, "usage: fma_peak [THREADS]\n");
        return 2;
    }
    pthread_t *tid = malloc((size_t)threads * sizeof *tid);
    float *sums = malloc((size_t)threads * sizeof *sums);
    if (!tid || !sums)
        return 1;
    const double t0 = now();
    for (int t = 0; t < threads; ++t)
        pthread_create(&tid[t], NULL, run, &sums[t]);
    for (int t = 0; t < threads; ++t)
        pthread_join(tid[t], NULL);
    const double s = now() - t0;
    float check = 0.0f;
    for (int t = 0; t < threads; ++t)
        check += sums[t];
    const double gflops = 2.0 * LANES * CHAINS * (double)ITERS * threads / s / 1e9;
    printf("{\"threads\": %d, \"lanes\": %d, \"gflops\": %.1f, \"checksum\": %g}\n", threads, LANES, gflops,
           (double)check);
    free(tid);
    free(sums);
    return 0;
}
