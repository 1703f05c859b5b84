/*
 * opbridge's native CPU kernels: the CPython extension opbridge.ops._cpu_kernels.
 *
 * grid_sample: F.grid_sample (bilinear, nearest or bicubic) of a float32 NCHW input into a float32
 * output the caller owns (ONNX Runtime's output buffer, through the bridge). ATen's CPU kernel
 * works on vectors of output points and, for every channel, gathers each tap again (bicubic also
 * recomputes each of its 16 taps' padded coordinate, bounds mask and offset). Here the taps are
 * computed once per output point, for a tile of points, and the taps of every channel are read
 * from a channels-last copy of the image (one row of S values per tap, the C channels and zeros up
 * to S: a vector of 4 or 8 for up to 8 channels, else grid_channel_stride; a row of zeros for the
 * taps outside), then the tile's results are transposed into the output planes (with one channel,
 * two for nearest, on CPUs with AVX2: eight points per vector, their taps gathered from the input
 * planes themselves, no copy; see "few channels"). The arithmetic
 * follows ATen's vectorized CPU kernel operation by operation (unnormalize, padding, weights or
 * cubic coefficients, the order of the sums; nearest rounds half to even and copies the tap's
 * bits). The file is compiled with
 * -ffp-contract=off (each product rounded, except the unnormalize that ATen's build fuses, an fmaf
 * here) and -fno-trapping-math (floorf and rintf vectorize): bilinear and bicubic results are
 * within a few float32 ulps of F.grid_sample's, whose build may fuse some other products; nearest's
 * are F.grid_sample's bit for bit.
 *
 * resize_bicubic: F.interpolate(mode="bicubic"), separable (see its section).
 *
 * roi_align: MMCV's roi_align from channels-last features (the same layout copy): each sample's four
 * corner pixels are contiguous rows of channels (see its section).
 *
 * Buffers come in through the buffer protocol (numpy arrays over torch tensors); their lengths
 * are checked against the sizes before anything is read or written, so a wrong call raises
 * ValueError instead of touching memory outside them. The GIL is released while the kernel runs:
 * Python threads split the work (output points, planes or rows, RoIs: start, end) between them.
 *
 * grid_sample, resize_bicubic and roi_align are also native kernels (their section at the end):
 * capsules of opbridge's native kernel ABI (../_native_kernel.h), which ONNX Runtime's bridge runs
 * without Python, on ONNX Runtime's tensors (sizes from their shapes) and its intra-op threads.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "../_native_kernel.h"

#define TILE 128 /* output points whose taps are computed together, then swept channel by channel */

/* the sampling loops are also built for x86-64-v3 (AVX2 and FMA; the clone is picked at load time) */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define OPB_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define OPB_CLONES
#endif

/* ------------------------------------------------------------------ one spatial axis */

typedef struct {
    float scale;      /* unnormalize: (g + 1) * scale - shift */
    float shift;      /* 0.5 without align_corners, else 0 */
    float max_val;    /* size - 1: the clip limit */
    float low;        /* reflection: the span starts here (-0.5 without align_corners) */
    float twice_span; /* reflection: twice the span (0 for one pixel with align_corners) */
    int size;
    int padding; /* 0 zeros, 1 border, 2 reflection */
} axis_t;

static void axis_init(axis_t *a, int size, int align, int padding) {
    a->size = size;
    a->padding = padding;
    a->max_val = (float)(size - 1);
    a->shift = align ? 0.0f : 0.5f;
    if (align) {
        a->scale = (float)(size - 1) / 2;
        a->low = 0.0f;
        a->twice_span = (float)(size - 1) * 2;
    } else {
        a->scale = (float)size / 2;
        a->low = -0.5f;
        a->twice_span = (float)size * 2;
    }
}

/* (g + 1) * scale [- 0.5] with one rounding, as ATen's vectorized kernels fuse it (one instruction
   in the x86-64-v3 clone) */
static inline float unnormalize(const axis_t *a, float g) {
    return fmaf(g + 1.0f, a->scale, -a->shift);
}

/* clamp to [0, size - 1]; NaN becomes 0 (ATen orders its clamp so) */
static inline float clip(const axis_t *a, float v) {
    v = v > 0.0f ? v : 0.0f;
    return v < a->max_val ? v : a->max_val;
}

/* an empty span (size 1 with align_corners) gives NaN here, which clip turns into 0, ATen's value;
   the remainder is one fused multiply-add, as ATen's vectorized reflection is built (a coordinate of
   2**25 pixels or more picks another pixel where the product is rounded first) */
static inline float reflect(const axis_t *a, float v) {
    const float ts = a->twice_span;
    const float abs_in = fabsf(v - a->low);
    const float flips = truncf(abs_in / ts);
    const float extra = fmaf(-flips, ts, abs_in);
    const float back = ts - extra;
    return (extra < back ? extra : back) + a->low;
}

/* a tap coordinate as an index (truncated, as ATen converts), or -1 where the tap reads zeros:
   outside the plane or NaN (ATen's bounds mask); branch-free */
static inline int32_t index_of(const axis_t *a, float v) {
    return (int32_t)((v > -1.0f) & (v < (float)a->size) ? v : -1.0f);
}
/* bicubic pads each tap's coordinate, bilinear the unnormalized coordinate */
static inline float pad_zeros(const axis_t *a, float v) {
    (void)a;
    return v;
}
static inline float pad_border(const axis_t *a, float v) { return clip(a, v); }
static inline float pad_reflection(const axis_t *a, float v) { return clip(a, reflect(a, v)); }

/* ------------------------------------------------------------------ vectors (GCC / Clang extensions) */

typedef float v4f __attribute__((vector_size(16)));
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v4i __attribute__((vector_size(16)));
/* the same vectors at any float's address (loads and stores straight from and to the buffers) */
typedef float v4f_u __attribute__((vector_size(16), aligned(4), may_alias));
typedef float v8f_u __attribute__((vector_size(32), aligned(4), may_alias));

/* r[j][i] becomes r[i][j] */
static inline void transpose4(v4f r[4]) {
    const v4i lo = {0, 4, 1, 5}, hi = {2, 6, 3, 7}, first = {0, 1, 4, 5}, second = {2, 3, 6, 7};
    const v4f t0 = __builtin_shuffle(r[0], r[1], lo), t1 = __builtin_shuffle(r[2], r[3], lo);
    const v4f t2 = __builtin_shuffle(r[0], r[1], hi), t3 = __builtin_shuffle(r[2], r[3], hi);
    r[0] = __builtin_shuffle(t0, t1, first);
    r[1] = __builtin_shuffle(t0, t1, second);
    r[2] = __builtin_shuffle(t2, t3, first);
    r[3] = __builtin_shuffle(t2, t3, second);
}

/* ------------------------------------------------------------------ the kernel */

enum { BILINEAR = 0, NEAREST = 1, BICUBIC = 2 }; /* F.grid_sample's codes */

/* a tile of output points: weights and tap indices per axis, then the taps' rows of the
   channels-last image (row H * W, all zeros, for a tap outside) */
typedef struct {
    float cx[4][TILE], cy[4][TILE];
    int32_t xi[4][TILE], yi[4][TILE];
    int32_t row[16][TILE];
} tile_t;

/* weights and tap indices along one axis for `count` points; g: their coordinates, stride 2 */
#define BICUBIC_TAPS(PAD)                                                                                 \
    for (Py_ssize_t i = 0; i < count; ++i) {                                                              \
        const float u = unnormalize(a, g[2 * i]);                                                         \
        const float f = floorf(u), t = u - f;                                                             \
        float x = t + 1.0f;                                                                               \
        c[0][i] = ((A * x - 5.0f * A) * x + 8.0f * A) * x - 4.0f * A;                                     \
        x = t;                                                                                            \
        c[1][i] = ((A + 2.0f) * x - (A + 3.0f)) * x * x + 1.0f;                                           \
        x = 1.0f - t;                                                                                     \
        c[2][i] = ((A + 2.0f) * x - (A + 3.0f)) * x * x + 1.0f;                                           \
        x = 2.0f - t;                                                                                     \
        c[3][i] = ((A * x - 5.0f * A) * x + 8.0f * A) * x - 4.0f * A;                                     \
        for (int k = 0; k < 4; ++k) idx[k][i] = index_of(a, PAD(a, f + (float)(k - 1)));                 \
    }
#define BILINEAR_TAPS(PAD)                                                                                \
    for (Py_ssize_t i = 0; i < count; ++i) {                                                              \
        const float u = PAD(a, unnormalize(a, g[2 * i]));                                                 \
        const float f = floorf(u), t = u - f;                                                             \
        c[0][i] = 1.0f - t;                                                                               \
        c[1][i] = t;                                                                                      \
        idx[0][i] = index_of(a, f);                                                                       \
        idx[1][i] = index_of(a, f + 1.0f);                                                                \
    }

/* nearest: the padded coordinate rounded half to even (ATen's round), one tap */
#define NEAREST_TAPS(PAD)                                                                                 \
    for (Py_ssize_t i = 0; i < count; ++i) idx[0][i] = index_of(a, rintf(PAD(a, unnormalize(a, g[2 * i]))));

#define BY_PADDING(TAPS)                                                                                  \
    if (a->padding == 0) {                                                                                \
        TAPS(pad_zeros)                                                                                   \
    } else if (a->padding == 1) {                                                                         \
        TAPS(pad_border)                                                                                  \
    } else {                                                                                              \
        TAPS(pad_reflection)                                                                              \
    }

OPB_CLONES static void axis_taps(const axis_t *a, int mode, const float *restrict g, Py_ssize_t count,
                                 float (*restrict c)[TILE], int32_t (*restrict idx)[TILE]) {
    const float A = -0.75f; /* ATen's cubic convolution constant and coefficient formulas */
    if (mode == BICUBIC) {
        BY_PADDING(BICUBIC_TAPS)
    } else if (mode == NEAREST) {
        (void)c;
        BY_PADDING(NEAREST_TAPS)
    } else {
        BY_PADDING(BILINEAR_TAPS)
    }
}
#undef BICUBIC_TAPS
#undef BILINEAR_TAPS
#undef NEAREST_TAPS
#undef BY_PADDING

static inline void prepare_tile(const axis_t *ax, const axis_t *ay, int mode, const float *g, Py_ssize_t count,
                                tile_t *tl) {
    axis_taps(ax, mode, g, count, tl->cx, tl->xi);
    axis_taps(ay, mode, g + 1, count, tl->cy, tl->yi);
    const int32_t W = ax->size, HW = ax->size * ay->size;
    const int T = mode == BICUBIC ? 4 : mode == NEAREST ? 1 : 2; /* taps per axis */
    for (int j = 0; j < T; ++j)
        for (int t = 0; t < T; ++t) {
            const int32_t *xi = tl->xi[t], *yi = tl->yi[j];
            int32_t *row = tl->row[T * j + t];
            for (Py_ssize_t i = 0; i < count; ++i) row[i] = (xi[i] | yi[i]) >= 0 ? yi[i] * W + xi[i] : HW;
        }
}

/* The values per pixel of grid_sample's channels-last copy for C channels (channel_stride from
   Python): up to 8 channels padded to a vector of 4 or 8 (each tap one vector load); more
   rounded up to a multiple of 4 (the layout copy's 4 x 4 transposes), and 4 more where a pixel's
   values would take a multiple of 256 bytes: pixels that far apart fall in few L1 cache sets (at 256
   channels the copy ran 5x and the sampling 1.7-2x slower). */
