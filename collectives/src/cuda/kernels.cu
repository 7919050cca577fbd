// busbw device kernels: verifiable inputs, expected outputs, comparison and reductions.
//
// A port of collectives/src/verifiable.rs, element.rs and element/narrow.rs, written in the
// subset of C++ that both NVRTC and a host C++ compiler accept: the host build (see the
// `BUSBW_HOST` branch below) is how the tests check, without a GPU, that these functions
// produce the very bits the Rust host path produces. Narrow floats are stored as their bits
// and converted with the same integer rounding as the host, never with CUDA intrinsics, so
// host and device agree by construction. Compile with --fmad=false: a contracted multiply-add
// would round once where the host rounds twice.

#ifdef BUSBW_HOST
#include <stdint.h>
#include <string.h>
#define BUSBW_FN static inline
#define BUSBW_KERNEL extern "C"
// The host build runs a kernel as one thread walking the whole grid-stride loop.
#define BUSBW_TID 0ull
#define BUSBW_STRIDE 1ull
#define BUSBW_ATOMIC_ADD(p, v) (*(p) += (v))
#else
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#define BUSBW_FN static __device__ __forceinline__
#define BUSBW_KERNEL extern "C" __global__
#define BUSBW_TID ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x)
#define BUSBW_STRIDE ((uint64_t)gridDim.x * blockDim.x)
#define BUSBW_ATOMIC_ADD(p, v) atomicAdd((unsigned long long *)(p), (unsigned long long)(v))
#endif

enum { OP_SUM = 0, OP_PROD = 1, OP_MAX = 2, OP_MIN = 3, OP_AVG = 4, OP_MULSUM = 5 };

