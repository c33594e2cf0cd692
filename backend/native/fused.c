/* Fused decode steps for a few token rows: RMSNorm, and a mixture-of-experts layer (the k routed
   SwiGLU experts of each token, weighted, plus the shared expert) in one call. fp32 inside;
   bf16 values are rounded where the torch path rounds them before a matmul. */

#include <math.h>
#include <stdlib.h>

#include "dot.h"

INLINE float f32_id(float v) { return v; }

/* out = w * dtype(x / rms(x)), rms in fp32: torch's RMSNorm, row by row over n rows. */
#define RMS_NORM(NAME, T, LOAD, STORE)                                                   \
    int NAME(const T *x, const T *w, T *out, int64_t n, int64_t dim, float eps) {       \
        for (int64_t t = 0; t < n; t++) {                                               \
            const T *row = x + t * dim;                                                 \
            float squares = 0.0f;                                                       \
            for (int64_t i = 0; i < dim; i++) squares += LOAD(row[i]) * LOAD(row[i]);   \
            float inv = 1.0f / sqrtf(squares / (float)dim + eps);                       \
            for (int64_t i = 0; i < dim; i++) {                                         \
                float normed = LOAD(STORE(LOAD(row[i]) * inv));                         \
                out[t * dim + i] = STORE(LOAD(w[i]) * normed);                          \
            }                                                                           \
        }                                                                               \
        return 0;                                                                       \
    }

RMS_NORM(rms_norm_bf16, uint16_t, bf16_to_f32, f32_to_bf16)
RMS_NORM(rms_norm_f32, float, f32_id, f32_id)

/* One SwiGLU expert on one row: acc += coef * down(dtype(silu(gate x) * up x)).
   gate_up: [2 * inter, dim] (gate rows, then up rows; they may be two tensors: up = gate_up +
   up_offset), down: [dim, inter]; h: 2 * inter floats, act: inter values, y: dim floats. */
#define EXPERT(NAME, T, MATVEC, LOAD, STORE)                                                \
    INLINE void NAME(const T *x, const T *gate, const T *up, const T *down, int64_t dim,    \
                     int64_t inter, float coef, float *h, T *act, float *y, float *acc) {   \
        MATVEC(gate, x, h, inter, dim, 1);                                                 \
        MATVEC(up, x, h + inter, inter, dim, 1);                                           \
        for (int64_t i = 0; i < inter; i++) {                                              \
            float g = h[i];                                                                \
            act[i] = STORE(g / (1.0f + expf(-g)) * h[inter + i]);                          \
        }                                                                                  \
        MATVEC(down, act, y, dim, inter, 1);                                               \
        for (int64_t i = 0; i < dim; i++) acc[i] += coef * LOAD(STORE(y[i]));              \
    }

EXPERT(expert_bf16, uint16_t, bf16_matvec, bf16_to_f32, f32_to_bf16)
EXPERT(expert_f32, float, f32_matvec, f32_id, f32_id)

/* out[t] = sum_j coef[t, j] * expert_{ids[t, j]}(x[t]) for j < k, plus shared(x[t]) when
   shared_gate is not NULL. x [n, dim]; w13 [E, 2 * inter, dim] (gate then up rows); w2
   [E, dim, inter]; ids [n, k] int64 (checked by the caller); coef [n, k] fp32; shared_gate and
   shared_up [shared_inter, dim], shared_down [dim, shared_inter]. Returns 0, or -1 when out of
   memory. */
#define MOE(NAME, T, EXPERT_FN, STORE)                                                           \
    int NAME(const T *x, int64_t n, int64_t dim, const T *w13, const T *w2, int64_t inter,       \
             const int64_t *ids, const float *coef, int64_t k, const T *shared_gate,             \
             const T *shared_up, const T *shared_down, int64_t shared_inter, T *out) {           \
        int64_t wide = inter > shared_inter ? inter : shared_inter;                              \
        float *h = malloc(sizeof(float) * (2 * wide + 2 * dim));                                 \
        T *act = malloc(sizeof(T) * wide);                                                       \
        if (h == NULL || act == NULL) {                                                          \
            free(h);                                                                             \
            free(act);                                                                           \
            return -1;                                                                           \
        }                                                                                        \
        float *y = h + 2 * wide, *acc = y + dim;                                                 \
        for (int64_t t = 0; t < n; t++) {                                                        \
            const T *row = x + t * dim;                                                          \
            for (int64_t i = 0; i < dim; i++) acc[i] = 0.0f;                                     \
            if (shared_gate != NULL)                                                             \
                EXPERT_FN(row, shared_gate, shared_up, shared_down, dim, shared_inter, 1.0f, h,  \
                          act, y, acc);                                                          \
            for (int64_t j = 0; j < k; j++) {                                                    \
                int64_t e = ids[t * k + j];                                                      \
                const T *gate = w13 + e * 2 * inter * dim;                                       \
                EXPERT_FN(row, gate, gate + inter * dim, w2 + e * dim * inter, dim, inter,       \
                          coef[t * k + j], h, act, y, acc);                                      \
            }                                                                                    \
            for (int64_t i = 0; i < dim; i++) out[t * dim + i] = STORE(acc[i]);                  \
        }                                                                                        \
        free(h);                                                                                 \
        free(act);                                                                               \
        return 0;                                                                                \
    }

MOE(moe_bf16, uint16_t, expert_bf16, f32_to_bf16)
MOE(moe_f32, float, expert_f32, f32_id)