static Py_ssize_t grid_channel_stride(Py_ssize_t C) {
    if (C <= 8) return C <= 4 ? 4 : 8;
    const Py_ssize_t S = (C + 3) / 4 * 4;
    return S % 64 == 0 ? S + 4 : S;
}

/* channels-last: xt holds one image as (H * W + 1, S), S >= C values per pixel (C of them, then
   zeros: grid_channel_stride), its last row zeros (the masked taps' row) */
static void nchw_to_nhwc(const float *x, float *xt, Py_ssize_t C, Py_ssize_t S, Py_ssize_t HW, Py_ssize_t r0,
                         Py_ssize_t r1) {
    enum { B = 64 };
    /* pixels [r0, vec_end): four channels of four pixels at a time (a 4 x 4 transpose), B pixels per
       block (few streams at once: planes of a multiple of 4 KiB alias in the L1 cache); the rest one
       value at a time */
    const Py_ssize_t vec_end = S % 4 == 0 ? r1 - (r1 - r0) % 4 : r0;
    for (Py_ssize_t b0 = r0; b0 < vec_end; b0 += B) {
        const Py_ssize_t b1 = b0 + B < vec_end ? b0 + B : vec_end;
        for (Py_ssize_t k = 0; k < S; k += 4)
            for (Py_ssize_t i = b0; i < b1; i += 4) {
                v4f v[4];
                for (Py_ssize_t j = 0; j < 4; ++j)
                    v[j] = k + j < C ? (v4f) * (const v4f_u *)(x + (k + j) * HW + i) : (v4f){0.0f, 0.0f, 0.0f, 0.0f};
                transpose4(v);
                for (Py_ssize_t j = 0; j < 4; ++j) *(v4f_u *)(xt + (i + j) * S + k) = v[j];
            }
    }
    for (Py_ssize_t i0 = vec_end; i0 < r1; i0 += B) {
        const Py_ssize_t i1 = i0 + B < r1 ? i0 + B : r1;
        for (Py_ssize_t c = 0; c < C; ++c) {
            const float *src = x + c * HW;
            for (Py_ssize_t i = i0; i < i1; ++i) xt[i * S + c] = src[i];
        }
        for (Py_ssize_t c = C; c < S; ++c)
            for (Py_ssize_t i = i0; i < i1; ++i) xt[i * S + c] = 0.0f;
    }
    if (r1 == HW)
        for (Py_ssize_t c = 0; c < S; ++c) xt[HW * S + c] = 0.0f;
}

/* point i of the tile: its C outputs into o, from the channels-last image xt (S values per pixel),
   with ATen's weights and order of sums. Bicubic: each row of four taps left to right, then the
   four rows. */
static inline void bicubic_point(const float *xt, Py_ssize_t C, Py_ssize_t S, const tile_t *tl, Py_ssize_t i,
                                 float *restrict o) {
    const float *restrict q[16];
    for (int k = 0; k < 16; ++k) q[k] = xt + (Py_ssize_t)tl->row[k][i] * S;
    const float a0 = tl->cx[0][i], a1 = tl->cx[1][i], a2 = tl->cx[2][i], a3 = tl->cx[3][i];
    const float b0 = tl->cy[0][i], b1 = tl->cy[1][i], b2 = tl->cy[2][i], b3 = tl->cy[3][i];
    for (Py_ssize_t c = 0; c < C; ++c) {
        const float r0 = a0 * q[0][c] + a1 * q[1][c] + a2 * q[2][c] + a3 * q[3][c];
        const float r1 = a0 * q[4][c] + a1 * q[5][c] + a2 * q[6][c] + a3 * q[7][c];
        const float r2 = a0 * q[8][c] + a1 * q[9][c] + a2 * q[10][c] + a3 * q[11][c];
        const float r3 = a0 * q[12][c] + a1 * q[13][c] + a2 * q[14][c] + a3 * q[15][c];
        o[c] = b0 * r0 + b1 * r1 + b2 * r2 + b3 * r3;
    }
}

/* bilinear: the corner weights as ATen forms them (nw = s * e, ...), summed nw, ne, sw, se */
static inline void bilinear_point(const float *xt, Py_ssize_t C, Py_ssize_t S, const tile_t *tl, Py_ssize_t i,
                                  float *restrict o) {
    const float *restrict nw = xt + (Py_ssize_t)tl->row[0][i] * S, *restrict ne = xt + (Py_ssize_t)tl->row[1][i] * S;
    const float *restrict sw = xt + (Py_ssize_t)tl->row[2][i] * S, *restrict se = xt + (Py_ssize_t)tl->row[3][i] * S;
    const float e = tl->cx[0][i], w = tl->cx[1][i], s = tl->cy[0][i], n = tl->cy[1][i];
    const float wnw = s * e, wne = s * w, wsw = n * e, wse = n * w;
    for (Py_ssize_t c = 0; c < C; ++c) o[c] = nw[c] * wnw + ne[c] * wne + sw[c] * wsw + se[c] * wse;
}

/* The same two sums for an image of at most 4 or 8 channels, stored with S = 4 or 8 values per
   pixel: each tap is one vector, and every lane computes what the loops above compute for its
   channel, in the same order (the padded lanes compute zeros). */

#define VECTOR_POINTS(V, S)                                                                               \
    static inline void bicubic_##V(const float *xt, const tile_t *tl, Py_ssize_t i, float *restrict o) { \
        V q[16];                                                                                          \
        for (int k = 0; k < 16; ++k) q[k] = *(const V##_u *)(xt + (Py_ssize_t)tl->row[k][i] * S);        \
        const float a0 = tl->cx[0][i], a1 = tl->cx[1][i], a2 = tl->cx[2][i], a3 = tl->cx[3][i];           \
        const float b0 = tl->cy[0][i], b1 = tl->cy[1][i], b2 = tl->cy[2][i], b3 = tl->cy[3][i];           \
        const V r0 = a0 * q[0] + a1 * q[1] + a2 * q[2] + a3 * q[3];                                      \
        const V r1 = a0 * q[4] + a1 * q[5] + a2 * q[6] + a3 * q[7];                                      \
        const V r2 = a0 * q[8] + a1 * q[9] + a2 * q[10] + a3 * q[11];                                    \
        const V r3 = a0 * q[12] + a1 * q[13] + a2 * q[14] + a3 * q[15];                                  \
        const V v = b0 * r0 + b1 * r1 + b2 * r2 + b3 * r3;                                                \
        *(V##_u *)o = v;                                                                                  \
    }                                                                                                     \
    static inline void bilinear_##V(const float *xt, const tile_t *tl, Py_ssize_t i, float *restrict o) {\
        V q[4];                                                                                           \
        for (int k = 0; k < 4; ++k) q[k] = *(const V##_u *)(xt + (Py_ssize_t)tl->row[k][i] * S);         \
        const float e = tl->cx[0][i], w = tl->cx[1][i], s = tl->cy[0][i], n = tl->cy[1][i];              \
        const float wnw = s * e, wne = s * w, wsw = n * e, wse = n * w;                                   \
        const V v = q[0] * wnw + q[1] * wne + q[2] * wsw + q[3] * wse;                                    \
        *(V##_u *)o = v;                                                                                  \
    }
VECTOR_POINTS(v4f, 4)
VECTOR_POINTS(v8f, 8)
#undef VECTOR_POINTS

/* the tile's outputs res (count points, S values each) into the planes out (C, P): four points by
   four channels at a time through a 4 x 4 transpose where S is a multiple of 4, the rest one by one */
static inline void store_planes(const float *restrict res, Py_ssize_t S, Py_ssize_t C, Py_ssize_t count,
                                float *restrict out, Py_ssize_t P) {
    Py_ssize_t done = 0; /* points stored in every plane */
    if (S % 4 == 0) {
        done = count - count % 4;
        for (Py_ssize_t k = 0; k < C; k += 4) /* four planes at a time: few store streams */
            for (Py_ssize_t i = 0; i < done; i += 4) {
                const float *r = res + i * S + k;
                v4f c[4] = {*(const v4f_u *)r, *(const v4f_u *)(r + S), *(const v4f_u *)(r + 2 * S),
                            *(const v4f_u *)(r + 3 * S)};
                transpose4(c);
                for (Py_ssize_t j = 0; j < 4 && k + j < C; ++j) *(v4f_u *)(out + (k + j) * P + i) = c[j];
            }
    }
    for (Py_ssize_t c = 0; c < C; ++c)
        for (Py_ssize_t j = done; j < count; ++j) out[c * P + j] = res[j * S + c];
}

/* points [p0, p1) of one image, sampled from xt (channels-last, S values per pixel) into out (C, P),
   TILE points at a time; `work` holds a tile_t and TILE * S floats of outputs */
OPB_CLONES static void sample_nhwc(const float *xt, const float *grid, float *out, Py_ssize_t C, Py_ssize_t S, int H,
                                   int W, Py_ssize_t P, int mode, int padding, int align, Py_ssize_t p0,
                                   Py_ssize_t p1, void *work) {
    axis_t ax, ay;
    axis_init(&ax, W, align, padding);
    axis_init(&ay, H, align, padding);
    tile_t *tl = (tile_t *)work;
    float *restrict res = (float *)(tl + 1);
    for (Py_ssize_t t0 = p0; t0 < p1; t0 += TILE) {
        const Py_ssize_t count = t0 + TILE < p1 ? TILE : p1 - t0;
        prepare_tile(&ax, &ay, mode, grid + 2 * t0, count, tl);
        if (mode == NEAREST && (S == 4 || S == 8)) {
            /* each point's tap copied as it is (bits included), straight into the planes: four
               points' pixel vectors transposed into four channels' runs of four points */
            const int32_t *row = tl->row[0];
            float *o = out + t0;
            const Py_ssize_t vec = count - count % 4;
            for (Py_ssize_t i = 0; i < vec; i += 4)
                for (Py_ssize_t k = 0; k < S; k += 4) {
                    v4f v[4];
                    for (int j = 0; j < 4; ++j) v[j] = *(const v4f_u *)(xt + (Py_ssize_t)row[i + j] * S + k);
                    transpose4(v);
                    for (Py_ssize_t j = 0; j < 4 && k + j < C; ++j) *(v4f_u *)(o + (k + j) * P + i) = v[j];
                }
            for (Py_ssize_t i = vec; i < count; ++i)
                for (Py_ssize_t c = 0; c < C; ++c) o[c * P + i] = xt[(Py_ssize_t)row[i] * S + c];
            continue;
        }
        if (mode == NEAREST) { /* each point's tap, copied as it is (bits included) */
            for (Py_ssize_t i = 0; i < count; ++i) {
                const float *src = xt + (Py_ssize_t)tl->row[0][i] * S;
                float *dst = res + i * S;
                Py_ssize_t c = 0;
                for (; c + 8 <= C; c += 8) *(v8f_u *)(dst + c) = *(const v8f_u *)(src + c);
                for (; c < C; ++c) dst[c] = src[c];
            }
        } else if (S == 4) {
            if (mode == BICUBIC) {
                for (Py_ssize_t i = 0; i < count; ++i) bicubic_v4f(xt, tl, i, res + i * 4);
            } else {
                for (Py_ssize_t i = 0; i < count; ++i) bilinear_v4f(xt, tl, i, res + i * 4);
            }
        } else if (S == 8) {
            if (mode == BICUBIC) {
                for (Py_ssize_t i = 0; i < count; ++i) bicubic_v8f(xt, tl, i, res + i * 8);
            } else {
                for (Py_ssize_t i = 0; i < count; ++i) bilinear_v8f(xt, tl, i, res + i * 8);
            }
        } else if (mode == BICUBIC) {
            for (Py_ssize_t i = 0; i < count; ++i) bicubic_point(xt, C, S, tl, i, res + i * S);
        } else {
            for (Py_ssize_t i = 0; i < count; ++i) bilinear_point(xt, C, S, tl, i, res + i * S);
        }
        store_planes(res, S, C, count, out + t0, P);
    }
}

/* ------------------------------------------------------------------ few channels: gathers from the planes */

/* With few channels the channels-last copy and the per-point tile cost more than the sampling they
   serve (ATen's kernel, vectorized across points, is faster there). This path takes eight output
   points as the lanes of an AVX2 vector: their coordinates, weights and tap offsets once, then for
   each channel each tap gathered from the NCHW plane itself (lanes whose tap lies outside read 0,
   the value of the channels-last path's zero row). Every lane does the operations of axis_taps and
   of the per-point sums above in the same order with the same roundings, so both paths give the
   same bits. x86-64 with AVX2 and FMA only (checked at run time): planes_apply(); a build with
   -DOPB_NO_PLANES leaves the path out. */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(OPB_NO_PLANES)
#include <immintrin.h>
#define OPB_PLANES 1
#define OPB_AVX2 __attribute__((target("avx2,fma")))

/* The most channels per mode for which this path is faster than the channels-last one
   (benchmarks/cpu_ops.py --only grid-planes): bilinear, nearest, bicubic. */
static const int planes_max[3] = {1, 2, 1};

static pthread_once_t g_planes_once = PTHREAD_ONCE_INIT;
static int g_planes_ok = 0;

static void planes_init(void) {
    __builtin_cpu_init();
    g_planes_ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* whether this CPU runs the path (checked once, from any thread) */
static int planes_supported(void) {
    pthread_once(&g_planes_once, planes_init);
    return g_planes_ok;
}

typedef struct {
    __m256 scale, shift, max_val, low, twice_span, size;
    int padding;
} vaxis_t;

OPB_AVX2 static inline vaxis_t vaxis_of(const axis_t *a) {
    vaxis_t v;
    v.scale = _mm256_set1_ps(a->scale);
    v.shift = _mm256_set1_ps(-a->shift);
    v.max_val = _mm256_set1_ps(a->max_val);
    v.low = _mm256_set1_ps(a->low);
    v.twice_span = _mm256_set1_ps(a->twice_span);
    v.size = _mm256_set1_ps((float)a->size);
    v.padding = a->padding;
    return v;
}

/* unnormalize, clip, reflect and index_of of eight lanes (see the scalar versions): MAXPS and MINPS
   return their second operand for NaN or equal inputs, which is what the scalar conditionals do */
OPB_AVX2 static inline __m256 v_unnormalize(const vaxis_t *a, __m256 g) {
    return _mm256_fmadd_ps(_mm256_add_ps(g, _mm256_set1_ps(1.0f)), a->scale, a->shift);
}

OPB_AVX2 static inline __m256 v_clip(const vaxis_t *a, __m256 v) {
    return _mm256_min_ps(_mm256_max_ps(v, _mm256_setzero_ps()), a->max_val);
}

OPB_AVX2 static inline __m256 v_pad(const vaxis_t *a, __m256 v) {
    if (a->padding == 0) return v;
    if (a->padding == 2) {
        const __m256 ts = a->twice_span;
        const __m256 abs_in = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_sub_ps(v, a->low));
        const __m256 flips = _mm256_round_ps(_mm256_div_ps(abs_in, ts), _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        const __m256 extra = _mm256_fnmadd_ps(flips, ts, abs_in); /* fused, as the scalar reflect */
        const __m256 back = _mm256_sub_ps(ts, extra);
        v = _mm256_add_ps(_mm256_min_ps(extra, back), a->low);
    }
    return v_clip(a, v);
}

OPB_AVX2 static inline __m256i v_index(const vaxis_t *a, __m256 v) {
    const __m256 in = _mm256_and_ps(_mm256_cmp_ps(v, _mm256_set1_ps(-1.0f), _CMP_GT_OQ),
                                    _mm256_cmp_ps(v, a->size, _CMP_LT_OQ));
    return _mm256_cvttps_epi32(_mm256_blendv_ps(_mm256_set1_ps(-1.0f), v, in));
}

/* a tap of every channel: its offset in the plane and whether it is inside (the gather's mask) */
typedef struct {
    __m256i offset;
    __m256 inside;
} vtap_t;

/* lanes whose integer index lies in [0, size) */
OPB_AVX2 static inline __m256 v_within(__m256i i, __m256i size) {
    const __m256i ok = _mm256_and_si256(_mm256_cmpgt_epi32(i, _mm256_set1_epi32(-1)), _mm256_cmpgt_epi32(size, i));
    return _mm256_castsi256_ps(ok);
}

OPB_AVX2 static inline __m256 v_gather(const float *plane, vtap_t t) {
    return _mm256_mask_i32gather_ps(_mm256_setzero_ps(), plane, t.offset, t.inside, 4);
}

/* the cubic coefficients of fraction t, as BICUBIC_TAPS forms them */
OPB_AVX2 static inline void v_cubic(__m256 t, __m256 c[4]) {
    const __m256 A = _mm256_set1_ps(-0.75f), A5 = _mm256_set1_ps(5.0f * -0.75f), A8 = _mm256_set1_ps(8.0f * -0.75f);
    const __m256 A4 = _mm256_set1_ps(4.0f * -0.75f), A2 = _mm256_set1_ps(-0.75f + 2.0f);
    const __m256 A3 = _mm256_set1_ps(-0.75f + 3.0f), one = _mm256_set1_ps(1.0f);
#define OUTER(x) \
    _mm256_sub_ps(_mm256_mul_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(_mm256_mul_ps(A, x), A5), x), A8), x), A4)
#define INNER(x) _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_sub_ps(_mm256_mul_ps(A2, x), A3), x), x), one)
    c[0] = OUTER(_mm256_add_ps(t, one));
    c[1] = INNER(t);
    c[2] = INNER(_mm256_sub_ps(one, t));
    c[3] = OUTER(_mm256_sub_ps(_mm256_set1_ps(2.0f), t));
#undef OUTER
#undef INNER
}