#ifdef BUSBW_HOST
BUSBW_FN uint32_t f2u(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
BUSBW_FN float u2f(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }
BUSBW_FN uint64_t d2u(double x) { uint64_t u; memcpy(&u, &x, 8); return u; }
BUSBW_FN double u2d(uint64_t u) { double x; memcpy(&x, &u, 8); return x; }
#else
BUSBW_FN uint32_t f2u(float x) { return __float_as_uint(x); }
BUSBW_FN float u2f(uint32_t u) { return __uint_as_float(u); }
BUSBW_FN uint64_t d2u(double x) { return (uint64_t)__double_as_longlong(x); }
BUSBW_FN double u2d(uint64_t u) { return __longlong_as_double((long long)u); }
#endif

// ---- hashing (verifiable.rs: mix, hash, shared_hash, own_hash) ----
BUSBW_FN uint64_t mix(uint64_t z) {
  z = z + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
BUSBW_FN uint64_t hash3(uint64_t seed, uint64_t index, uint64_t salt) {
  return mix(mix(seed ^ (salt * 0xa0761d6478bd642full)) ^ index);
}
BUSBW_FN uint64_t op_salt(int op) { return (uint64_t)op + 1; }
BUSBW_FN uint64_t shared_hash(int op, uint64_t seed, uint64_t index) {
  return hash3(seed, index, (1ull << 63) | op_salt(op));
}
BUSBW_FN uint64_t own_hash(int op, uint64_t seed, uint64_t index, uint64_t rank) {
  return hash3(seed, index, ((rank + 1) << 8) | op_salt(op));
}
BUSBW_FN uint32_t log2_ceil(uint64_t n) {
  uint64_t m = n > 0 ? n - 1 : 0;
  uint32_t lz = 64;
  while (m) { lz--; m >>= 1; }
  return 64 - lz;
}
BUSBW_FN double pow2(int32_t e) { return u2d((uint64_t)(e + 1023) << 52); }
BUSBW_FN int32_t pick(uint64_t h, int32_t lo, int32_t hi) {
  return lo + (int32_t)(h % (uint64_t)(hi - lo + 1));
}
BUSBW_FN void clamp_range(int32_t lo, int32_t hi, int32_t wlo, int32_t whi, int32_t *olo, int32_t *ohi) {
  int32_t a = lo > wlo ? lo : wlo, b = hi < whi ? hi : whi;
  if (a <= b) { *olo = a; *ohi = b; }
  else if (lo <= hi) { *olo = lo; *ohi = hi; }
  else { *olo = hi; *ohi = hi; }
}

// ---- narrow float rounding (element/narrow.rs) ----
struct Format { uint32_t man; int32_t bias; uint32_t sign_shift, max_finite, overflow, nan; int finite_only; };
BUSBW_FN Format make_format(uint32_t man, int32_t bias, uint32_t ss, uint32_t mf, uint32_t ov, uint32_t nan, int fo) {
  Format f;
  f.man = man; f.bias = bias; f.sign_shift = ss; f.max_finite = mf; f.overflow = ov; f.nan = nan; f.finite_only = fo;
  return f;
}
#define FMT_F16 make_format(10, 15, 15, 0x7bff, 0x7c00, 0x7e00, 0)
#define FMT_BF16 make_format(7, 127, 15, 0x7f7f, 0x7f80, 0x7fc0, 0)
#define FMT_E4M3 make_format(3, 7, 7, 0x7e, 0x7f, 0x7f, 1)
#define FMT_E5M2 make_format(2, 15, 7, 0x7b, 0x7c, 0x7f, 0)

BUSBW_FN uint32_t encode_f64(double x, Format f) {
  uint64_t bits = d2u(x);
  uint32_t sign = (uint32_t)(bits >> 63) << f.sign_shift;
  uint64_t abs = bits & ~(1ull << 63);
  if (abs > 0x7ff0000000000000ull) return f.nan | sign;
  if (abs == 0x7ff0000000000000ull) return f.overflow | sign;
  int32_t field = (int32_t)(abs >> 52);
  if (field == 0) return sign;
  int32_t e = field - 1023;
  uint64_t sig = (abs & ((1ull << 52) - 1)) | (1ull << 52);
  int32_t emin = 1 - f.bias;
  int32_t e_eff = e > emin ? e : emin;
  int32_t shift = 52 - (int32_t)f.man + (e_eff - e);
  if (shift > 54) return sign;
  uint64_t half = 1ull << (shift - 1);
  uint64_t rem = sig & ((1ull << shift) - 1);
  uint64_t q = sig >> shift;
  if (rem > half || (rem == half && (q & 1) == 1)) q += 1;
  uint64_t mag = ((uint64_t)(e_eff - emin) << f.man) + q;
  if (mag > f.max_finite) return f.overflow | sign;
  return (uint32_t)mag | sign;
}

BUSBW_FN uint32_t encode_f32(float x, Format f) {
  uint32_t u = f2u(x);
  uint32_t abs = u & 0x7fffffffu;
  uint32_t sign = (u >> 31) << f.sign_shift;
  uint32_t shift = 23 - f.man;
  uint32_t odd = (abs >> shift) & 1;
  uint32_t rebias = (uint32_t)(127 - f.bias) << 23;
  uint32_t normal = (abs - rebias + ((1u << (shift - 1)) - 1 + odd)) >> shift;
  float magic = u2f((uint32_t)(1 - f.bias - (int32_t)f.man + 23 + 127) << 23);
  uint32_t sub = f2u(u2f(abs) + magic) - f2u(magic);
  uint32_t min_normal = (uint32_t)(1 - f.bias + 127) << 23;
  uint32_t mag = abs < min_normal ? sub : normal;
  mag = mag > f.max_finite ? f.overflow : mag;
  mag = abs > 0x7f800000u ? f.nan : mag;
  return mag | sign;
}

BUSBW_FN uint32_t decode_bits(uint32_t b, Format f) {
  uint32_t sign = ((b >> f.sign_shift) & 1) << 31;
  uint32_t mag = b & ((1u << f.sign_shift) - 1);
  int32_t e = (int32_t)(mag >> f.man);
  uint32_t m = mag & ((1u << f.man) - 1);
  int32_t all_ones = (1 << (f.sign_shift - f.man)) - 1;
  if (f.finite_only) {
    if (mag == (1u << f.sign_shift) - 1) return sign | 0x7fc00000u;
  } else if (e == all_ones) {
    return sign | (m == 0 ? 0x7f800000u : 0x7fc00000u);
  }
  if (e == 0) {
    if (m == 0) return sign;
    int32_t h = 31;
    while (!((m >> h) & 1)) h--;
    int32_t exp = 1 - f.bias - (int32_t)f.man + h;
    return sign | ((uint32_t)(exp + 127) << 23) | ((m - (1u << h)) << (23 - h));
  }
  return sign | ((uint32_t)(e - f.bias + 127) << 23) | (m << (23 - f.man));
}

BUSBW_FN uint16_t bf16_from_f32(float x) {
  uint32_t b = f2u(x);
  uint32_t rounded = (b + (0x7fffu + ((b >> 16) & 1))) >> 16;
  uint32_t nan = (b >> 16) | 0x40;
  return (uint16_t)((b & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

// ---- element types (element.rs): storage S, arithmetic, bits, float layout ----
#define INT_TYPE(NAME, S, U)                                                              \
  struct NAME {                                                                           \
    typedef S Store;                                                                      \
    enum { IS_FLOAT = 0 };                                                                \
    BUSBW_FN S add(S a, S b) { return (S)((U)a + (U)b); }                                 \
    BUSBW_FN S mul(S a, S b) { return (S)((U)a * (U)b); }                                 \
    BUSBW_FN S div_n(S a, uint64_t n) {                                                   \
      S d = (S)n;                                                                         \
      if ((uint64_t)(int64_t)d != n || d <= 0) return 0;                                  \
      return (S)(a / d);                                                                  \
    }                                                                                     \
    BUSBW_FN int lt(S a, S b) { return a < b; }                                           \
    BUSBW_FN uint64_t bits(S a) { return (uint64_t)(U)a; }                                \
    BUSBW_FN S from_f64(double v) { return (S)v; }                                        \
    BUSBW_FN S from_hash(uint64_t h) { return (S)(U)h; }                                  \
  };
INT_TYPE(T_int8, int8_t, uint8_t)
INT_TYPE(T_uint8, uint8_t, uint8_t)
INT_TYPE(T_int32, int32_t, uint32_t)
INT_TYPE(T_uint32, uint32_t, uint32_t)
INT_TYPE(T_int64, int64_t, uint64_t)
INT_TYPE(T_uint64, uint64_t, uint64_t)

#define WIDE_FLOAT(NAME, S, U, TOU, FROMU, MANT_, EBITS_, EMIN_, EMAX_)                          \
  struct NAME {                                                                           \
    typedef S Store;                                                                      \
    enum { IS_FLOAT = 1, MANT = MANT_, EXP_BITS = EBITS_, EMIN = EMIN_, EMAX = EMAX_ };   \
    BUSBW_FN S add(S a, S b) { return a + b; }                                            \
    BUSBW_FN S mul(S a, S b) { return a * b; }                                            \
    BUSBW_FN S div_n(S a, uint64_t n) { return a / (S)n; }                                \
    BUSBW_FN int lt(S a, S b) { return a < b; }                                           \
    BUSBW_FN uint64_t bits(S a) { return (uint64_t)TOU(a); }                              \
    BUSBW_FN S from_f64(double v) { return (S)v; }                                        \
    BUSBW_FN S from_raw(uint64_t b) { return FROMU((U)b); }                               \
  };
WIDE_FLOAT(T_float, float, uint32_t, f2u, u2f, 23, 8, -126, 127)
WIDE_FLOAT(T_double, double, uint64_t, d2u, u2d, 52, 11, -1022, 1023)

// Narrow floats widen to f32, operate, round once (element.rs narrow_float_element!).
#define NARROW_FLOAT(NAME, S, TOF, FROMF, FMT, MANT_, EBITS_, EMIN_, EMAX_)              \
  struct NAME {                                                                           \
    typedef S Store;                                                                      \
    enum { IS_FLOAT = 1, MANT = MANT_, EXP_BITS = EBITS_, EMIN = EMIN_, EMAX = EMAX_ };   \
    BUSBW_FN float to_f32(S a) { return TOF; }                                            \
    BUSBW_FN S from_f32(float x) { return (S)(FROMF); }                                   \
    BUSBW_FN S add(S a, S b) { return from_f32(to_f32(a) + to_f32(b)); }                  \
    BUSBW_FN S mul(S a, S b) { return from_f32(to_f32(a) * to_f32(b)); }                  \
    BUSBW_FN S div_n(S a, uint64_t n) { return from_f32(to_f32(a) / (float)n); }          \
    BUSBW_FN int lt(S a, S b) { return to_f32(a) < to_f32(b); }                           \
    BUSBW_FN uint64_t bits(S a) { return (uint64_t)a; }                                   \
    BUSBW_FN S from_f64(double v) { return (S)encode_f64(v, FMT); }         \
    BUSBW_FN S from_raw(uint64_t b) { return (S)b; }                                      \
  };
NARROW_FLOAT(T_half, uint16_t, u2f(decode_bits(a, FMT_F16)), encode_f32(x, FMT_F16), FMT_F16, 10, 5, -14, 15)
NARROW_FLOAT(T_bfloat16, uint16_t, u2f((uint32_t)a << 16), bf16_from_f32(x), FMT_BF16, 7, 8, -126, 127)
NARROW_FLOAT(T_f8e4m3, uint8_t, u2f(decode_bits(a, FMT_E4M3)), encode_f32(x, FMT_E4M3), FMT_E4M3, 3, 4, -6, 8)
NARROW_FLOAT(T_f8e5m2, uint8_t, u2f(decode_bits(a, FMT_E5M2)), encode_f32(x, FMT_E5M2), FMT_E5M2, 2, 5, -14, 15)

// ---- verifiable inputs (verifiable.rs float_input / int_verifiable) ----
template <class T, int IS_FLOAT> struct Input;
template <class T> struct Input<T, 0> {
  BUSBW_FN typename T::Store at(int op, uint64_t seed, uint64_t index, uint64_t rank, uint64_t n) {
    typename T::Store v = T::from_hash(own_hash(op, seed, index, rank));
    return op == OP_PROD ? (typename T::Store)(v | 1) : v;
  }
};
template <class T> struct Input<T, 1> {
  BUSBW_FN typename T::Store at(int op, uint64_t seed, uint64_t index, uint64_t rank, uint64_t n) {
    uint64_t shared = shared_hash(op, seed, index);
    uint64_t own = own_hash(op, seed, index, rank);
    if (n < 1) n = 1;
    uint32_t p = T::MANT + 1;
    double sign = (own & 1) == 1 ? -1.0 : 1.0;
    if (op == OP_SUM || op == OP_AVG || op == OP_MULSUM) {
      uint64_t k = n < (1ull << (p - 3)) ? n : (1ull << (p - 3));
      uint64_t start = (index % n + mix(seed) % n) % n;
      if ((rank + n - start) % n >= k) return T::from_f64(0.0);
      uint32_t b = p - 1 - log2_ceil(k);
      if (op == OP_MULSUM) b -= 1;
      int32_t hi = T::EMAX - (int32_t)(p - 1);
      int32_t lo = T::EMIN + (op == OP_AVG ? (int32_t)log2_ceil(n) : 0);
      int32_t top = (int32_t)(p - 1);
      int32_t clo, chi;
      clamp_range(lo, hi, -16 - top, 16 - top, &clo, &chi);
      int32_t e = pick(shared, clo, chi);
      uint64_t m = 1 + (own >> 1) % ((1ull << b) - 1);
      return T::from_f64(sign * (double)m * pow2(e));
    }
    if (op == OP_PROD) {
      int64_t bud = (T::EMAX - 1 - T::EMIN) / 4;
      uint64_t budget = (uint64_t)(bud < 60 ? bud : 60);
      uint64_t c = budget < n - 1 ? budget : n - 1;
      uint64_t special = shared % n;
      uint64_t pos = (rank + n - special) % n;
      if (pos == 0) {
        int32_t clo, chi;
        clamp_range(T::EMIN + (int32_t)c, T::EMAX - 1 - (int32_t)c, -8, 8, &clo, &chi);
        int32_t es = pick(shared >> 16, clo, chi);
        uint64_t mant = (own >> 1) & ((1ull << T::MANT) - 1);
        uint64_t m = (1ull << T::MANT) | mant;
        return T::from_f64(sign * (double)m * pow2(es - T::MANT));
      } else if (pos <= c) {
        int32_t e = (int32_t)((own >> 1) % 3) - 1;
        return T::from_f64(sign * pow2(e));
      }
      return T::from_f64(sign);
    }
    uint64_t emax = (1ull << T::EXP_BITS) - 1;
    uint64_t e = emax / 4 + (own >> 2) % (emax / 2);
    uint64_t mant = (own >> 16) & ((1ull << T::MANT) - 1);
    return T::from_raw(((own & 1) << (T::MANT + T::EXP_BITS)) | (e << T::MANT) | mant);
  }
};

template <class T> BUSBW_FN typename T::Store input_of(int op, uint64_t seed, uint64_t index, uint64_t rank, uint64_t n) {
  return Input<T, T::IS_FLOAT>::at(op, seed, index, rank, n);
}
template <class T> BUSBW_FN typename T::Store premul(typename T::Store x, uint64_t rank) {
  return T::mul(x, T::from_f64(rank % 2 == 0 ? 1.0 : 2.0));
}
template <class T> BUSBW_FN typename T::Store combine(int op, typename T::Store a, typename T::Store b) {
  switch (op) {
    case OP_PROD: return T::mul(a, b);
    case OP_MIN: return T::lt(b, a) ? b : a;
    case OP_MAX: return T::lt(a, b) ? b : a;
    default: return T::add(a, b);
  }
}

// ---- kernel bodies, instantiated per (type, op) by BUSBW_INSTANCE ----
template <class T, int OP>
BUSBW_FN void fill_input(typename T::Store *out, uint64_t count, uint64_t seed, uint64_t first, uint64_t rank, uint64_t n) {
  for (uint64_t i = BUSBW_TID; i < count; i += BUSBW_STRIDE) out[i] = input_of<T>(OP, seed, first + i, rank, n);
}
template <class T, int OP>
BUSBW_FN void fill_expected(typename T::Store *out, uint64_t count, uint64_t seed, uint64_t first, uint64_t n) {
  for (uint64_t i = BUSBW_TID; i < count; i += BUSBW_STRIDE) {
    uint64_t idx = first + i;
    typename T::Store acc = input_of<T>(OP, seed, idx, 0, n);
    if (OP == OP_MULSUM) acc = premul<T>(acc, 0);
    for (uint64_t r = 1; r < n; r++) {
      typename T::Store x = input_of<T>(OP, seed, idx, r, n);
      if (OP == OP_MULSUM) x = premul<T>(x, r);
      acc = combine<T>(OP, acc, x);
    }
    if (OP == OP_AVG) acc = T::div_n(acc, n);
    out[i] = acc;
  }
}
template <class T, int OP>
BUSBW_FN void count_wrong(const typename T::Store *got, const typename T::Store *want, uint64_t count, uint64_t *wrong) {
  uint64_t tol = (OP == OP_AVG && T::IS_FLOAT) ? 2 : 0, local = 0;
  for (uint64_t i = BUSBW_TID; i < count; i += BUSBW_STRIDE) {
    uint64_t g = T::bits(got[i]), w = T::bits(want[i]);
    if ((g > w ? g - w : w - g) > tol) local++;
  }
  if (local) BUSBW_ATOMIC_ADD(wrong, local);
}
// dst = a op b (dst may be a: in place). Avg and mulsum add; see finish/premultiply.
template <class T, int OP>
BUSBW_FN void reduce(typename T::Store *dst, const typename T::Store *a, const typename T::Store *b, uint64_t count) {
  for (uint64_t i = BUSBW_TID; i < count; i += BUSBW_STRIDE) dst[i] = combine<T>(OP, a[i], b[i]);
}
template <class T>
BUSBW_FN void finish_avg(typename T::Store *dst, uint64_t count, uint64_t n) {
  for (uint64_t i = BUSBW_TID; i < count; i += BUSBW_STRIDE) dst[i] = T::div_n(dst[i], n);
}
template <class T>
BUSBW_FN void premultiply(typename T::Store *dst, const typename T::Store *src, uint64_t count, uint64_t rank) {
  for (uint64_t i = BUSBW_TID; i < count; i += BUSBW_STRIDE) dst[i] = premul<T>(src[i], rank);
}

#define BUSBW_OP_INSTANCE(TY, OPNAME, OPV)                                                              \
  BUSBW_KERNEL void busbw_fill_input_##TY##_##OPNAME(T_##TY::Store *o, uint64_t c, uint64_t s, uint64_t f, \
                                                     uint64_t r, uint64_t n) {                          \
    fill_input<T_##TY, OPV>(o, c, s, f, r, n);                                                          \
  }                                                                                                     \
  BUSBW_KERNEL void busbw_fill_expected_##TY##_##OPNAME(T_##TY::Store *o, uint64_t c, uint64_t s,       \
                                                        uint64_t f, uint64_t n) {                       \
    fill_expected<T_##TY, OPV>(o, c, s, f, n);                                                          \
  }                                                                                                     \
  BUSBW_KERNEL void busbw_count_wrong_##TY##_##OPNAME(const T_##TY::Store *g, const T_##TY::Store *w,   \
                                                      uint64_t c, uint64_t *wrong) {                    \
    count_wrong<T_##TY, OPV>(g, w, c, wrong);                                                           \
  }                                                                                                     \
  BUSBW_KERNEL void busbw_reduce_##TY##_##OPNAME(T_##TY::Store *d, const T_##TY::Store *a,              \
                                                 const T_##TY::Store *b, uint64_t c) {                  \
    reduce<T_##TY, OPV>(d, a, b, c);                                                                    \
  }
#define BUSBW_TYPE_INSTANCE(TY)                                                                         \
  BUSBW_KERNEL void busbw_finish_avg_##TY(T_##TY::Store *d, uint64_t c, uint64_t n) {                   \
    finish_avg<T_##TY>(d, c, n);                                                                        \
  }                                                                                                     \
  BUSBW_KERNEL void busbw_premultiply_##TY(T_##TY::Store *d, const T_##TY::Store *s, uint64_t c,        \
                                           uint64_t r) {                                                \
    premultiply<T_##TY>(d, s, c, r);                                                                    \
  }
