// Exhaustive host check of e4m3_fit_exp's fast path (kernels/wgmma_layout.cuh, NOTES v3
// item 19): for every finite f32 amax ≥ 2^−100, the exponent from amax's bits equals what the
// general code (the division, frexpf, ldexpf correction and loop, kept for the other inputs)
// returns. Both are copied here in C (IEEE division and exact frexpf/ldexpf, as on the
// device): keep them in step with the header.
//
//     cc -O2 -o /tmp/check_e4m3_fit_exp scripts/check_e4m3_fit_exp.c -lm && /tmp/check_e4m3_fit_exp
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int general(float amax) {
  int e;
  const float m = frexpf(amax / 448.0f, &e);
  if (m == 0.5f) e -= 1;
  if (ldexpf(448.0f, e) < amax) e += 1;
  while (e > -126 && ldexpf(448.0f, e - 1) >= amax) e -= 1;
  return e;
}

static int fast(uint32_t b) { return (int)(b >> 23) - 135 + ((b & 0x7FFFFFu) > 0x600000u ? 1 : 0); }

int main(void) {
  uint64_t n = 0, bad = 0;
  for (uint32_t b = 0x0D800000u; b < 0x7F800000u; b++, n++) {
    float a;
    memcpy(&a, &b, 4);
    const int g = general(a), f = fast(b);
    if (g != f && bad++ < 10) printf("bits %08x: general %d, fast %d\n", b, g, f);
  }
  printf("%llu values, %llu mismatches\n", (unsigned long long)n, (unsigned long long)bad);
  return bad != 0;
}
