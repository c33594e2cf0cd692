/* y[n, out] = x[n, in] @ w[out, in]^T for n in 1..4 (decode at batch 1 to 4) on one thread.
   Weights and x contiguous, row-major; fp32 accumulation; bf16 results rounded to nearest even,
   as torch rounds its fp32 accumulator. Four weight rows at a time share each load of x. */

#include "dot.h"

/* bf16 rows: four output rows at a time go through a small fp32 buffer. */
INLINE void bf16_gemv_n(const uint16_t *w, const uint16_t *x, uint16_t *y, int64_t out,
                        int64_t cols, const int N) {
    float res[4][4];
    int64_t o = 0;
    for (; o + 4 <= out; o += 4) {
        bf16_dots(w + o * cols, x, cols, 4, N, res);
        for (int r = 0; r < 4; r++)
            for (int n = 0; n < N; n++) y[n * out + o + r] = f32_to_bf16(res[r][n]);
    }
    for (; o < out; o++) {
        bf16_dots(w + o * cols, x, cols, 1, N, res);
        for (int n = 0; n < N; n++) y[n * out + o] = f32_to_bf16(res[0][n]);
    }
}

/* Returns 0, or -1 when n is outside 1..4. */
int gemv_bf16(const uint16_t *w, const uint16_t *x, uint16_t *y, int64_t out, int64_t cols,
              int64_t n) {
    switch (n) {
    case 1: bf16_gemv_n(w, x, y, out, cols, 1); return 0;
    case 2: bf16_gemv_n(w, x, y, out, cols, 2); return 0;
    case 3: bf16_gemv_n(w, x, y, out, cols, 3); return 0;
    case 4: bf16_gemv_n(w, x, y, out, cols, 4); return 0;
    default: return -1;
    }
}

int gemv_f32(const float *w, const float *x, float *y, int64_t out, int64_t cols, int64_t n) {
    switch (n) {
    case 1: f32_matvec(w, x, y, out, cols, 1); return 0;
    case 2: f32_matvec(w, x, y, out, cols, 2); return 0;
    case 3: f32_matvec(w, x, y, out, cols, 3); return 0;
    case 4: f32_matvec(w, x, y, out, cols, 4); return 0;
    default: return -1;
    }
}
