/* Shared by the kernels: bf16 conversions and the dot products of R weight rows (1 or 4) with
   N rows of x (1..4), accumulated in fp32 into res[r][n]. With AVX512-BF16 pairs of bf16 values
   are multiplied and summed by vdpbf16ps; without AVX-512 the compiler vectorizes plain loops.
   GEMV_GENERIC forces the plain loops (the tests build both). */

#ifndef NATIVE_DOT_H
#define NATIVE_DOT_H

#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__) && !defined(GEMV_GENERIC)
#include <immintrin.h>
#endif

#define INLINE static inline __attribute__((always_inline))

INLINE float bf16_to_f32(uint16_t v) {
    uint32_t bits = (uint32_t)v << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Round to nearest even, as torch converts fp32 to bf16. */
INLINE uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u); /* NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

#if defined(__AVX512BF16__) && !defined(GEMV_GENERIC)

INLINE void bf16_dots(const uint16_t *w, const uint16_t *x, int64_t cols, const int R,
                      const int N, float res[4][4]) {
    __m512 acc[4][4];
    for (int r = 0; r < R; r++)
        for (int n = 0; n < N; n++) acc[r][n] = _mm512_setzero_ps();
    for (int64_t c = 0; c < cols; c += 32) {
        __mmask32 mask = cols - c >= 32 ? 0xffffffffu : (1u << (cols - c)) - 1u;
        __m512bh xs[4];
        for (int n = 0; n < N; n++)
            xs[n] = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + n * cols + c);
        for (int r = 0; r < R; r++) {
            _mm_prefetch((const char *)(w + r * cols + c) + 2048, _MM_HINT_T0);
            __m512bh ws = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + r * cols + c);
            for (int n = 0; n < N; n++) acc[r][n] = _mm512_dpbf16_ps(acc[r][n], ws, xs[n]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int n = 0; n < N; n++) res[r][n] = _mm512_reduce_add_ps(acc[r][n]);
}

#else

INLINE void bf16_dots(const uint16_t *w, const uint16_t *x, int64_t cols, const int R,
                      const int N, float res[4][4]) {
    float acc[4][4][16];
    memset(acc, 0, sizeof acc);
    int64_t c = 0;
    for (; c + 16 <= cols; c += 16)
        for (int r = 0; r < R; r++)
            for (int n = 0; n < N; n++)
                for (int j = 0; j < 16; j++)
                    acc[r][n][j] += bf16_to_f32(w[r * cols + c + j]) *
                                    bf16_to_f32(x[n * cols + c + j]);
    for (; c < cols; c++)
        for (int r = 0; r < R; r++)
            for (int n = 0; n < N; n++)
                acc[r][n][0] += bf16_to_f32(w[r * cols + c]) * bf16_to_f32(x[n * cols + c]);
    for (int r = 0; r < R; r++)
        for (int n = 0; n < N; n++) {
            float sum = 0.0f;
            for (int j = 0; j < 16; j++) sum += acc[r][n][j];
            res[r][n] = sum;
        }
}

#endif

#if defined(__AVX512F__) && !defined(GEMV_GENERIC)

INLINE void f32_dots(const float *w, const float *x, int64_t cols, const int R, const int N,
                     float res[4][4]) {
    __m512 acc[4][4];
    for (int r = 0; r < R; r++)
        for (int n = 0; n < N; n++) acc[r][n] = _mm512_setzero_ps();
    for (int64_t c = 0; c < cols; c += 16) {
        __mmask16 mask = cols - c >= 16 ? 0xffff : (__mmask16)((1u << (cols - c)) - 1u);
        __m512 xs[4];
        for (int n = 0; n < N; n++) xs[n] = _mm512_maskz_loadu_ps(mask, x + n * cols + c);
        for (int r = 0; r < R; r++) {
            _mm_prefetch((const char *)(w + r * cols + c) + 2048, _MM_HINT_T0);
            __m512 ws = _mm512_maskz_loadu_ps(mask, w + r * cols + c);
            for (int n = 0; n < N; n++) acc[r][n] = _mm512_fmadd_ps(ws, xs[n], acc[r][n]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int n = 0; n < N; n++) res[r][n] = _mm512_reduce_add_ps(acc[r][n]);
}

#else

INLINE void f32_dots(const float *w, const float *x, int64_t cols, const int R, const int N,
                     float res[4][4]) {
    float acc[4][4][16];
    memset(acc, 0, sizeof acc);
    int64_t c = 0;
    for (; c + 16 <= cols; c += 16)
        for (int r = 0; r < R; r++)
            for (int n = 0; n < N; n++)
                for (int j = 0; j < 16; j++)
                    acc[r][n][j] += w[r * cols + c + j] * x[n * cols + c + j];
    for (; c < cols; c++)
        for (int r = 0; r < R; r++)
            for (int n = 0; n < N; n++) acc[r][n][0] += w[r * cols + c] * x[n * cols + c];
    for (int r = 0; r < R; r++)
        for (int n = 0; n < N; n++) {
            float sum = 0.0f;
            for (int j = 0; j < 16; j++) sum += acc[r][n][j];
            res[r][n] = sum;
        }
}

#endif

/* y[n * out + o] = sum_c w[o, c] x[n, c] in fp32, for N rows of x (N a constant 1..4). */
INLINE void bf16_matvec(const uint16_t *w, const uint16_t *x, float *y, int64_t out,
                        int64_t cols, const int N) {
    float res[4][4];
    int64_t o = 0;
    for (; o + 4 <= out; o += 4) {
        bf16_dots(w + o * cols, x, cols, 4, N, res);
        for (int r = 0; r < 4; r++)
            for (int n = 0; n < N; n++) y[n * out + o + r] = res[r][n];
    }
    for (; o < out; o++) {
        bf16_dots(w + o * cols, x, cols, 1, N, res);
        for (int n = 0; n < N; n++) y[n * out + o] = res[0][n];
    }
}

INLINE void f32_matvec(const float *w, const float *x, float *y, int64_t out, int64_t cols,
                       const int N) {
    float res[4][4];
    int64_t o = 0;
    for (; o + 4 <= out; o += 4) {
        f32_dots(w + o * cols, x, cols, 4, N, res);
        for (int r = 0; r < 4; r++)
            for (int n = 0; n < N; n++) y[n * out + o + r] = res[r][n];
    }
    for (; o < out; o++) {
        f32_dots(w + o * cols, x, cols, 1, N, res);
        for (int n = 0; n < N; n++) y[n * out + o] = res[0][n];
    }
}

#endif