/* the output lanes [0, n) of one plane */
OPB_AVX2 static inline void v_store(float *o, __m256 v, Py_ssize_t n) {
    if (n == 8) {
        _mm256_storeu_ps(o, v);
    } else {
        const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        _mm256_maskstore_ps(o, lanes, v);
    }
}

/* points [p0, p1) of one image x (C planes of H * W) at grid (P, 2) into out (C, P) */
OPB_AVX2 static void sample_planes(const float *x, const float *grid, float *out, Py_ssize_t C, int H, int W,
                                   Py_ssize_t P, int mode, int padding, int align, Py_ssize_t p0, Py_ssize_t p1) {
    axis_t ax0, ay0;
    axis_init(&ax0, W, align, padding);
    axis_init(&ay0, H, align, padding);
    const vaxis_t ax = vaxis_of(&ax0), ay = vaxis_of(&ay0);
    const __m256i Wv = _mm256_set1_epi32(W), Hv = _mm256_set1_epi32(H), one = _mm256_set1_epi32(1);
    const Py_ssize_t HW = (Py_ssize_t)H * W;
    for (Py_ssize_t i = p0; i < p1; i += 8) {
        const Py_ssize_t n = p1 - i < 8 ? p1 - i : 8;
        __m256 lo, hi; /* points i..i+3 and i+4..i+7 as (x, y) pairs */
        if (n == 8) {
            lo = _mm256_loadu_ps(grid + 2 * i);
            hi = _mm256_loadu_ps(grid + 2 * i + 8);
        } else { /* the last points, the other lanes at (0, 0) */
            float tail[16] = {0.0f};
            for (Py_ssize_t k = 0; k < 2 * n; ++k) tail[k] = grid[2 * i + k];
            lo = _mm256_loadu_ps(tail);
            hi = _mm256_loadu_ps(tail + 8);
        }
        /* x0 x1 x4 x5 | x2 x3 x6 x7, then in point order */
        const __m256d xs = _mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0x88));
        const __m256d ys = _mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0xdd));
        const __m256 gx = _mm256_castpd_ps(_mm256_permute4x64_pd(xs, 0xd8));
        const __m256 gy = _mm256_castpd_ps(_mm256_permute4x64_pd(ys, 0xd8));
        if (mode == NEAREST) {
            /* rounded half to even by the conversion itself (MXCSR's default); NaN and coordinates
               past the int32 range convert to INT32_MIN, outside like every other index out of
               [0, size): the same taps as index_of(rintf(...)) */
            const __m256i xi = _mm256_cvtps_epi32(v_pad(&ax, v_unnormalize(&ax, gx)));
            const __m256i yi = _mm256_cvtps_epi32(v_pad(&ay, v_unnormalize(&ay, gy)));
            const vtap_t t = {_mm256_add_epi32(_mm256_mullo_epi32(yi, Wv), xi),
                              _mm256_and_ps(v_within(xi, Wv), v_within(yi, Hv))};
            for (Py_ssize_t c = 0; c < C; ++c) v_store(out + c * P + i, v_gather(x + c * HW, t), n);
        } else if (mode == BILINEAR) {
            const __m256 u = v_pad(&ax, v_unnormalize(&ax, gx)), v = v_pad(&ay, v_unnormalize(&ay, gy));
            const __m256 fu = _mm256_floor_ps(u), fv = _mm256_floor_ps(v);
            const __m256 w = _mm256_sub_ps(u, fu), nn = _mm256_sub_ps(v, fv); /* c[1]: the fractions */
            const __m256 e = _mm256_sub_ps(_mm256_set1_ps(1.0f), w), s = _mm256_sub_ps(_mm256_set1_ps(1.0f), nn);
            const __m256 wnw = _mm256_mul_ps(s, e), wne = _mm256_mul_ps(s, w);
            const __m256 wsw = _mm256_mul_ps(nn, e), wse = _mm256_mul_ps(nn, w);
            /* the corners' columns and rows as integers (floor is integral; NaN and values past the
               int32 range convert to INT32_MIN, outside): with sizes up to 2**24 the same taps as
               index_of(f) and index_of(f + 1.0f) */
            const __m256i x0 = _mm256_cvttps_epi32(fu), y0 = _mm256_cvttps_epi32(fv);
            const __m256i x1 = _mm256_add_epi32(x0, one), y1 = _mm256_add_epi32(y0, one);
            const __m256 okx0 = v_within(x0, Wv), okx1 = v_within(x1, Wv);
            const __m256 oky0 = v_within(y0, Hv), oky1 = v_within(y1, Hv);
            const __m256i o = _mm256_add_epi32(_mm256_mullo_epi32(y0, Wv), x0);
            const vtap_t tnw = {o, _mm256_and_ps(okx0, oky0)};
            const vtap_t tne = {_mm256_add_epi32(o, one), _mm256_and_ps(okx1, oky0)};
            const __m256i os = _mm256_add_epi32(o, Wv);
            const vtap_t tsw = {os, _mm256_and_ps(okx0, oky1)};
            const vtap_t tse = {_mm256_add_epi32(os, one), _mm256_and_ps(okx1, oky1)};
            for (Py_ssize_t c = 0; c < C; ++c) {
                const float *plane = x + c * HW;
                __m256 r = _mm256_mul_ps(v_gather(plane, tnw), wnw);
                r = _mm256_add_ps(r, _mm256_mul_ps(v_gather(plane, tne), wne));
                r = _mm256_add_ps(r, _mm256_mul_ps(v_gather(plane, tsw), wsw));
                r = _mm256_add_ps(r, _mm256_mul_ps(v_gather(plane, tse), wse));
                v_store(out + c * P + i, r, n);
            }
        } else {
            const __m256 u = v_unnormalize(&ax, gx), v = v_unnormalize(&ay, gy);
            const __m256 fu = _mm256_floor_ps(u), fv = _mm256_floor_ps(v);
            __m256 a[4], b[4];
            v_cubic(_mm256_sub_ps(u, fu), a);
            v_cubic(_mm256_sub_ps(v, fv), b);
            __m256i xi[4], yi[4];
            for (int k = 0; k < 4; ++k) {
                const __m256 dk = _mm256_set1_ps((float)(k - 1));
                xi[k] = v_index(&ax, v_pad(&ax, _mm256_add_ps(fu, dk)));
                yi[k] = v_index(&ay, v_pad(&ay, _mm256_add_ps(fv, dk)));
            }
            /* v_index gives -1 for a tap outside: a row's offset once, each tap's mask from its axes' */
            __m256 okx[4], oky[4];
            __m256i rows[4];
            for (int k = 0; k < 4; ++k) {
                okx[k] = _mm256_castsi256_ps(_mm256_cmpgt_epi32(xi[k], _mm256_set1_epi32(-1)));
                oky[k] = _mm256_castsi256_ps(_mm256_cmpgt_epi32(yi[k], _mm256_set1_epi32(-1)));
                rows[k] = _mm256_mullo_epi32(yi[k], Wv);
            }
            vtap_t t[16];
            for (int j = 0; j < 4; ++j)
                for (int k = 0; k < 4; ++k)
                    t[4 * j + k] = (vtap_t){_mm256_add_epi32(rows[j], xi[k]), _mm256_and_ps(okx[k], oky[j])};
            for (Py_ssize_t c = 0; c < C; ++c) {
                const float *plane = x + c * HW;
                __m256 r[4];
                for (int j = 0; j < 4; ++j) {
                    __m256 acc = _mm256_mul_ps(a[0], v_gather(plane, t[4 * j]));
                    for (int k = 1; k < 4; ++k)
                        acc = _mm256_add_ps(acc, _mm256_mul_ps(a[k], v_gather(plane, t[4 * j + k])));
                    r[j] = acc;
                }
                __m256 o = _mm256_mul_ps(b[0], r[0]);
                for (int j = 1; j < 4; ++j) o = _mm256_add_ps(o, _mm256_mul_ps(b[j], r[j]));
                v_store(out + c * P + i, o, n);
            }
        }
    }
}
#else
#define OPB_PLANES 0
#endif

