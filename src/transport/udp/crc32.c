/* SPDX-License-Identifier: MIT */
/*
 * The gzip CRC-32 that the ICRC is (icrc.c): ISA-L's, except for long
 * buffers on a processor with 256-bit carry-less multiplies (VPCLMULQDQ
 * with AVX2) and no AVX-512.
 *
 * The ICRC runs over every byte a RoCEv2 packet carries, on both sides:
 * ib_write_bw at 1 MiB spent 27% of its sending core and 20% of its
 * receiving core in it.  ISA-L 2.30 (Debian 12) folds 16 bytes per
 * multiply on such a processor (crc32_gzip_refl_by8); its 64-byte variant
 * needs AVX-512, and libdeflate 1.14 is no faster than by8.  On an AMD
 * Zen 3, 4 KiB buffers: ISA-L 11.2-12.6 GB/s, the fold below 22-24 GB/s.
 * ISA-L keeps the short buffers (from 256 bytes down it is as fast) and
 * every buffer's last 16 to 79 bytes, where the fold would only add steps.
 *
 * The fold.  A 16-byte block X of the message, loaded little-endian, holds
 * 128 coefficients, the first byte's lowest bit the highest power (the
 * CRC is bit-reflected).  Replacing X by X * x^D mod P, D bits further on,
 * leaves the message's remainder mod P unchanged.  With H the register's
 * low 64 bits (X's high powers) and L its high 64 bits,
 * X * x^D = H * x^(D+64) + L * x^D.  A carry-less multiply of two
 * reflected 64-bit values gives their product times x (reflected over 128
 * bits), so H is multiplied by x^(D+63) mod P and L by x^(D-1) mod P; the
 * sum of the two products has degree below 96, a 16-byte block congruent
 * to X * x^D, which is XORed into the block D bits on.  Two 256-bit
 * accumulators carry four blocks, each folded 64 bytes on per step; the
 * four are then folded into one, 16 bytes at a time.
 *
 * The running CRC enters as ISA-L takes it: a preset register is the same
 * as its complement XORed into the first four bytes.  The folded block
 * followed by the unfolded tail is then a message with the same remainder,
 * which ISA-L finishes from a zero register: a running CRC of 0xffffffff.
 */
#define _GNU_SOURCE
#include <string.h>
#include <isa-l/crc.h>

#include "tap.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define WIDE_MIN	256	/* shorter: ISA-L, as fast (measured) */
#define STEP		64	/* bytes per fold step: two 256-bit accumulators */
#define POLY		0x04c11db7u	/* P without its x^32 term */

/* x^n mod P, bit k the coefficient of x^k. */
static uint32_t xpow_mod(unsigned n)
{
	uint32_t r = 1;

	while (n--)
		r = (r << 1) ^ (r & 0x80000000u ? POLY : 0);
	return r;
}

/* A remainder as a reflected 64-bit multiplier: x^k at bit 63 - k. */
static uint64_t reflect64(uint32_t p)
{
	uint64_t v = 0;

	for (int k = 0; k < 32; k++)
		if (p >> k & 1)
			v |= 1ull << (63 - k);
	return v;
}

/* The multipliers for H and L (above): by 16 bytes, and by STEP bytes in
 * both 128-bit lanes.  Written once, before main(), and only read. */
static uint64_t by16[2], by_step[4];
static bool wide;

__attribute__((constructor)) static void crc32_setup(void)
{
	by16[0] = reflect64(xpow_mod(128 + 63));
	by16[1] = reflect64(xpow_mod(128 - 1));
	by_step[0] = by_step[2] = reflect64(xpow_mod(STEP * 8 + 63));
	by_step[1] = by_step[3] = reflect64(xpow_mod(STEP * 8 - 1));
	/* ISA-L's own 64-byte fold takes AVX-512 with VPCLMULQDQ. */
	__builtin_cpu_init();
	wide = __builtin_cpu_supports("vpclmulqdq") && __builtin_cpu_supports("avx2") &&
	       !__builtin_cpu_supports("avx512f");
}

#define WIDE __attribute__((target("avx2,vpclmulqdq,pclmul")))

WIDE static inline __m256i fold256(__m256i x, __m256i k, __m256i next)
{
	__m256i h = _mm256_clmulepi64_epi128(x, k, 0x00);
	__m256i l = _mm256_clmulepi64_epi128(x, k, 0x11);

	return _mm256_xor_si256(_mm256_xor_si256(h, l), next);
}

WIDE static inline __m128i fold128(__m128i x, __m128i k, __m128i next)
{
	__m128i h = _mm_clmulepi64_si128(x, k, 0x00);
	__m128i l = _mm_clmulepi64_si128(x, k, 0x11);

	return _mm_xor_si128(_mm_xor_si128(h, l), next);
}

WIDE static uint32_t crc32_wide(uint32_t crc, const uint8_t *p, size_t len)
{
	const __m256i kstep = _mm256_loadu_si256((const __m256i *)by_step);
	const __m128i k16 = _mm_loadu_si128((const __m128i *)by16);
	size_t steps = len / STEP;
	__m256i a = _mm256_loadu_si256((const __m256i *)p);
	__m256i b = _mm256_loadu_si256((const __m256i *)(p + 32));

	a = _mm256_xor_si256(a, _mm256_set_epi32(0, 0, 0, 0, 0, 0, 0, (int)~crc));
	for (size_t i = 1; i < steps; i++) {
		const uint8_t *q = p + i * STEP;
		a = fold256(a, kstep, _mm256_loadu_si256((const __m256i *)q));
		b = fold256(b, kstep, _mm256_loadu_si256((const __m256i *)(q + 32)));
	}
	__m128i x = _mm256_castsi256_si128(a);
	x = fold128(x, k16, _mm256_extracti128_si256(a, 1));
	x = fold128(x, k16, _mm256_castsi256_si128(b));
	x = fold128(x, k16, _mm256_extracti128_si256(b, 1));

	/* The folded block and the tail, in one ISA-L call rather than two;
	 * the upper halves cleared before that SSE code, whatever the
	 * compiler's optimisation (ISA-L's by8 is SSE; icrc.c). */
	uint8_t rest[16 + STEP];
	size_t tail = len - steps * STEP;
	_mm_storeu_si128((__m128i *)rest, x);
	_mm256_zeroupper();
	memcpy(rest + 16, p + steps * STEP, tail);
	return crc32_gzip_refl(0xffffffffu, rest, 16 + tail);
}

uint32_t sv_crc32(uint32_t crc, const void *buf, size_t len)
{
	if (wide && len >= WIDE_MIN)
		return crc32_wide(crc, buf, len);
	return crc32_gzip_refl(crc, buf, len);
}

bool sv_crc32_wide(void)
{
	return wide;
}
#else
uint32_t sv_crc32(uint32_t crc, const void *buf, size_t len)
{
	return crc32_gzip_refl(crc, buf, len);
}

bool sv_crc32_wide(void)
{
	return false;
}
#endif
