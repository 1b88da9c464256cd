/* SPDX-License-Identifier: MIT */
/*
 * The RoCEv2 ICRC computed by hand for tests, from IBA Annex A17.8 and
 * zlib's CRC-32, never through icrc.c: the masked pseudo-header of IPv4
 * or IPv6, UDP and the packet, with BTH resv8a masked.  Also the flows
 * (struct sv_flow, transport/udp/tap.h) the packets travel on.
 */
#ifndef SV_TEST_ICRC_HAND_H
#define SV_TEST_ICRC_HAND_H

#include <arpa/inet.h>
#include <zlib.h>

#include "helpers.h"
#include "transport/udp/tap.h"

static inline void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

static inline struct sv_flow flow_v4(const char *src, const char *dst, uint16_t sport,
				     uint16_t dport)
{
	struct sv_flow f = { .sport = sport, .dport = dport, .ttl = 64, .v4 = true };

	f.src.s6_addr[10] = f.src.s6_addr[11] = 0xff;
	f.dst.s6_addr[10] = f.dst.s6_addr[11] = 0xff;
	assert_int_equal(inet_pton(AF_INET, src, &f.src.s6_addr[12]), 1);
	assert_int_equal(inet_pton(AF_INET, dst, &f.dst.s6_addr[12]), 1);
	return f;
}

static inline struct sv_flow flow_v6(const char *src, const char *dst, uint16_t sport,
				     uint16_t dport)
{
	struct sv_flow f = { .sport = sport, .dport = dport, .ttl = 64 };

	assert_int_equal(inet_pton(AF_INET6, src, &f.src), 1);
	assert_int_equal(inet_pton(AF_INET6, dst, &f.dst), 1);
	return f;
}

/* The IPv6 masked buffer of A17.8, by hand. */
static inline uint32_t hand_icrc_v6(const struct sv_flow *f, const uint8_t *pkt, size_t len)
{
	uint8_t m[256];
	size_t o = 0;

	memset(m, 0xff, 8), o = 8;
	m[o++] = 0x6f, m[o++] = 0xff, m[o++] = 0xff, m[o++] = 0xff;
	put16(m + o, (uint16_t)(8 + len + 4)), o += 2;
	m[o++] = 17, m[o++] = 0xff;
	memcpy(m + o, &f->src, 16), o += 16;
	memcpy(m + o, &f->dst, 16), o += 16;
	put16(m + o, f->sport), put16(m + o + 2, f->dport);
	put16(m + o + 4, (uint16_t)(8 + len + 4)), put16(m + o + 6, 0xffff), o += 8;
	memcpy(m + o, pkt, len);
	m[o + 4] = 0xff;
	return (uint32_t)crc32(0, m, (uInt)(o + len));
}

/* IPv4 by hand, with or without DF, with IPv4 identification id. */
static inline uint32_t hand_icrc_v4_id(const struct sv_flow *f, const uint8_t *pkt, size_t len,
					bool df, uint16_t id)
{
	uint8_t m[4200];
	size_t o = 8;

	assert_true(len <= sizeof(m) - 36);

	memset(m, 0xff, 8);
	m[o++] = 0x45, m[o++] = 0xff;
	put16(m + o, (uint16_t)(20 + 8 + len + 4)), o += 2;
	put16(m + o, id), o += 2;
	put16(m + o, df ? 0x4000 : 0), o += 2;
	m[o++] = 0xff, m[o++] = 17, m[o++] = 0xff, m[o++] = 0xff;
	memcpy(m + o, &f->src.s6_addr[12], 4), o += 4;
	memcpy(m + o, &f->dst.s6_addr[12], 4), o += 4;
	put16(m + o, f->sport), put16(m + o + 2, f->dport);
	put16(m + o + 4, (uint16_t)(8 + len + 4)), put16(m + o + 6, 0xffff), o += 8;
	memcpy(m + o, pkt, len);
	m[o + 4] = 0xff;
	return (uint32_t)crc32(0, m, (uInt)(o + len));
}

/* IPv4 by hand, with or without DF, identification 0. */
static inline uint32_t hand_icrc_v4(const struct sv_flow *f, const uint8_t *pkt, size_t len,
				     bool df)
{
	return hand_icrc_v4_id(f, pkt, len, df, 0);
}

#endif