/* Planes up to this size on each side: the integer tap indices above equal index_of's of the float
   coordinates (f + 1.0f is exact below 2**24). */
#define PLANES_SIDE_MAX (1 << 24)

/* whether grid_sample reads an image of C channels of H x W from its planes in this mode */
static int planes_apply(Py_ssize_t C, Py_ssize_t H, Py_ssize_t W, int mode) {
#if OPB_PLANES
    return mode >= BILINEAR && mode <= BICUBIC && C <= planes_max[mode] && H <= PLANES_SIDE_MAX &&
           W <= PLANES_SIDE_MAX && planes_supported();
#else
    (void)C, (void)H, (void)W, (void)mode;
    return 0;
#endif
}

/* ------------------------------------------------------------------ bicubic resize */

/* One output axis of F.interpolate(mode="bicubic") as ATen computes it: the scale from the sizes,
   the source index (not clamped for cubic; its multiply-add done in double and rounded once, as
   ATen's build appears to fuse it), the guarded floor and fraction, the cubic coefficients of the
   fraction and the four taps clamped into [0, in - 1]. The outer coefficient fuses its first two
   multiply-adds and rounds the last product, the inner one rounds every product: so ATen's build
   forms them (its coefficients of 26091 interior outputs over 174 sizes, equal bit for bit; a
   coefficient ATen makes exactly 0 at a fraction near 1 is 0 here too, so an infinite input gives
   NaN as there). */
static inline float cubic_outer(float x) {
    const float A = -0.75f;
    return fmaf(fmaf(A, x, -5.0f * A), x, 8.0f * A) * x - 4.0f * A;
}
static inline float cubic_inner(float x) {
    const float A = -0.75f;
    return ((A + 2.0f) * x - (A + 3.0f)) * x * x + 1.0f;
}
static void resize_axis(Py_ssize_t in, Py_ssize_t out, int align, int32_t (*idx)[4], float (*w)[4]) {
    const float scale = align ? (out > 1 ? (float)(in - 1) / (float)(out - 1) : 0.0f) : (float)in / (float)out;
    for (Py_ssize_t o = 0; o < out; ++o) {
        const float real = align ? scale * (float)o : (float)((double)scale * (double)((float)o + 0.5f) - 0.5);
        Py_ssize_t i0 = (Py_ssize_t)floorf(real);
        if (i0 > in - 1) i0 = in - 1;
        float t = real - (float)i0;
        t = t > 0.0f ? t : 0.0f;
        t = t < 1.0f ? t : 1.0f;
        const float u = 1.0f - t;
        w[o][0] = cubic_outer(t + 1.0f);
        w[o][1] = cubic_inner(t);
        w[o][2] = cubic_inner(u);
        w[o][3] = cubic_outer(u + 1.0f);
        for (int k = 0; k < 4; ++k) {
            Py_ssize_t j = i0 - 1 + k;
            idx[o][k] = (int32_t)(j < 0 ? 0 : j > in - 1 ? in - 1 : j);
        }
    }
}

/* Output rows [oy0, oy1) of planes [p0, p1): separable, with ATen's sums in ATen's order. Each
   output is sum_j (sum_i x[r_j][c_i] * wx_i) * wy_j; the inner sums of an input row do not depend
   on the output row, so they are computed once per input row the output rows read (the horizontal
   pass: input row rows_in[s] into slot s of `rows`), and the outer sums run across whole output rows
   (vectorized), tap k of output row oy reading slot slot[oy - oy0][k]. */
OPB_CLONES static void resize_bicubic(const float *x, float *out, Py_ssize_t H, Py_ssize_t W, Py_ssize_t Ho,
                                      Py_ssize_t Wo, const float (*wy)[4], const int32_t (*xi)[4],
                                      const float (*wx)[4], Py_ssize_t p0, Py_ssize_t p1, Py_ssize_t oy0,
                                      Py_ssize_t oy1, const int32_t *rows_in, Py_ssize_t n_rows,
                                      const int32_t (*slot)[4], float *restrict rows) {
    for (Py_ssize_t p = p0; p < p1; ++p) {
        const float *plane = x + p * H * W;
        for (Py_ssize_t s = 0; s < n_rows; ++s) {
            const float *src = plane + (Py_ssize_t)rows_in[s] * W;
            float *restrict dst = rows + s * Wo;
            for (Py_ssize_t ox = 0; ox < Wo; ++ox) {
                const int32_t *c = xi[ox];
                const float *k = wx[ox];
                dst[ox] = src[c[0]] * k[0] + src[c[1]] * k[1] + src[c[2]] * k[2] + src[c[3]] * k[3];
            }
        }
        for (Py_ssize_t oy = oy0; oy < oy1; ++oy) {
            const int32_t *sl = slot[oy - oy0];
            const float *restrict t0 = rows + sl[0] * Wo, *restrict t1 = rows + sl[1] * Wo;
            const float *restrict t2 = rows + sl[2] * Wo, *restrict t3 = rows + sl[3] * Wo;
            const float b0 = wy[oy][0], b1 = wy[oy][1], b2 = wy[oy][2], b3 = wy[oy][3];
            float *restrict o = out + (p * Ho + oy) * Wo;
            for (Py_ssize_t ox = 0; ox < Wo; ++ox) o[ox] = t0[ox] * b0 + t1[ox] * b1 + t2[ox] * b2 + t3[ox] * b3;
        }
    }
}

/* ------------------------------------------------------------------ RoIAlign */

/* MMCV roi_align (torchvision's for mode "avg"), from the channels-last features of the RoI's image.
   A RoI's geometry in float32 as MMCV computes it: its start, bin sizes and sampling grid. */
typedef struct {
    float x1, y1, bw, bh;
    int gh, gw, b;
} roi_geom_t;

enum { ROI_OK = 0, ROI_BAD_BATCH = 1, ROI_BAD_GRID = 2 };
/* samples per RoI and channel (bins times the grid of a bin): a RoI of 4096 x 4096 pixels of its
   feature map with an adaptive grid; more is a bad RoI (seconds to hours of work for one box) */
#define ROI_MAX_SAMPLES 16777216.0

static int roi_geometry(const float *roi, int N, float scale, int sampling, int aligned, int PH, int PW,
                        roi_geom_t *g) {
    if (!(roi[0] > -1.0f && roi[0] < (float)N)) return ROI_BAD_BATCH; /* the index truncates, as int() */
    g->b = (int)roi[0];
    const float off = aligned ? 0.5f : 0.0f;
    g->x1 = roi[1] * scale - off;
    g->y1 = roi[2] * scale - off;
    float rw = roi[3] * scale - off - g->x1, rh = roi[4] * scale - off - g->y1;
    if (!aligned) { /* at least one pixel; NaN stays NaN */
        rw = rw < 1.0f ? 1.0f : rw;
        rh = rh < 1.0f ? 1.0f : rh;
    }
    g->bh = rh / (float)PH;
    g->bw = rw / (float)PW;
    float fh = (float)sampling, fw = (float)sampling;
    if (sampling <= 0) {
        fh = ceilf(rh / (float)PH);
        fw = ceilf(rw / (float)PW);
        fh = fh > 0.0f ? fh : (fh == fh ? 0.0f : fh); /* an empty box has no samples; NaN stays NaN */
        fw = fw > 0.0f ? fw : (fw == fw ? 0.0f : fw);
    }
    /* NaN, infinite or too many (each side too: the other may be 0) */
    if (!(fh <= ROI_MAX_SAMPLES && fw <= ROI_MAX_SAMPLES && (double)fh * fw * PH * PW <= ROI_MAX_SAMPLES))
        return ROI_BAD_GRID;
    g->gh = (int)fh;
    g->gw = (int)fw;
    return ROI_OK;
}

/* the first RoI of [r0, r1) that roi_align refuses, its reason in *why; -1 where none */
static Py_ssize_t first_bad_roi(const float *rois, Py_ssize_t r0, Py_ssize_t r1, int N, float scale, int sampling,
                                int aligned, int PH, int PW, int *why) {
    for (Py_ssize_t r = r0; r < r1; ++r) {
        roi_geom_t g;
        *why = roi_geometry(rois + 5 * r, N, scale, sampling, aligned, PH, PW, &g);
        if (*why != ROI_OK) return r;
    }
    return -1;
}

/* one sample coordinate along an axis of `size` pixels: MMCV's bilinear rule (outside below -1 or
   above size; clamped at 0; the last pixel's weight taken whole). A NaN coordinate (a NaN box with a
   fixed sampling ratio) gives NaN weights on pixel 0: the sample is NaN. */
typedef struct {
    int lo, hi, in;
    float wl, wh;
} roi_tap_t;

static inline roi_tap_t roi_tap(float v, int size) {
    roi_tap_t t = {0, 0, 0, 0.0f, 0.0f};
    if (v != v) {
        t.in = 1;
        t.wl = t.wh = v;
        return t;
    }
    if (!(v >= -1.0f && v <= (float)size)) return t;
    t.in = 1;
    v = v > 0.0f ? v : 0.0f;
    /* (float)size may round up to 2**31 on the widest planes: floor(v) is then past any int index */
    int lo = v < 2147483648.0f ? (int)floorf(v) : INT_MAX;
    if (lo >= size - 1) {
        lo = size - 1;
        v = (float)lo;
        t.hi = lo;
    } else {
        t.hi = lo + 1;
    }
    t.lo = lo;
    t.wh = v - (float)lo;
    t.wl = 1.0f - t.wh;
    return t;
}

