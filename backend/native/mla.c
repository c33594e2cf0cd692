/* Weight-absorbed MLA decode: one new token of one sequence attending over its paged latent
   cache, every head, in fp32 (as the torch path computes it).

   q_nope [H, nope], q_pe [H, rope] (rotated); kv: the cache layer [slots, r + rope] with rows
   [c_kv | k_pe]; table [ceil(L / block)] block ids; kv_b [H * (nope + v), r] (per head W_UK rows
   then W_UV rows); out [H, v]. scratch: r + (r + rope) + L floats. */

#include <math.h>
#include <stdlib.h>

#include "dot.h"

INLINE float f32_load(float v) { return v; }

#define MLA_DECODE(NAME, T, LOAD, STORE)                                                        \
    int NAME(const T *q_nope, const T *q_pe, const T *kv, const int64_t *table, int64_t length,  \
             int64_t block, const T *kv_b, int64_t heads, int64_t nope, int64_t rope,           \
             int64_t v_dim, int64_t r, float scale, T *out) {                                   \
        int64_t width = r + rope;                                                               \
        float *query = malloc(sizeof(float) * (width + r + length));                             \
        if (query == NULL) return -1;                                                           \
        float *latent = query + width, *scores = latent + r;                                    \
        for (int64_t h = 0; h < heads; h++) {                                                   \
            const T *w_uk = kv_b + h * (nope + v_dim) * r, *w_uv = w_uk + nope * r;             \
            for (int64_t c = 0; c < r; c++) query[c] = 0.0f;                                    \
            for (int64_t n = 0; n < nope; n++) {                                                \
                float q = LOAD(q_nope[h * nope + n]);                                           \
                for (int64_t c = 0; c < r; c++) query[c] += q * LOAD(w_uk[n * r + c]);          \
            }                                                                                   \
            for (int64_t c = 0; c < rope; c++) query[r + c] = LOAD(q_pe[h * rope + c]);         \
            float top = -INFINITY;                                                              \
            for (int64_t l = 0; l < length; l++) {                                              \
                const T *row = kv + (table[l / block] * block + l % block) * width;             \
                float lanes[16] = {0};                                                          \
                int64_t c = 0;                                                                  \
                for (; c + 16 <= width; c += 16)                                                \
                    for (int j = 0; j < 16; j++) lanes[j] += query[c + j] * LOAD(row[c + j]);   \
                for (; c < width; c++) lanes[0] += query[c] * LOAD(row[c]);                     \
                float dot = 0.0f;                                                               \
                for (int j = 0; j < 16; j++) dot += lanes[j];                                   \
                scores[l] = dot * scale;                                                        \
                top = scores[l] > top ? scores[l] : top;                                        \
            }                                                                                   \
            float total = 0.0f;                                                                 \
            for (int64_t l = 0; l < length; l++) total += scores[l] = expf(scores[l] - top);   \
            for (int64_t c = 0; c < r; c++) latent[c] = 0.0f;                                   \
            for (int64_t l = 0; l < length; l++) {                                              \
                const T *row = kv + (table[l / block] * block + l % block) * width;             \
                float p = scores[l] / total;                                                    \
                for (int64_t c = 0; c < r; c++) latent[c] += p * LOAD(row[c]);                  \
            }                                                                                   \
            for (int64_t o = 0; o < v_dim; o++) {                                               \
                float lanes[16] = {0};                                                          \
                int64_t c = 0;                                                                  \
                for (; c + 16 <= r; c += 16)                                                    \
                    for (int j = 0; j < 16; j++) lanes[j] += latent[c + j] * LOAD(w_uv[o * r + c + j]); \
                for (; c < r; c++) lanes[0] += latent[c] * LOAD(w_uv[o * r + c]);               \
                float dot = 0.0f;                                                               \
                for (int j = 0; j < 16; j++) dot += lanes[j];                                   \
                out[h * v_dim + o] = STORE(dot);                                                \
            }                                                                                   \
        }                                                                                       \
        free(query);                                                                            \
        return 0;                                                                               \
    }

MLA_DECODE(mla_decode_bf16, uint16_t, bf16_to_f32, f32_to_bf16)
MLA_DECODE(mla_decode_f32, float, f32_load, f32_load)