/* RoIs [r0, r1) of rois (R, 5) into out (R, C, PH, PW), from xt: each image channels-last as
   (H * W + 1, C); `acc` holds C floats. The samples of a bin are summed (avg, then divided by their
   count) or maxed (max; a sample outside counts as 0, NaN wins; a bin without samples is -FLT_MAX, as
   MMCV's) in MMCV's order: rows, then columns. */
OPB_CLONES static void roi_align_rois(const float *xt, const float *rois, float *out, Py_ssize_t C, int N, int H,
                                      int W, int PH, int PW, float scale, int sampling, int pool_max, int aligned,
                                      Py_ssize_t r0, Py_ssize_t r1, float *restrict acc) {
    const Py_ssize_t image = ((Py_ssize_t)H * W + 1) * C, bins = (Py_ssize_t)PH * PW;
    for (Py_ssize_t r = r0; r < r1; ++r) {
        roi_geom_t g;
        (void)roi_geometry(rois + 5 * r, N, scale, sampling, aligned, PH, PW, &g); /* checked by the caller */
        const float *img = xt + g.b * image;
        const Py_ssize_t samples = (Py_ssize_t)g.gh * g.gw; /* at most ROI_MAX_SAMPLES */
        const float count = (float)(samples > 1 ? samples : 1);
        const float lowest = samples > 0 ? -INFINITY : -FLT_MAX; /* max: the first sample always wins */
        for (int ph = 0; ph < PH; ++ph)
            for (int pw = 0; pw < PW; ++pw) {
                for (Py_ssize_t c = 0; c < C; ++c) acc[c] = pool_max ? lowest : 0.0f;
                for (int iy = 0; iy < g.gh; ++iy) {
                    const roi_tap_t ty =
                        roi_tap((g.y1 + (float)ph * g.bh) + ((float)iy + 0.5f) * g.bh / (float)g.gh, H);
                    for (int ix = 0; ix < g.gw; ++ix) {
                        const roi_tap_t tx =
                            roi_tap((g.x1 + (float)pw * g.bw) + ((float)ix + 0.5f) * g.bw / (float)g.gw, W);
                        if (!(ty.in && tx.in)) {
                            if (pool_max) /* the sample is 0 (a NaN maximum stays) */
                                for (Py_ssize_t c = 0; c < C; ++c) acc[c] = acc[c] <= 0.0f ? 0.0f : acc[c];
                            continue;
                        }
                        const float w00 = ty.wl * tx.wl, w01 = ty.wl * tx.wh, w10 = ty.wh * tx.wl, w11 = ty.wh * tx.wh;
                        const float *restrict p00 = img + ((Py_ssize_t)ty.lo * W + tx.lo) * C;
                        const float *restrict p01 = img + ((Py_ssize_t)ty.lo * W + tx.hi) * C;
                        const float *restrict p10 = img + ((Py_ssize_t)ty.hi * W + tx.lo) * C;
                        const float *restrict p11 = img + ((Py_ssize_t)ty.hi * W + tx.hi) * C;
                        if (pool_max) {
                            for (Py_ssize_t c = 0; c < C; ++c) {
                                const float v = w00 * p00[c] + w01 * p01[c] + w10 * p10[c] + w11 * p11[c];
                                const float m = v > acc[c] ? v : acc[c];
                                acc[c] = v != v ? v : m;
                            }
                        } else {
                            for (Py_ssize_t c = 0; c < C; ++c)
                                acc[c] += w00 * p00[c] + w01 * p01[c] + w10 * p10[c] + w11 * p11[c];
                        }
                    }
                }
                float *o = out + r * C * bins + (Py_ssize_t)ph * PW + pw;
                for (Py_ssize_t c = 0; c < C; ++c) o[c * bins] = pool_max ? acc[c] : acc[c] / count;
            }
    }
}

/* ------------------------------------------------------------------ Python entry point */

static int check_len(const char *fn, const Py_buffer *b, const char *name, Py_ssize_t elements) {
    if ((uintptr_t)b->buf % sizeof(float) != 0) {
        PyErr_Format(PyExc_ValueError,
                     "%s: %s starts at an address that is not a multiple of 4 (a misaligned view); pass an aligned "
                     "copy, e.g. numpy.require(a, requirements='CA')",
                     fn, name);
        return 0;
    }
    if (b->len != elements * (Py_ssize_t)sizeof(float)) {
        PyErr_Format(PyExc_ValueError,
                     "%s: %s holds %zd bytes, %zd float32 values (%zd bytes) expected; "
                     "pass contiguous float32 buffers of the declared sizes",
                     fn, name, b->len, elements, elements * (Py_ssize_t)sizeof(float));
        return 0;
    }
    return 1;
}

/* The sizes each kernel takes (the entry points' checks and the native kernels' share them): an image
   of C planes of H x W (plus the channels-last copy's zero row) sampled at P points; a resize of
   `planes` planes from H x W to Ho x Wo; RoIAlign's N images and R RoIs of PH x PW bins (with an image
   of grid_sizes_valid(C, H, W, 0)). Indices within a plane fit 32 bits, element counts 1e15. */
static int grid_sizes_valid(int64_t C, int64_t H, int64_t W, int64_t P) {
    return C >= 1 && H >= 1 && W >= 1 && P >= 0 && H * (double)W < (double)INT32_MAX &&
           (double)C * (H * (double)W + 1) <= 1e15 && (double)C * P <= 1e15;
}

static int resize_sizes_valid(int64_t planes, int64_t H, int64_t W, int64_t Ho, int64_t Wo) {
    /* (Ho and Wo bound on their own too: the taps of both axes are one block of (Ho + Wo) rows) */
    return planes >= 0 && H >= 1 && W >= 1 && Ho >= 1 && Wo >= 1 && H < INT32_MAX && W < INT32_MAX &&
           Ho < INT32_MAX && Wo < INT32_MAX && (double)planes * H * W <= 1e15 && (double)planes * Ho * Wo <= 1e15;
}

static int roi_sizes_valid(int64_t N, int64_t C, int64_t H, int64_t W, int64_t R, int64_t PH, int64_t PW) {
    return N >= 1 && R >= 0 && PH >= 1 && PW >= 1 && N < INT32_MAX && PH * (double)PW < (double)INT32_MAX &&
           (double)R * C * PH * PW <= 1e15 && (double)N * C * (H * (double)W + 1) <= 1e15;
}

static int sizes_ok(const char *fn, Py_ssize_t C, Py_ssize_t H, Py_ssize_t W, Py_ssize_t P) {
    if (!grid_sizes_valid(C, H, W, P)) {
        PyErr_Format(PyExc_ValueError, "%s: sizes C=%zd H=%zd W=%zd P=%zd; C, H, W >= 1 and P >= 0 expected", fn, C,
                     H, W, P);
        return 0;
    }
    return 1;
}

static int grid_mode_ok(const char *fn, int mode, int padding) {
    if (mode < BILINEAR || mode > BICUBIC || padding < 0 || padding > 2) {
        PyErr_Format(PyExc_ValueError,
                     "%s: mode %d, padding %d; modes 0 (bilinear), 1 (nearest), 2 (bicubic) and paddings 0 (zeros), "
                     "1 (border), 2 (reflection)",
                     fn, mode, padding);
        return 0;
    }
    return 1;
}

/* S values per pixel of an image of HW pixels plus the zero row: within the element bound of
   grid_sizes_valid, so that the byte counts the buffers are checked against cannot wrap */
static int stride_ok(const char *fn, Py_ssize_t C, Py_ssize_t S, Py_ssize_t HW) {
    if (!(S == C || (S > C && S % 4 == 0)) || (double)S * ((double)HW + 1) > 1e15) {
        PyErr_Format(PyExc_ValueError,
                     "%s: channel stride S=%zd for C=%zd and %zd pixels; S is C, or a multiple of 4 above C, "
                     "and S * (pixels + 1) <= 1e15",
                     fn, S, C, HW);
        return 0;
    }
    return 1;
}

static int range_ok(const char *fn, Py_ssize_t r0, Py_ssize_t r1, Py_ssize_t n) {
    if (r0 < 0 || r1 < r0 || r1 > n) {
        PyErr_Format(PyExc_ValueError, "%s: range [%zd, %zd) outside [0, %zd)", fn, r0, r1, n);
        return 0;
    }
    return 1;
}

PyDoc_STRVAR(channel_stride_doc,
             "channel_stride(C)\n\n"
             "The values per pixel of grid_sample's channels-last copy of C >= 1 channels (grid_channel_stride):\n"
             "the S that to_channels_last and grid_sample take for the kernel's fastest layout.");

static PyObject *py_channel_stride(PyObject *self, PyObject *arg) {
    (void)self;
    const Py_ssize_t C = PyLong_AsSsize_t(arg);
    if (C == -1 && PyErr_Occurred()) return NULL;
    if (C < 1) {
        PyErr_Format(PyExc_ValueError, "channel_stride: C=%zd; C >= 1 expected", C);
        return NULL;
    }
    return PyLong_FromSsize_t(grid_channel_stride(C));
}

PyDoc_STRVAR(to_channels_last_doc,
             "to_channels_last(x, xt, C, S, HW, r0, r1)\n\n"
             "Rows [r0, r1) of one image x (C, HW) into xt (HW + 1, S), both contiguous float32: each pixel's C\n"
             "values, then S - C zeros (S is C, or a multiple of 4 above C); the range that ends\n"
             "at HW also zeros xt's last row. Releases the GIL while it runs.");

static PyObject *py_to_channels_last(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer xb, tb;
    Py_ssize_t C, S, HW, r0, r1;
    if (!PyArg_ParseTuple(args, "y*w*nnnnn", &xb, &tb, &C, &S, &HW, &r0, &r1)) return NULL;
    PyObject *result = NULL;
    if (sizes_ok("to_channels_last", C, 1, HW, 0) && stride_ok("to_channels_last", C, S, HW) &&
        range_ok("to_channels_last", r0, r1, HW) && check_len("to_channels_last", &xb, "x", C * HW) &&
        check_len("to_channels_last", &tb, "xt", (HW + 1) * S)) {
        Py_BEGIN_ALLOW_THREADS;
        nchw_to_nhwc((const float *)xb.buf, (float *)tb.buf, C, S, HW, r0, r1);
        Py_END_ALLOW_THREADS;
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&xb);
    PyBuffer_Release(&tb);
    return result;
}

PyDoc_STRVAR(grid_sample_doc,
             "grid_sample(xt, grid, out, C, S, H, W, P, mode, padding, align, p0, p1)\n\n"
             "F.grid_sample of one image of C channels, given channels-last as xt (H * W + 1, S) with a last\n"
             "row of zeros (to_channels_last), at grid (P, 2) into out (C, P), all contiguous float32; only\n"
             "the output points [p0, p1). mode: 0 bilinear, 1 nearest, 2 bicubic; padding: 0 zeros,\n"
             "1 border, 2 reflection. Releases the GIL while it runs.");

static PyObject *py_grid_sample(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer tb, gb, ob;
    Py_ssize_t C, S, H, W, P, p0, p1;
    int mode, padding, align;
    if (!PyArg_ParseTuple(args, "y*y*w*nnnnniipnn", &tb, &gb, &ob, &C, &S, &H, &W, &P, &mode, &padding, &align, &p0,
                          &p1))
        return NULL;
    PyObject *result = NULL;
    if (!sizes_ok("grid_sample", C, H, W, P) || !stride_ok("grid_sample", C, S, H * W) ||
        !range_ok("grid_sample", p0, p1, P)) {
        /* error set */
    } else if (!grid_mode_ok("grid_sample", mode, padding)) {
        /* error set */
    } else if (check_len("grid_sample", &tb, "xt", (H * W + 1) * S) && check_len("grid_sample", &gb, "grid", P * 2) &&
               check_len("grid_sample", &ob, "out", C * P)) {
        void *work = PyMem_RawMalloc(sizeof(tile_t) + (size_t)TILE * (size_t)S * sizeof(float));
        if (work == NULL) {
            PyErr_NoMemory();
        } else {
            Py_BEGIN_ALLOW_THREADS;
            sample_nhwc((const float *)tb.buf, (const float *)gb.buf, (float *)ob.buf, C, S, (int)H, (int)W, P, mode,
                        padding, align, p0, p1, work);
            Py_END_ALLOW_THREADS;
            PyMem_RawFree(work);
            result = Py_NewRef(Py_None);
        }
    }
    PyBuffer_Release(&tb);
    PyBuffer_Release(&gb);
    PyBuffer_Release(&ob);
    return result;
}

PyDoc_STRVAR(grid_sample_planes_doc,
             "grid_sample_planes(x, grid, out, C, H, W, P, mode, padding, align, p0, p1)\n\n"
             "grid_sample's path for few channels: the same outputs as grid_sample, read from one image's\n"
             "planes x (C, H * W) without the channels-last copy, eight points per AVX2 vector; grid (P, 2),\n"
             "out (C, P), all contiguous float32; only the output points [p0, p1). Needs AVX2 and FMA\n"
             "and sides of at most 2**24 (planes_apply(1, H, W, mode)). Releases the GIL while it runs.");

static PyObject *py_grid_sample_planes(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer xb, gb, ob;
    Py_ssize_t C, H, W, P, p0, p1;
    int mode, padding, align;
    if (!PyArg_ParseTuple(args, "y*y*w*nnnniipnn", &xb, &gb, &ob, &C, &H, &W, &P, &mode, &padding, &align, &p0, &p1))
        return NULL;
    PyObject *result = NULL;
    if (!sizes_ok("grid_sample_planes", C, H, W, P) || !range_ok("grid_sample_planes", p0, p1, P)) {
        /* error set */
    } else if (!grid_mode_ok("grid_sample_planes", mode, padding)) {
        /* error set */
    } else if (!planes_apply(1, H, W, mode)) {
        PyErr_Format(PyExc_RuntimeError,
                     "grid_sample_planes: planes of %zdx%zd on this CPU: it needs AVX2 and FMA on x86-64 and sides "
                     "of at most %d; use to_channels_last and grid_sample",
                     H, W, PLANES_SIDE_MAX);
    } else if (check_len("grid_sample_planes", &xb, "x", C * H * W) &&
               check_len("grid_sample_planes", &gb, "grid", P * 2) &&
               check_len("grid_sample_planes", &ob, "out", C * P)) {
#if OPB_PLANES
        Py_BEGIN_ALLOW_THREADS;
        sample_planes((const float *)xb.buf, (const float *)gb.buf, (float *)ob.buf, C, (int)H, (int)W, P, mode,
                      padding, align, p0, p1);
        Py_END_ALLOW_THREADS;
#endif
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&xb);
    PyBuffer_Release(&gb);
    PyBuffer_Release(&ob);
    return result;
}

PyDoc_STRVAR(planes_apply_doc,
             "planes_apply(C, H, W, mode)\n\n"
             "Whether grid_sample reads an image of C channels of H x W from its planes (grid_sample_planes)\n"
             "in this mode (0 bilinear, 1 nearest, 2 bicubic): few channels, on a CPU with AVX2 and FMA.");

static PyObject *py_planes_apply(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t C, H, W;
    int mode;
    if (!PyArg_ParseTuple(args, "nnni", &C, &H, &W, &mode)) return NULL;
    return PyBool_FromLong(planes_apply(C, H, W, mode));
}

PyDoc_STRVAR(resize_bicubic_doc,
             "resize_bicubic(x, out, planes, H, W, Ho, Wo, align, p0, p1, oy0, oy1)\n\n"
             "F.interpolate(mode=\"bicubic\") of x (planes, H, W) into out (planes, Ho, Wo), both contiguous\n"
             "float32; only planes [p0, p1) and output rows [oy0, oy1). Releases the GIL while it runs.");

/* The taps of both output axes of a resize, in one block (free() it): resize_axes_t points into it. */
typedef struct {
    const int32_t (*yi)[4], (*xi)[4];
    const float (*wy)[4], (*wx)[4];
} resize_axes_t;

static void *resize_axes(Py_ssize_t H, Py_ssize_t W, Py_ssize_t Ho, Py_ssize_t Wo, int align, resize_axes_t *ax) {
    char *block = (char *)malloc((size_t)(Ho + Wo) * (4 * sizeof(int32_t) + 4 * sizeof(float)));
    if (block == NULL) return NULL;
    int32_t(*yi)[4] = (int32_t(*)[4])block;
    int32_t(*xi)[4] = yi + Ho;
    float(*wy)[4] = (float(*)[4])(xi + Wo);
    float(*wx)[4] = wy + Ho;
    resize_axis(H, Ho, align, yi, wy);
    resize_axis(W, Wo, align, xi, wx);
    ax->yi = (const int32_t(*)[4])yi;
    ax->xi = (const int32_t(*)[4])xi;
    ax->wy = (const float(*)[4])wy;
    ax->wx = (const float(*)[4])wx;
    return block;
}

/* planes [p0, p1), output rows [oy0, oy1) of a resize: only the input rows those output rows read
   (at most four per output row, however far apart: a strong downscale skips the rows between) go
   through the horizontal pass, into a buffer of their own; -1 where it cannot be allocated. An
   output row reads a run of adjacent input rows (i0 - 1 .. i0 + 2, clamped), and the runs' first
   and last rows never decrease along the output rows (resize_axis): so the rows read are collected
   in one pass, in order and without repeats, and a row not past the last one collected is one of
   the last four. */
static int resize_range(const float *x, float *out, Py_ssize_t H, Py_ssize_t W, Py_ssize_t Ho, Py_ssize_t Wo,
                        const resize_axes_t *ax, Py_ssize_t p0, Py_ssize_t p1, Py_ssize_t oy0, Py_ssize_t oy1) {
    if (p1 <= p0 || oy1 <= oy0) return 0;
    const Py_ssize_t n_out = oy1 - oy0;
    int32_t *rows_in = (int32_t *)malloc((size_t)n_out * 4 * sizeof(int32_t));
    int32_t(*slot)[4] = (int32_t(*)[4])malloc((size_t)n_out * sizeof(int32_t[4]));
    Py_ssize_t n_rows = 0;
    if (rows_in != NULL && slot != NULL) {
        for (Py_ssize_t oy = oy0; oy < oy1; ++oy)
            for (int k = 0; k < 4; ++k) {
                const int32_t r = ax->yi[oy][k];
                if (n_rows == 0 || r > rows_in[n_rows - 1]) rows_in[n_rows++] = r;
                Py_ssize_t at = n_rows - 1;
                while (at > 0 && rows_in[at] != r) --at;
                slot[oy - oy0][k] = (int32_t)at;
            }
    }
    float *rows = rows_in != NULL && slot != NULL ? (float *)malloc((size_t)n_rows * (size_t)Wo * sizeof(float)) : NULL;
    if (rows != NULL)
        resize_bicubic(x, out, H, W, Ho, Wo, ax->wy, ax->xi, ax->wx, p0, p1, oy0, oy1, rows_in, n_rows,
                       (const int32_t(*)[4])slot, rows);
    free(rows);
    free(slot);
    free(rows_in);
    return rows != NULL ? 0 : -1;
}

static PyObject *py_resize_bicubic(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer xb, ob;
    Py_ssize_t planes, H, W, Ho, Wo, p0, p1, oy0, oy1;
    int align;
    if (!PyArg_ParseTuple(args, "y*w*nnnnnpnnnn", &xb, &ob, &planes, &H, &W, &Ho, &Wo, &align, &p0, &p1, &oy0, &oy1))
        return NULL;
    PyObject *result = NULL;
    if (!resize_sizes_valid(planes, H, W, Ho, Wo)) {
        PyErr_Format(PyExc_ValueError,
                     "resize_bicubic: sizes planes=%zd H=%zd W=%zd Ho=%zd Wo=%zd; planes >= 0, the others from 1 to 2**31 - 2", planes,
                     H, W, Ho, Wo);
    } else if (range_ok("resize_bicubic", p0, p1, planes) && range_ok("resize_bicubic", oy0, oy1, Ho) &&
               check_len("resize_bicubic", &xb, "x", planes * H * W) &&
               check_len("resize_bicubic", &ob, "out", planes * Ho * Wo)) {
        resize_axes_t ax;
        void *block = resize_axes(H, W, Ho, Wo, align, &ax);
        int rc = -1;
        if (block != NULL) {
            Py_BEGIN_ALLOW_THREADS;
            rc = resize_range((const float *)xb.buf, (float *)ob.buf, H, W, Ho, Wo, &ax, p0, p1, oy0, oy1);
            Py_END_ALLOW_THREADS;
            free(block);
        }
        result = rc < 0 ? PyErr_NoMemory() : Py_NewRef(Py_None);
    }
    PyBuffer_Release(&xb);
    PyBuffer_Release(&ob);
    return result;
}

/* the ValueError naming RoI r of a failed roi_geometry */
static void roi_error(const float *roi, Py_ssize_t r, int why, Py_ssize_t N) {
    PyObject *v[5] = {NULL, NULL, NULL, NULL, NULL};
    int ok = 1;
    for (int k = 0; k < 5; ++k) ok &= (v[k] = PyFloat_FromDouble(roi[k])) != NULL;
    if (!ok) {
        /* PyFloat_FromDouble set the error */
    } else if (why == ROI_BAD_BATCH) {
        PyErr_Format(PyExc_ValueError, "roi_align: RoI %zd has batch index %R, outside the feature batch of %zd", r,
                     v[0], N);
    } else {
        PyErr_Format(PyExc_ValueError,
                     "roi_align: RoI %zd [%R, %R, %R, %R] needs a sampling grid that is not finite or over %d "
                     "samples (the bins times the samples of a bin); pass finite boxes on the feature map's scale "
                     "or a smaller sampling_ratio > 0",
                     r, v[1], v[2], v[3], v[4], (int)ROI_MAX_SAMPLES);
    }
    for (int k = 0; k < 5; ++k) Py_XDECREF(v[k]);
}

PyDoc_STRVAR(roi_align_doc,
             "roi_align(xt, rois, out, N, C, H, W, R, PH, PW, spatial_scale, sampling_ratio, pool_max, aligned,\n"
             "          r0, r1)\n\n"
             "MMCV roi_align of RoIs [r0, r1) of rois (R, 5) [batch index, x1, y1, x2, y2] into out (R, C, PH, PW),\n"
             "from the N images of xt, each channels-last as (H * W + 1, C) (to_channels_last); all contiguous\n"
             "float32. A RoI whose batch index is outside [0, N) (after truncation) or whose sampling grid is\n"
             "not finite or over 2**24 samples (the bins times the samples of a bin) raises ValueError before\n"
             "anything is written. Releases the GIL while it runs.");

static PyObject *py_roi_align(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer tb, rb, ob;
    Py_ssize_t N, C, H, W, R, PH, PW, r0, r1;
    double scale;
    int sampling, pool_max, aligned;
    if (!PyArg_ParseTuple(args, "y*y*w*nnnnnnndippnn", &tb, &rb, &ob, &N, &C, &H, &W, &R, &PH, &PW, &scale,
                          &sampling, &pool_max, &aligned, &r0, &r1))
        return NULL;
    PyObject *result = NULL;
    float *acc = NULL;
    if (!roi_sizes_valid(N, C, H, W, R, PH, PW)) {
        PyErr_Format(PyExc_ValueError,
                     "roi_align: sizes N=%zd R=%zd PH=%zd PW=%zd; N, PH, PW >= 1 and R >= 0 expected", N, R, PH, PW);
    } else if (sizes_ok("roi_align", C, H, W, 0) && range_ok("roi_align", r0, r1, R) &&
               check_len("roi_align", &tb, "xt", N * (H * W + 1) * C) && check_len("roi_align", &rb, "rois", R * 5) &&
               check_len("roi_align", &ob, "out", R * C * PH * PW)) {
        const float *rois = (const float *)rb.buf;
        int why = ROI_OK;
        const Py_ssize_t bad =
            first_bad_roi(rois, r0, r1, (int)N, (float)scale, sampling, aligned, (int)PH, (int)PW, &why);
        if (bad >= 0) {
            roi_error(rois + 5 * bad, bad, why, N);
        } else if ((acc = PyMem_RawMalloc((size_t)C * sizeof(float))) == NULL) {
            PyErr_NoMemory();
        } else {
            Py_BEGIN_ALLOW_THREADS;
            roi_align_rois((const float *)tb.buf, rois, (float *)ob.buf, C, (int)N, (int)H, (int)W, (int)PH, (int)PW,
                           (float)scale, sampling, pool_max, aligned, r0, r1, acc);
            Py_END_ALLOW_THREADS;
            result = Py_NewRef(Py_None);
        }
    }
    PyMem_RawFree(acc);
    PyBuffer_Release(&tb);
    PyBuffer_Release(&rb);
    PyBuffer_Release(&ob);
    return result;
}

/* ------------------------------------------------------------------ native kernels (ONNX Runtime's bridge)
 *
 * The same kernels behind opbridge's native kernel ABI (../_native_kernel.h): opbridge's ONNX Runtime
 * bridge calls them without Python, splitting the work over the session's intra-op threads. Inputs
 * the Python kernel treats differently (another dtype, too few channels, empty planes and the
 * errors it names) are declined, and that kernel runs. */

/* The calling thread's channels-last buffer, kept for its next call up to KEEP_FLOATS floats (a
   fresh allocation per call cost up to 0.7 ms of page faults at 1x16x128x128); freed with the thread. */
#define KEEP_FLOATS ((size_t)4 << 20)
typedef struct {
    float *data;
    size_t n;
} kept_t;
static pthread_key_t g_kept_key;
static pthread_once_t g_kept_once = PTHREAD_ONCE_INIT;
static int g_kept_ok = 0;

static void kept_free(void *p) {
    kept_t *k = (kept_t *)p;
    free(k->data);
    free(k);
}
static void kept_init(void) { g_kept_ok = pthread_key_create(&g_kept_key, kept_free) == 0; }

/* n floats; *owned says whether the caller frees them (else they are the thread's kept buffer) */
static float *scratch(size_t n, int *owned) {
    pthread_once(&g_kept_once, kept_init);
    kept_t *k = g_kept_ok ? (kept_t *)pthread_getspecific(g_kept_key) : NULL;
    *owned = 0;
    if (k != NULL && k->n >= n) return k->data;
    float *data = (float *)malloc(n * sizeof(float));
    if (data == NULL || n > KEEP_FLOATS || !g_kept_ok) {
        *owned = data != NULL;
        return data;
    }
    if (k == NULL) {
        k = (kept_t *)calloc(1, sizeof(kept_t));
        if (k == NULL || pthread_setspecific(g_kept_key, k) != 0) {
            free(k);
            *owned = 1;
            return data;
        }
    }
    free(k->data);
    k->data = data;
    k->n = n;
    return data;
}

/* pieces for `work` units: one per thread of the session, each of at least `per_piece` units (one
   piece below), at most `limit` (as the Python kernels split their calls over torch's threads) */
#define NATIVE_PIECE ((int64_t)1 << 16)
static size_t pieces_for(const opb_native_call *call, int64_t work, int64_t per_piece, int64_t limit) {
    int64_t p = work / per_piece;
    if (p > call->threads) p = call->threads;
    if (p > limit) p = limit;
    return p < 1 ? 1 : (size_t)p;
}

/* the node's output 0 allocated as float32 of shape dims (N, C, Ho, Wo), or NULL with the message in
   call->err */
static float *float_output(const opb_native_call *call, const char *op, const int64_t dims[4]) {
    int32_t elem = 0;
    float *out = (float *)call->output(call, 0, dims, 4, &elem);
    if (out != NULL && elem != OPB_NATIVE_FLOAT) {
        snprintf(call->err, call->err_len, "%s (native): the node's output is not float32 (type %d)", op, elem);
        return NULL;
    }
    return out;
}

/* where piece i of `pieces` equal ranges of [0, n) starts (piece i ends where piece i + 1 starts) */
static inline Py_ssize_t piece_start(Py_ssize_t n, size_t i, size_t pieces) {
    return n * (Py_ssize_t)i / (Py_ssize_t)pieces;
}

static void run_pieces(const opb_native_call *call, void (*fn)(void *, size_t), size_t n, void *user) {
    if (n == 1) fn(user, 0);
    else call->parallel_for(call, fn, n, user);
}

/* one image x (C, HW) channels-last into xt (HW + 1, S), its pixels in `pieces` ranges */
typedef struct {
    const float *x;
    float *xt;
    Py_ssize_t C, S, HW;
    size_t pieces;
} layout_job_t;

static void layout_piece(void *user, size_t i) {
    const layout_job_t *j = (const layout_job_t *)user;
    nchw_to_nhwc(j->x, j->xt, j->C, j->S, j->HW, piece_start(j->HW, i, j->pieces),
                 piece_start(j->HW, i + 1, j->pieces));
}

static void to_channels_last_pieces(const opb_native_call *call, const float *x, float *xt, Py_ssize_t C,
                                    Py_ssize_t S, Py_ssize_t HW) {
    layout_job_t job = {x, xt, C, S, HW, pieces_for(call, C * HW, NATIVE_PIECE, HW)};
    run_pieces(call, layout_piece, job.pieces, &job);
}

typedef struct {
    opb_native_kernel base;
    int mode, padding, align, min_channels;
} grid_native_t;

typedef struct {
    const float *grid, *x; /* x: the image's planes, where the job reads them directly */
    float *xt, *out;
    Py_ssize_t C, S, H, W, P;
    int mode, padding, align;
    size_t pieces;
    int failed; /* a piece could not allocate its tile */
} grid_job_t;

static void grid_sample_piece(void *user, size_t i) {
    grid_job_t *j = (grid_job_t *)user;
    void *work = malloc(sizeof(tile_t) + (size_t)TILE * (size_t)j->S * sizeof(float));
    if (work == NULL) {
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    sample_nhwc(j->xt, j->grid, j->out, j->C, j->S, (int)j->H, (int)j->W, j->P, j->mode, j->padding, j->align,
                piece_start(j->P, i, j->pieces), piece_start(j->P, i + 1, j->pieces),
                work);
    free(work);
}

static void grid_planes_piece(void *user, size_t i) {
#if OPB_PLANES
    grid_job_t *j = (grid_job_t *)user;
    sample_planes(j->x, j->grid, j->out, j->C, (int)j->H, (int)j->W, j->P, j->mode, j->padding, j->align,
                  piece_start(j->P, i, j->pieces), piece_start(j->P, i + 1, j->pieces));
#else
    (void)user, (void)i;
#endif
}

static int grid_native_compute(const opb_native_kernel *self, const opb_native_call *call) {
    const grid_native_t *k = (const grid_native_t *)self;
    if (call->n_inputs < 2 || call->n_outputs != 1) return OPB_NATIVE_DECLINE;
    const opb_native_tensor *x = &call->inputs[0], *g = &call->inputs[1];
    if (x->elem != OPB_NATIVE_FLOAT || g->elem != OPB_NATIVE_FLOAT || x->rank != 4 || g->rank != 4 ||
        x->data == NULL || g->data == NULL)
        return OPB_NATIVE_DECLINE;
    const int64_t N = x->dims[0], C = x->dims[1], H = x->dims[2], W = x->dims[3];
    const int64_t Ho = g->dims[1], Wo = g->dims[2];
    /* other shapes, empty outputs and empty planes: the Python kernel's result or error */
    if (g->dims[0] != N || g->dims[3] != 2 || N < 1 || Ho < 1 || Wo < 1 || !grid_sizes_valid(C, H, W, Ho * Wo))
        return OPB_NATIVE_DECLINE;
    /* few channels: read straight from the planes, no copy; else fewer than min_channels declined */
    const int planes = planes_apply(C, H, W, k->mode);
    if (C < k->min_channels && !planes) return OPB_NATIVE_DECLINE;
    const int64_t dims[4] = {N, C, Ho, Wo};
    float *out = float_output(call, "grid_sample", dims);
    if (out == NULL) return OPB_NATIVE_ERROR;
    grid_job_t job = {0};
    job.C = C;
    job.S = grid_channel_stride(C);
    job.H = H;
    job.W = W;
    job.P = Ho * Wo;
    job.mode = k->mode;
    job.padding = k->padding;
    job.align = k->align;
    job.pieces = pieces_for(call, C * job.P, NATIVE_PIECE, job.P);
    int owned = 0;
    if (!planes) {
        job.xt = scratch((size_t)(H * W + 1) * (size_t)job.S, &owned);
        if (job.xt == NULL) {
            snprintf(call->err, call->err_len, "grid_sample (native): out of memory for a %lldx%lld image",
                     (long long)H, (long long)W);
            return OPB_NATIVE_ERROR;
        }
    }
    for (int64_t n = 0; n < N && !job.failed; ++n) {
        const float *image = (const float *)x->data + n * C * H * W;
        if (planes)
            job.x = image;
        else
            to_channels_last_pieces(call, image, job.xt, C, job.S, H * W);
        job.grid = (const float *)g->data + n * job.P * 2;
        job.out = out + n * C * job.P;
        run_pieces(call, planes ? grid_planes_piece : grid_sample_piece, job.pieces, &job);
    }
    if (owned) free(job.xt);
    if (job.failed) {
        snprintf(call->err, call->err_len, "grid_sample (native): out of memory for a tile of %zd channels", job.C);
        return OPB_NATIVE_ERROR;
    }
    return OPB_NATIVE_DONE;
}

typedef struct {
    opb_native_kernel base;
    int align;
} resize_native_t;

typedef struct {
    const float *x;
    float *out;
    Py_ssize_t planes, H, W, Ho, Wo;
    resize_axes_t ax;
    size_t pieces;
    int by_rows; /* pieces are bands of output rows (few planes), else ranges of planes */
    int failed;
} resize_job_t;

static void resize_piece(void *user, size_t i) {
    resize_job_t *j = (resize_job_t *)user;
    const Py_ssize_t n = j->by_rows ? j->Ho : j->planes;
    const Py_ssize_t a = piece_start(n, i, j->pieces), b = piece_start(n, i + 1, j->pieces);
    const int rc = j->by_rows ? resize_range(j->x, j->out, j->H, j->W, j->Ho, j->Wo, &j->ax, 0, j->planes, a, b)
                              : resize_range(j->x, j->out, j->H, j->W, j->Ho, j->Wo, &j->ax, a, b, 0, j->Ho);
    if (rc < 0) __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
}

/* DynamicResize: x (N, C, H, W) float32 to the last two sizes of the second input's shape */
static int resize_native_compute(const opb_native_kernel *self, const opb_native_call *call) {
    const resize_native_t *k = (const resize_native_t *)self;
    if (call->n_inputs < 2 || call->n_outputs != 1) return OPB_NATIVE_DECLINE;
    const opb_native_tensor *x = &call->inputs[0], *size = &call->inputs[1];
    if (x->elem != OPB_NATIVE_FLOAT || x->rank != 4 || x->data == NULL || size->elem == 0 || size->rank < 2)
        return OPB_NATIVE_DECLINE;
    const int64_t N = x->dims[0], C = x->dims[1], H = x->dims[2], W = x->dims[3];
    const int64_t Ho = size->dims[size->rank - 2], Wo = size->dims[size->rank - 1];
    /* empty inputs or outputs and bad sizes: the Python kernel's result or error */
    if (N < 1 || C < 1 || !resize_sizes_valid(N * C, H, W, Ho, Wo)) return OPB_NATIVE_DECLINE;
    const int64_t dims[4] = {N, C, Ho, Wo};
    float *out = float_output(call, "resize_bicubic", dims);
    if (out == NULL) return OPB_NATIVE_ERROR;
    resize_job_t job = {0};
    job.x = (const float *)x->data;
    job.out = out;
    job.planes = N * C;
    job.H = H;
    job.W = W;
    job.Ho = Ho;
    job.Wo = Wo;
    void *block = resize_axes(H, W, Ho, Wo, k->align, &job.ax);
    if (block == NULL) {
        snprintf(call->err, call->err_len, "resize_bicubic (native): out of memory for %lldx%lld outputs",
                 (long long)Ho, (long long)Wo);
        return OPB_NATIVE_ERROR;
    }
    /* ranges of planes, or with fewer planes than pieces bands of output rows (each band reads its
       own input rows, the three at its edges again) */
    job.pieces = pieces_for(call, job.planes * Ho * Wo, NATIVE_PIECE, job.planes > Ho ? job.planes : Ho);
    job.by_rows = job.planes < (Py_ssize_t)job.pieces;
    run_pieces(call, resize_piece, job.pieces, &job);
    free(block);
    if (job.failed) {
        snprintf(call->err, call->err_len, "resize_bicubic (native): out of memory for input rows %lld wide",
                 (long long)Wo);
        return OPB_NATIVE_ERROR;
    }
    return OPB_NATIVE_DONE;
}

typedef struct {
    opb_native_kernel base;
    int PH, PW, sampling, pool_max, aligned;
    float scale;
} roi_native_t;

typedef struct {
    const roi_native_t *k;
    const float *xt, *rois;
    float *out;
    Py_ssize_t C, R;
    int N, H, W;
    size_t pieces;
    int failed; /* a piece could not allocate its channel sums */
} roi_job_t;

static void roi_piece(void *user, size_t i) {
    roi_job_t *j = (roi_job_t *)user;
    float *acc = (float *)malloc((size_t)j->C * sizeof(float));
    if (acc == NULL) {
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    const roi_native_t *k = j->k;
    roi_align_rois(j->xt, j->rois, j->out, j->C, j->N, j->H, j->W, k->PH, k->PW, k->scale, k->sampling, k->pool_max,
                   k->aligned, piece_start(j->R, i, j->pieces), piece_start(j->R, i + 1, j->pieces), acc);
    free(acc);
}

/* MMCVRoiAlign: features (N, C, H, W) and rois (R, 5), both float32 */
static int roi_native_compute(const opb_native_kernel *self, const opb_native_call *call) {
    const roi_native_t *k = (const roi_native_t *)self;
    if (call->n_inputs < 2 || call->n_outputs != 1) return OPB_NATIVE_DECLINE;
    const opb_native_tensor *x = &call->inputs[0], *rois = &call->inputs[1];
    if (x->elem != OPB_NATIVE_FLOAT || rois->elem != OPB_NATIVE_FLOAT || x->rank != 4 || rois->rank != 2 ||
        rois->dims[1] != 5 || x->data == NULL || rois->data == NULL)
        return OPB_NATIVE_DECLINE;
    const int64_t N = x->dims[0], C = x->dims[1], H = x->dims[2], W = x->dims[3], R = rois->dims[0];
    /* empty inputs or outputs and sizes out of range: the Python kernel's result or error */
    if (R < 1 || !roi_sizes_valid(N, C, H, W, R, k->PH, k->PW) || !grid_sizes_valid(C, H, W, 0))
        return OPB_NATIVE_DECLINE;
    const float *boxes = (const float *)rois->data;
    int why = ROI_OK; /* a bad RoI: the Python kernel's ValueError names it */
    if (first_bad_roi(boxes, 0, R, (int)N, k->scale, k->sampling, k->aligned, k->PH, k->PW, &why) >= 0)
        return OPB_NATIVE_DECLINE;
    const int64_t dims[4] = {R, C, k->PH, k->PW};
    float *out = float_output(call, "roi_align", dims);
    if (out == NULL) return OPB_NATIVE_ERROR;
    const Py_ssize_t image = (H * W + 1) * C;
    int owned = 0;
    float *xt = scratch((size_t)(N * image), &owned);
    if (xt == NULL) {
        snprintf(call->err, call->err_len, "roi_align (native): out of memory for %lldx%lldx%lldx%lld features",
                 (long long)N, (long long)C, (long long)H, (long long)W);
        return OPB_NATIVE_ERROR;
    }
    for (int64_t n = 0; n < N; ++n)
        to_channels_last_pieces(call, (const float *)x->data + n * C * H * W, xt + n * image, C, C, H * W);
    /* at least 8 RoIs a piece, as the Python kernel splits them */
    roi_job_t job = {k, xt, boxes, out, C, R, (int)N, (int)H, (int)W, pieces_for(call, R, 8, R), 0};
    run_pieces(call, roi_piece, job.pieces, &job);
    if (owned) free(xt);
    if (job.failed) {
        snprintf(call->err, call->err_len, "roi_align (native): out of memory for %lld channel sums", (long long)C);
        return OPB_NATIVE_ERROR;
    }
    return OPB_NATIVE_DONE;
}

static void native_capsule_free(PyObject *capsule) { free(PyCapsule_GetPointer(capsule, OPB_NATIVE_CAPSULE)); }

/* a capsule owning k (calloc'ed, its attributes set), which becomes the native kernel `name` */
static PyObject *native_capsule(opb_native_kernel *k, const char *name,
                                int (*compute)(const opb_native_kernel *, const opb_native_call *)) {
    k->abi = OPB_NATIVE_ABI;
    k->name = name;
    k->compute = compute;
    PyObject *capsule = PyCapsule_New(k, OPB_NATIVE_CAPSULE, native_capsule_free);
    if (capsule == NULL) free(k);
    return capsule;
}

PyDoc_STRVAR(grid_sample_native_doc,
             "grid_sample_native(mode, padding, align, min_channels)\n\n"
             "grid_sample as a native kernel for ONNX Runtime's bridge (a capsule, see _native_kernel.h): float32\n"
             "inputs with at least min_channels channels, or few enough for the planes path (planes_apply); other\n"
             "inputs are declined to the Python kernel.");

static PyObject *py_grid_sample_native(PyObject *self, PyObject *args) {
    (void)self;
    int mode, padding, align, min_channels;
    if (!PyArg_ParseTuple(args, "iipi", &mode, &padding, &align, &min_channels)) return NULL;
    if (mode < BILINEAR || mode > BICUBIC || padding < 0 || padding > 2 || min_channels < 1) {
        PyErr_Format(PyExc_ValueError,
                     "grid_sample_native: mode %d, padding %d, min_channels %d; modes 0-2, paddings 0-2, "
                     "min_channels >= 1",
                     mode, padding, min_channels);
        return NULL;
    }
    grid_native_t *k = (grid_native_t *)calloc(1, sizeof(grid_native_t));
    if (k == NULL) return PyErr_NoMemory();
    k->mode = mode;
    k->padding = padding;
    k->align = align;
    k->min_channels = min_channels;
    return native_capsule(&k->base, "grid_sample", grid_native_compute);
}

PyDoc_STRVAR(resize_bicubic_native_doc,
             "resize_bicubic_native(align)\n\n"
             "DynamicResize (bicubic, to the second input's last two sizes) as a native kernel for ONNX Runtime's\n"
             "bridge (a capsule, see _native_kernel.h): float32 inputs; other inputs are declined to the Python\n"
             "kernel.");

static PyObject *py_resize_bicubic_native(PyObject *self, PyObject *args) {
    (void)self;
    int align;
    if (!PyArg_ParseTuple(args, "p", &align)) return NULL;
    resize_native_t *k = (resize_native_t *)calloc(1, sizeof(resize_native_t));
    if (k == NULL) return PyErr_NoMemory();
    k->align = align;
    return native_capsule(&k->base, "resize_bicubic", resize_native_compute);
}

PyDoc_STRVAR(roi_align_native_doc,
             "roi_align_native(output_height, output_width, spatial_scale, sampling_ratio, pool_max, aligned)\n\n"
             "MMCV roi_align as a native kernel for ONNX Runtime's bridge (a capsule, see _native_kernel.h): float32\n"
             "features and RoIs; other inputs, and RoIs roi_align refuses, are declined to the Python kernel.");

static PyObject *py_roi_align_native(PyObject *self, PyObject *args) {
    (void)self;
    int PH, PW, sampling, pool_max, aligned;
    double scale;
    if (!PyArg_ParseTuple(args, "iidipp", &PH, &PW, &scale, &sampling, &pool_max, &aligned)) return NULL;
    if (PH < 1 || PW < 1 || (double)PH * PW >= (double)INT32_MAX) {
        PyErr_Format(PyExc_ValueError,
                     "roi_align_native: output %dx%d; both at least 1 and their product below 2**31 expected", PH, PW);
        return NULL;
    }
    roi_native_t *k = (roi_native_t *)calloc(1, sizeof(roi_native_t));
    if (k == NULL) return PyErr_NoMemory();
    k->PH = PH;
    k->PW = PW;
    k->scale = (float)scale;
    k->sampling = sampling;
    k->pool_max = pool_max;
    k->aligned = aligned;
    return native_capsule(&k->base, "roi_align", roi_native_compute);
}

static PyMethodDef methods[] = {
    {"to_channels_last", py_to_channels_last, METH_VARARGS, to_channels_last_doc},
    {"grid_sample", py_grid_sample, METH_VARARGS, grid_sample_doc},
    {"grid_sample_planes", py_grid_sample_planes, METH_VARARGS, grid_sample_planes_doc},
    {"planes_apply", py_planes_apply, METH_VARARGS, planes_apply_doc},
    {"resize_bicubic", py_resize_bicubic, METH_VARARGS, resize_bicubic_doc},
    {"roi_align", py_roi_align, METH_VARARGS, roi_align_doc},
    {"channel_stride", py_channel_stride, METH_O, channel_stride_doc},
    {"grid_sample_native", py_grid_sample_native, METH_VARARGS, grid_sample_native_doc},
    {"resize_bicubic_native", py_resize_bicubic_native, METH_VARARGS, resize_bicubic_native_doc},
    {"roi_align_native", py_roi_align_native, METH_VARARGS, roi_align_native_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cpu_kernels", "opbridge's native CPU kernels (see _cpu_kernels.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__cpu_kernels(void) { return PyModule_Create(&module); }
