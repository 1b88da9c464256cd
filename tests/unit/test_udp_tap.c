/* SPDX-License-Identifier: MIT */
/*
 * What sits between the UDP transport and its socket (transport/udp/tap.h):
 *  - SOFTVERBS_FAULT's syntax, good and bad, from a table;
 *  - the ICRC against a RoCEv2 CNP captured from a ConnectX-4 Lx, and
 *    against masked pseudo-headers written here by hand from IBA A17.8
 *    (never through icrc.c's helpers); every single-byte error caught;
 *    and the vector registers' upper halves left clean behind it;
 *  - the wire over real UDP sockets on 127.0.0.1, a child process per
 *    fault setting (the settings are read once per process): dup sends
 *    twice, reorder swaps neighbours, delay holds, corrupt breaks the
 *    ICRC and never the caller's buffer, forget drops what is held, and
 *    a seed gives the same pattern twice;
 *  - SOFTVERBS_PCAP files: headers, record lengths, checksums, threads;
 *    and, where installed, tests/integration/icrc_check.py and tshark
 *    read them (SV_ICRC_CHECK names the script).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "helpers.h"
#include "transport/udp/tap.h"
#include "icrc_hand.h"

extern char **environ;

static char tmpdir[64];

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void put_le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ------------------------------------------------------------------ */
/* SOFTVERBS_FAULT syntax                                              */

static const struct {
	const char *s;
	struct sv_fault_cfg want;
} good[] = {
	{ "", { .on = false } },
	{ "  ", { .on = false } },
	{ "drop=0.25", { .drop = 0.25, .on = true } },
	{ "drop=5%", { .drop = 0.05, .on = true } },
	{ "drop=0", { .on = false } },
	{ "drop=.5", { .drop = 0.5, .on = true } },
	{ "corrupt=1e-3", { .corrupt = 0.001, .on = true } },
	{ "drop=100%", { .drop = 1, .on = true } },
	{ "dup=1,reorder=0.5,corrupt=100%,delay=250,seed=42",
	  { .dup = 1, .reorder = 0.5, .corrupt = 1, .delay_us = 250, .seed = 42, .on = true } },
	{ " drop = 0.5 , dup=50% ", { .drop = 0.5, .dup = 0.5, .on = true } },
	{ "seed=0x10", { .seed = 16 } },
	{ "seed=18446744073709551615", { .seed = UINT64_MAX } },
	{ "delay=0", { .on = false } },
	{ "delay=4294967295", { .delay_us = UINT32_MAX, .on = true } },
};

static void test_fault_parse_good(void **state)
{
	for (size_t i = 0; i < SV_ARRAY_LEN(good); i++) {
		struct sv_fault_cfg c;
		char err[160] = "x";

		print_message("\"%s\"\n", good[i].s);
		assert_int_equal(sv_fault_parse(good[i].s, &c, err, sizeof(err)), 0);
		assert_string_equal(err, "");
		assert_true(c.drop == good[i].want.drop);
		assert_true(c.dup == good[i].want.dup);
		assert_true(c.reorder == good[i].want.reorder);
		assert_true(c.corrupt == good[i].want.corrupt);
		assert_int_equal(c.delay_us, good[i].want.delay_us);
		assert_true(c.seed == good[i].want.seed);
		assert_int_equal(c.on, good[i].want.on);
	}
}

/* Each error must quote the token at fault. */
static const struct {
	const char *s, *names;
} bad[] = {
	{ "drop", "\"drop\"" },
	{ "drop=", "\"drop=\"" },
	{ "drop=1.5", "drop=1.5" },
	{ "drop=-0.1", "drop=-0.1" },
	{ "drop=abc", "drop=abc" },
	{ "drop=101%", "drop=101%" },
	{ "drop=5%%", "drop=5%%" },
	{ "drop=nan", "drop=nan" },
	{ "drop=inf", "drop=inf" },
	{ "drop=0x1p-2", "drop=0x1p-2" },
	{ "Drop=0.1", "Drop=0.1" },
	{ "loss=0.1", "loss=0.1" },
	{ "dup=0.1,loss=0.1", "loss=0.1" },
	{ "delay=-1", "delay=-1" },
	{ "delay=1.5", "delay=1.5" },
	{ "delay=4294967296", "delay=4294967296" },
	{ "delay=10ms", "delay=10ms" },
	{ "seed=x", "seed=x" },
	{ "seed=-1", "seed=-1" },
	{ "seed=18446744073709551616", "seed=18446744073709551616" },
	{ "drop=0.1,,dup=0.1", "empty" },
	{ "drop=0.1,drop=0.2", "drop=0.2" },
	{ "drop=0.1,", "comma" },
	{ "=0.1", "\"=0.1\"" },
	{ ",drop=0.1", "empty" },
	{ "drop=0.1, ,dup=0.1", "empty" },
	{ "seed=1 2", "seed=1 2" },
	{ "drop=0.00000000000000000000000000000000000000000000000000000000000001", "too long" },
};

static void test_fault_parse_bad(void **state)
{
	for (size_t i = 0; i < SV_ARRAY_LEN(bad); i++) {
		struct sv_fault_cfg c;
		char err[160] = "";

		assert_int_equal(sv_fault_parse(bad[i].s, &c, err, sizeof(err)), EINVAL);
		print_message("\"%s\": %s\n", bad[i].s, err);
		assert_non_null(strstr(err, bad[i].names));
		/* A bad setting injects nothing. */
		assert_false(c.on);
		assert_true(c.drop == 0 && c.dup == 0 && c.delay_us == 0);
	}
	/* No room for the reason is no reason to crash. */
	struct sv_fault_cfg c;
	assert_int_equal(sv_fault_parse("drop=2", &c, NULL, 0), EINVAL);
}

static void test_fault_config_off(void **state)
{
	/* main() cleared SOFTVERBS_FAULT: this process injects nothing. */
	assert_false(sv_fault_config()->on);
	assert_ptr_equal(sv_fault_config(), sv_fault_config());
}

/* ------------------------------------------------------------------ */
/* ICRC                                                                */

/*
 * A RoCEv2 CNP (opcode 0x81) as a Mellanox ConnectX-4 Lx sent it, from
 * scapy's test/contrib/roce.uts ("RoCE CNP captured on ConnectX-4 Lx"):
 * 10.0.17.1 -> 10.0.18.1, TOS 0xc2, id 0x718c, DF, TTL 64, UDP 0 -> 4791
 * with no checksum, BTH with BECN set in resv8a, 16 bytes of CNP padding,
 * and the NIC's ICRC 82 fd 00 2a.
 */
static const uint8_t cx4_cnp[] = {
	0xe4, 0x1d, 0x2d, 0xab, 0x2b, 0xc2, 0x7c, 0xfe, 0x90, 0x64, 0x3b, 0x32, 0x08, 0x00,
	0x45, 0xc2, 0x00, 0x3c, 0x71, 0x8c, 0x40, 0x00, 0x40, 0x11, 0x91, 0x61,
	0x0a, 0x00, 0x11, 0x01, 0x0a, 0x00, 0x12, 0x01,
	0x00, 0x00, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00,
	0x81, 0x00, 0xff, 0xff, 0x40, 0x00, 0x01, 0x18, 0x00, 0x00, 0x00, 0x00,
	0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
	0x00, 0x00, 0x00, 0x00,
	0x82, 0xfd, 0x00, 0x2a,
};
#define CX4_IP	14
#define CX4_UDP	34
#define CX4_BTH	42
#define CX4_LEN	(sizeof(cx4_cnp) - CX4_BTH - 4)	/* BTH and padding: 28 */

/* The masked buffer of A17.8, by hand from the captured headers. */
static size_t cx4_masked(uint8_t *m)
{
	memset(m, 0xff, 8);				/* LRH */
	memcpy(m + 8, cx4_cnp + CX4_IP, 20);
	m[8 + 1] = 0xff;				/* TOS */
	m[8 + 8] = 0xff;				/* TTL */
	m[8 + 10] = m[8 + 11] = 0xff;			/* header checksum */
	memcpy(m + 28, cx4_cnp + CX4_UDP, 8);
	m[28 + 6] = m[28 + 7] = 0xff;			/* UDP checksum */
	memcpy(m + 36, cx4_cnp + CX4_BTH, CX4_LEN);
	m[36 + 4] = 0xff;				/* BTH resv8a */
	return 36 + CX4_LEN;
}

static void test_icrc_hardware_vector(void **state)
{
	uint8_t m[128], d[128] = { 0 }, z[128] = { 0 }, pkt[64];
	size_t mlen = cx4_masked(m);
	uint32_t hw = get_le32(cx4_cnp + sizeof(cx4_cnp) - 4);

	/* 1. The recipe: zlib's crc32 of the masked buffer is the NIC's
	 * ICRC, stored little-endian. */
	assert_int_equal((uint32_t)crc32(0, m, (uInt)mlen), hw);
	assert_int_equal(hw, 0x2a00fd82);

	/* 2. sv_icrc reconstructs IPv4 with identification 0, which this NIC
	 * did not send.  The CRC is affine, so for equal lengths
	 * crc(a) ^ crc(b) = crc(a ^ b) ^ crc(0): the ICRC with id 0 follows
	 * from the NIC's value and the two id bytes alone. */
	d[12] = 0x71, d[13] = 0x8c;			/* 8 (LRH) + 4 (id) */
	uint32_t want = hw ^ (uint32_t)crc32(0, d, (uInt)mlen) ^ (uint32_t)crc32(0, z, (uInt)mlen);
	struct sv_flow f = flow_v4("10.0.17.1", "10.0.18.1", 0, 4791);
	f.tclass = 0xc2;
	struct iovec iov = { .iov_base = (void *)(cx4_cnp + CX4_BTH), .iov_len = CX4_LEN };
	assert_int_equal(sv_icrc(&f, &iov, 1, CX4_LEN), want);

	/* 3. That packet, carrying it, checks; with the NIC's own id it
	 * does not (the id is covered). */
	memcpy(pkt, cx4_cnp + CX4_BTH, CX4_LEN);
	put_le32(pkt + CX4_LEN, want);
	assert_true(sv_icrc_ok(&f, pkt, CX4_LEN + 4));
	assert_false(sv_icrc_ok(&f, cx4_cnp + CX4_BTH, CX4_LEN + 4));
	/* TOS, TTL and BECN are masked: other values change nothing. */
	f.tclass = 0, f.ttl = 1;
	pkt[4] = 0x80;					/* FECN instead of BECN */
	assert_true(sv_icrc_ok(&f, pkt, CX4_LEN + 4));

	/* 4. A receiver that solves for the identification
	 * (SOFTVERBS_IPV4_ID=any) takes the NIC's frame as it came and finds
	 * the NIC's 0x718c; the default refuses it (step 3). */
	assert_int_equal(sv_icrc_check_any(&f, cx4_cnp + CX4_BTH, CX4_LEN + 4, 0), 0x718c);
	assert_int_equal(sv_icrc_check_any(&f, pkt, CX4_LEN + 4, 0), 0);
	memcpy(pkt, cx4_cnp + CX4_BTH, CX4_LEN + 4);
	pkt[CX4_LEN - 1] ^= 0x04;
	assert_int_equal(sv_icrc_check_any(&f, pkt, CX4_LEN + 4, 0), -1);
}

/* An RC RDMA WRITE ONLY: BTH, RETH, 13 bytes, 3 of pad (IBA 9.3.1). */
static size_t write_only(uint8_t *p)
{
	static const uint8_t hdr[28] = {
		0x0a, 0x30 | 0x00, 0xff, 0xff, 0x00, 0x00, 0x12, 0x34,	/* padcnt 3, QP 0x1234 */
		0x80, 0x00, 0x00, 0x2a,					/* AckReq, PSN 42 */
		0x00, 0x00, 0x7f, 0x12, 0x34, 0x56, 0x78, 0x00,		/* VA */
		0xde, 0xad, 0xbe, 0xef, 0x00, 0x00, 0x00, 0x0d,		/* rkey, DMA length */
	};

	memcpy(p, hdr, sizeof(hdr));
	memcpy(p + 28, "softverbs tap", 13);
	memset(p + 41, 0, 3);
	return 44;
}

/* Every single-byte change is caught, except in BTH resv8a (masked). */
static void check_flips(const struct sv_flow *f, uint8_t *pkt, size_t n)
{
	assert_true(sv_icrc_ok(f, pkt, n));
	for (size_t i = 0; i < n; i++) {
		for (unsigned x = 1; x < 256; x += 37) {
			pkt[i] ^= (uint8_t)x;
			if (i == 4)
				assert_true(sv_icrc_ok(f, pkt, n));
			else if (sv_icrc_ok(f, pkt, n))
				fail_msg("byte %zu ^ 0x%02x not caught", i, x);
			pkt[i] ^= (uint8_t)x;
		}
	}
	assert_true(sv_icrc_ok(f, pkt, n));
	assert_false(sv_icrc_ok(f, pkt, n - 1));
	assert_false(sv_icrc_ok(f, pkt, 15));
}

static void test_icrc_ipv6(void **state)
{
	struct sv_flow f = flow_v6("fd00::1", "fd00:0:0:1::2", 49152, 4791);
	uint8_t pkt[64];
	size_t len = write_only(pkt);
	struct iovec iov = { .iov_base = pkt, .iov_len = len };

	f.tclass = 0x68;
	assert_int_equal(sv_icrc(&f, &iov, 1, len), hand_icrc_v6(&f, pkt, len));
	put_le32(pkt + len, sv_icrc(&f, &iov, 1, len));
	check_flips(&f, pkt, len + 4);
	/* Another peer is another ICRC. */
	f.sport++;
	assert_false(sv_icrc_ok(&f, pkt, len + 4));
}

static void test_icrc_ipv4_df(void **state)
{
	struct sv_flow f = flow_v4("192.168.7.1", "192.168.7.2", 50000, 4791);
	uint8_t pkt[64];
	size_t len = write_only(pkt);
	struct iovec iov = { .iov_base = pkt, .iov_len = len };
	uint32_t df = hand_icrc_v4(&f, pkt, len, true), nodf = hand_icrc_v4(&f, pkt, len, false);

	assert_int_equal(sv_icrc(&f, &iov, 1, len), df);
	assert_int_not_equal(df, nodf);
	put_le32(pkt + len, df);
	check_flips(&f, pkt, len + 4);
	/* A sender without DF is accepted too. */
	put_le32(pkt + len, nodf);
	check_flips(&f, pkt, len + 4);
}

/*
 * A known IPv6 vector, computed outside this code base: Python's zlib
 * through tests/integration/icrc_check.py's own masking of a whole frame
 * (IPv6 2001:2::1 -> 2001:2::2, traffic class 0xb8, flow label 0xabcde,
 * hop limit 7; UDP 49374 -> 4791, checksum 0x1234; write_only()'s
 * packet):
 *   h, p = masked_headers(0x86dd, frame, 4791); icrc(h, p) == 0x5a3d94d1
 * The masked fields may be anything: the value stays.
 */
static void test_icrc_ipv6_vector(void **state)
{
	struct sv_flow f = flow_v6("2001:2::1", "2001:2::2", 0xc0de, 4791);
	uint8_t pkt[64];
	size_t len = write_only(pkt);
	struct iovec iov = { .iov_base = pkt, .iov_len = len };

	f.tclass = 0xb8, f.flow = 0xabcde, f.ttl = 7;
	assert_int_equal(sv_icrc(&f, &iov, 1, len), 0x5a3d94d1);
	f.tclass = 0, f.flow = 0, f.ttl = 255;
	assert_int_equal(sv_icrc(&f, &iov, 1, len), 0x5a3d94d1);
	put_le32(pkt + len, 0x5a3d94d1);
	assert_true(sv_icrc_ok(&f, pkt, len + 4));
	/* The addresses are covered: one bit of the destination's last
	 * byte, or the same packet between IPv4 hosts, is another ICRC. */
	f.dst.s6_addr[15] ^= 1;
	assert_false(sv_icrc_ok(&f, pkt, len + 4));
	struct sv_flow f4 = flow_v4("198.18.0.1", "198.18.0.2", 0xc0de, 4791);
	assert_false(sv_icrc_ok(&f4, pkt, len + 4));
}

/* The control messages a packet leaves with (fault.c sv_flow_cmsg). */
struct cmsg_want {
	int level, type;
	size_t len;
	const void *data;
};

static void check_cmsgs(void *buf, size_t used, const struct cmsg_want *w, size_t n)
{
	struct msghdr m = { .msg_control = buf, .msg_controllen = used };
	struct cmsghdr *c = CMSG_FIRSTHDR(&m);
	size_t total = 0;

	for (size_t i = 0; i < n; i++, c = CMSG_NXTHDR(&m, c)) {
		assert_non_null(c);
		assert_int_equal(c->cmsg_level, w[i].level);
		assert_int_equal(c->cmsg_type, w[i].type);
		assert_int_equal(c->cmsg_len, CMSG_LEN(w[i].len));
		assert_memory_equal(CMSG_DATA(c), w[i].data, w[i].len);
		total += CMSG_SPACE(w[i].len);
	}
	assert_int_equal(used, total);
}

static void test_flow_cmsg(void **state)
{
	union {
		struct cmsghdr align;
		char b[SV_FLOW_CMSG_SPACE];
	} u;
	int tc = 0x28, hops = 9, tos = 0x48, ttl = 5, zero = 0;

	/* IPv6 on the dual-stack socket: source, traffic class, hop limit. */
	struct sv_flow f6 = flow_v6("2001:2::1", "fe80::2", 1, 4791);
	f6.tclass = (uint8_t)tc, f6.ttl = (uint8_t)hops, f6.ifindex = 3;
	struct in6_pktinfo pi6 = { .ipi6_addr = f6.src, .ipi6_ifindex = 3 };
	struct cmsg_want w6[] = {
		{ IPPROTO_IPV6, IPV6_PKTINFO, sizeof(pi6), &pi6 },
		{ IPPROTO_IPV6, IPV6_TCLASS, sizeof(int), &tc },
		{ IPPROTO_IPV6, IPV6_HOPLIMIT, sizeof(int), &hops },
	};
	check_cmsgs(u.b, sv_flow_cmsg(&f6, AF_INET6, u.b, sizeof(u.b)), w6, 3);

	/* IPv4 on it: the IPv4-mapped source, TOS and TTL. */
	struct sv_flow f4 = flow_v4("198.18.0.1", "198.18.0.2", 1, 4791);
	f4.tclass = (uint8_t)tos, f4.ttl = (uint8_t)ttl;
	struct in6_pktinfo pi4 = { .ipi6_addr = f4.src };
	struct cmsg_want w4[] = {
		{ IPPROTO_IPV6, IPV6_PKTINFO, sizeof(pi4), &pi4 },
		{ IPPROTO_IP, IP_TOS, sizeof(int), &tos },
		{ IPPROTO_IP, IP_TTL, sizeof(int), &ttl },
	};
	check_cmsgs(u.b, sv_flow_cmsg(&f4, AF_INET6, u.b, sizeof(u.b)), w4, 3);

	/* An AF_INET socket: TOS and TTL; ttl 0 leaves the kernel's. */
	check_cmsgs(u.b, sv_flow_cmsg(&f4, AF_INET, u.b, sizeof(u.b)), w4 + 1, 2);
	f4.tclass = 0, f4.ttl = 0;
	struct cmsg_want w0[] = { { IPPROTO_IP, IP_TOS, sizeof(int), &zero } };
	check_cmsgs(u.b, sv_flow_cmsg(&f4, AF_INET, u.b, sizeof(u.b)), w0, 1);
}

/* The same ICRC however the packet is cut into pieces, resv8a included. */
static void test_icrc_iovecs(void **state)
{
	struct sv_flow f = flow_v4("10.1.2.3", "10.1.2.4", 1234, 4791);
	uint8_t pkt[64];
	size_t len = write_only(pkt);
	struct iovec one = { .iov_base = pkt, .iov_len = len };
	uint32_t want = sv_icrc(&f, &one, 1, len);

	for (size_t a = 0; a <= len; a++) {
		for (size_t b = a; b <= len; b++) {
			struct iovec v[3] = {
				{ .iov_base = pkt, .iov_len = a },
				{ .iov_base = pkt + a, .iov_len = b - a },
				{ .iov_base = pkt + b, .iov_len = len - b },
			};
			assert_int_equal(sv_icrc(&f, v, 3, len), want);
		}
	}
	/* len is what counts: bytes past it are not the packet's. */
	struct iovec longer = { .iov_base = pkt, .iov_len = len + 4 };
	assert_int_equal(sv_icrc(&f, &longer, 1, len), want);
}

/*
 * The IPv4 identification (icrc.c): a GSO run's k-th packet leaves with
 * identification k, which the ICRC covers.  Against zlib over the header
 * with that identification: sv_icrc_id() turns the ICRC for 0 into the
 * one for k, sv_icrc() computes it from the flow's ipid, and a receiver
 * finds k from the hint or without one; an identification of 64 or more,
 * or a bit flipped, is refused.
 */
static void test_icrc_identification(void **state)
{
	static const size_t lens[] = { 12, 24, 60, 300, 1100, 4108 };
	static const uint16_t ids[] = { 1, 2, 3, 7, 14, 31, 32, 33, 62, 63 };
	struct sv_flow f = flow_v4("198.18.0.2", "198.18.0.1", 49999, 4791);
	static uint8_t pkt[4108 + 4];

	(void)state;
	for (size_t i = 0; i < sizeof(pkt); i++)
		pkt[i] = (uint8_t)(i * 29 + 3);
	for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
		size_t len = lens[li];
		struct iovec v = { .iov_base = pkt, .iov_len = len };
		uint32_t zero = hand_icrc_v4(&f, pkt, len, true);

		f.ipid = 0;
		assert_int_equal(sv_icrc(&f, &v, 1, len), zero);
		assert_int_equal(sv_icrc_id(len, 0), 0);
		put_le32(pkt + len, zero);
		assert_int_equal(sv_icrc_check(&f, pkt, len + 4, 0), 0);
		for (size_t k = 0; k < sizeof(ids) / sizeof(ids[0]); k++) {
			uint16_t id = ids[k];
			uint32_t want = hand_icrc_v4_id(&f, pkt, len, true, id);
			if ((zero ^ sv_icrc_id(len, id)) != want)
				fail_msg("length %zu, identification %u: 0x%08x, zlib 0x%08x", len, id,
					 zero ^ sv_icrc_id(len, id), want);
			f.ipid = id;
			assert_int_equal(sv_icrc(&f, &v, 1, len), want);
			f.ipid = 0;
			put_le32(pkt + len, want);
			assert_int_equal(sv_icrc_check(&f, pkt, len + 4, id), id);
			assert_int_equal(sv_icrc_check(&f, pkt, len + 4, 0), id);
			assert_int_equal(sv_icrc_check(&f, pkt, len + 4, (unsigned)(id ^ 1)), id);
			pkt[len / 2] ^= 0x10;
			assert_int_equal(sv_icrc_check(&f, pkt, len + 4, id), -1);
			pkt[len / 2] ^= 0x10;
		}
		for (uint16_t id = 64; id; id = (uint16_t)(id * 4)) {
			put_le32(pkt + len, hand_icrc_v4_id(&f, pkt, len, true, id));
			assert_int_equal(sv_icrc_check(&f, pkt, len + 4, 0), -1);
		}
	}
	/* IPv6 has no identification: the ICRC for 0 is the only one. */
	struct sv_flow f6 = flow_v6("fd00::1", "fd00::2", 49999, 4791);
	size_t len = write_only(pkt);
	struct iovec v6 = { .iov_base = pkt, .iov_len = len };
	uint32_t c6 = sv_icrc(&f6, &v6, 1, len);
	put_le32(pkt + len, c6);
	assert_int_equal(sv_icrc_check(&f6, pkt, len + 4, 5), 0);
	put_le32(pkt + len, c6 ^ sv_icrc_id(len, 5));
	assert_int_equal(sv_icrc_check(&f6, pkt, len + 4, 5), -1);
}

/*
 * SOFTVERBS_IPV4_ID=any: every 16-bit identification of a DF header, as
 * rxe and RoCE NICs send them, solved from the ICRC.  Checked against zlib
 * over headers carrying the identification (icrc_hand.h), at six lengths:
 * the default check refuses each; without DF both refuse all but 0; a
 * flipped bit (these five, at these lengths) is refused by both.
 */
static void test_icrc_any_identification(void **state)
{
	static const size_t lens[] = { 12, 24, 60, 300, 1100, 4108 };
	static const uint16_t ids[] = { 64, 100, 255, 256, 0x1234, 0x718c, 0x8000, 0xffff };
	static const size_t flips[] = { 0, 3, 11, 12, 17 };
	struct sv_flow f = flow_v4("198.18.0.2", "198.18.0.1", 49999, 4791);
	static uint8_t pkt[4108 + 4];

	(void)state;
	for (size_t i = 0; i < sizeof(pkt); i++)
		pkt[i] = (uint8_t)(i * 41 + 7);
	for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
		size_t len = lens[li];
		for (size_t k = 0; k < sizeof(ids) / sizeof(ids[0]); k++) {
			uint16_t id = ids[k];
			put_le32(pkt + len, hand_icrc_v4_id(&f, pkt, len, false, id));
			assert_int_equal(sv_icrc_check(&f, pkt, len + 4, 0), -1);
			assert_int_equal(sv_icrc_check_any(&f, pkt, len + 4, 0), -1);
			put_le32(pkt + len, hand_icrc_v4_id(&f, pkt, len, true, id));
			assert_int_equal(sv_icrc_check(&f, pkt, len + 4, 0), -1);
			if (sv_icrc_check_any(&f, pkt, len + 4, 0) != id)
				fail_msg("length %zu, identification 0x%04x: %d", len, id,
					 sv_icrc_check_any(&f, pkt, len + 4, 0));
			for (size_t x = 0; x < sizeof(flips) / sizeof(flips[0]); x++) {
				size_t at = flips[x] * len / 17;	/* the ICRC's first byte too */
				if (at == 4)
					at = 5;	/* BTH resv8a: masked, changes nothing */
				pkt[at] ^= 0x01;
				if (sv_icrc_check_any(&f, pkt, len + 4, 0) != -1 ||
				    sv_icrc_check(&f, pkt, len + 4, 0) != -1)
					fail_msg("length %zu, identification 0x%04x: bit 0 of byte "
						 "%zu flipped, and taken", len, id, at);
				pkt[at] ^= 0x01;
			}
		}
		/* Below 64, the same as the default; with the hint too. */
		put_le32(pkt + len, hand_icrc_v4_id(&f, pkt, len, true, 5));
		assert_int_equal(sv_icrc_check_any(&f, pkt, len + 4, 5), 5);
		assert_int_equal(sv_icrc_check_any(&f, pkt, len + 4, 0), 5);
	}
	/* IPv6 stays exact: no identification to solve for. */
	struct sv_flow f6 = flow_v6("fd00::1", "fd00::2", 49999, 4791);
	size_t len = write_only(pkt);
	struct iovec v6 = { .iov_base = pkt, .iov_len = len };
	uint32_t c6 = sv_icrc(&f6, &v6, 1, len);
	put_le32(pkt + len, c6 ^ sv_icrc_id(len, 0x30));
	assert_int_equal(sv_icrc_check_any(&f6, pkt, len + 4, 0), -1);
	put_le32(pkt + len, c6);
	assert_int_equal(sv_icrc_check_any(&f6, pkt, len + 4, 0), 0);
}

/*
 * Against zlib, for packets shorter and longer than the head icrc.c
 * copies behind the pseudo-header (GATHER, 64 bytes), each cut in three
 * pieces at the places where its copy and its in-place pass meet.
 */
static void test_icrc_lengths(void **state)
{
	/* Around the head, around where the rest behind it reaches
	 * sv_crc32's fold (256 bytes), and beyond. */
	static const size_t lens[] = { 5, 12, 16, 24, 63, 64, 65, 191, 192, 193, 200, 247,
				       256, 300, 319, 320, 321, 1100 };
	struct sv_flow f = flow_v4("198.18.0.1", "198.18.0.2", 49152, 4791);
	uint8_t pkt[1100];

	(void)state;
	for (size_t i = 0; i < sizeof(pkt); i++)
		pkt[i] = (uint8_t)(i * 131 + 7);
	for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
		size_t len = lens[li];
		uint32_t want = hand_icrc_v4(&f, pkt, len, true);
		const size_t cuts[] = { 0, 1, 4, 5, 12, 63, 64, 65, 100, 191, 192, 193, 250,
					 len - 1, len };
		for (size_t a = 0; a < sizeof(cuts) / sizeof(cuts[0]); a++) {
			for (size_t b = a; b < sizeof(cuts) / sizeof(cuts[0]); b++) {
				size_t x = cuts[a] < len ? cuts[a] : len, y = cuts[b] < len ? cuts[b] : len;
				if (y < x)
					continue;
				struct iovec v[3] = {
					{ .iov_base = pkt, .iov_len = x },
					{ .iov_base = pkt + x, .iov_len = y - x },
					{ .iov_base = pkt + y, .iov_len = len - y },
				};
				if (sv_icrc(&f, v, 3, len) != want)
					fail_msg("length %zu cut at %zu and %zu: 0x%08x, zlib 0x%08x", len,
						 x, y, sv_icrc(&f, v, 3, len), want);
			}
		}
	}
}

/*
 * sv_crc32 against zlib: lengths on both sides of where crc32.c's fold
 * starts (256 bytes) and of its 64-byte steps, at every alignment within a
 * cache line, from a zero and from running CRCs, and chained over a cut
 * anywhere.  On a processor with 256-bit VPCLMULQDQ and no AVX-512 the
 * long ones take the fold (sv_crc32_wide); elsewhere ISA-L alone.
 */
static void test_crc32_fold(void **state)
{
	static const size_t lens[] = { 0, 1, 15, 16, 63, 64, 127, 128, 255, 256, 257, 319, 320, 321,
				       335, 336, 383, 384, 1024, 4095, 4096, 4097, 4136, 9000 };
	static const uint32_t starts[] = { 0, 0xffffffffu, 0x12345678u };
	static uint8_t buf[9000 + 64];

	(void)state;
	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (uint8_t)(i * 167 + (i >> 8) * 13 + 1);
	print_message("256-bit fold: %s\n", sv_crc32_wide() ? "yes" : "no (ISA-L only)");
	for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
		for (size_t off = 0; off < 64; off++) {
			for (size_t si = 0; si < sizeof(starts) / sizeof(starts[0]); si++) {
				const uint8_t *p = buf + off;
				uint32_t want = (uint32_t)crc32(starts[si], p, (uInt)lens[li]);
				uint32_t got = sv_crc32(starts[si], p, lens[li]);
				if (got != want)
					fail_msg("length %zu at offset %zu from 0x%08x: 0x%08x, zlib 0x%08x",
						 lens[li], off, starts[si], got, want);
			}
		}
	}
	uint32_t whole = (uint32_t)crc32(0, buf, 9000);
	for (size_t cut = 0; cut <= 9000; cut += 97)
		assert_int_equal(sv_crc32(sv_crc32(0, buf, cut), buf + cut, 9000 - cut), whole);
	/* A flipped bit anywhere in a packet's worth changes it, as zlib's. */
	uint32_t clean = sv_crc32(0, buf, 4096);
	for (size_t bit = 0; bit < 4096 * 8; bit += 509) {
		buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		uint32_t got = sv_crc32(0, buf, 4096);
		assert_int_not_equal(got, clean);
		assert_int_equal(got, (uint32_t)crc32(0, buf, 4096));
		buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
	}
}

/*
 * The vector registers' upper halves are clean after an ICRC, as the
 * processor reports them (XGETBV with ECX 1, XINUSE: bit 2 the YMM upper
 * halves, bit 6 the ZMM ones).  ISA-L's AVX-512 CRC leaves them dirty,
 * and the SSE code after it then ran several times slower (icrc.c).
 * XINUSE may report a component in use that is not (the SDM allows it),
 * so the check runs where a VZEROUPPER is seen to clear both bits: where
 * the processor has no XINUSE or no AVX, or does not track them, there is
 * nothing to observe.
 */
#define UPPER_HALVES	(1u << 2 | 1u << 6)

#if defined(__x86_64__)
#include <cpuid.h>

static uint64_t xinuse(void)
{
	uint32_t lo, hi;

	__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(1));
	return (uint64_t)hi << 32 | lo;
}

static bool upper_observable(void)
{
	unsigned a, b, c, d;

	if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE) ||
	    !__get_cpuid_count(0xd, 1, &a, &b, &c, &d) || !(a & (1u << 2)) ||
	    !__builtin_cpu_supports("avx"))
		return false;
	__asm__ volatile("vzeroupper" ::: "memory");
	return !(xinuse() & UPPER_HALVES);
}
#else
static uint64_t xinuse(void) { return 0; }
static bool upper_observable(void) { return false; }
#endif

static void test_icrc_upper_clean(void **state)
{
	struct sv_flow f = flow_v4("198.18.0.1", "198.18.0.2", 1234, 4791);
	static uint8_t pkt[4096 + 32];
	struct iovec iov = { .iov_base = pkt, .iov_len = sizeof(pkt) };
	bool observable = upper_observable();

	memset(pkt, 0x5a, sizeof(pkt));
	uint32_t crc = sv_icrc(&f, &iov, 1, sizeof(pkt) - 4);
	if (observable)
		assert_int_equal(xinuse() & UPPER_HALVES, 0);
	put_le32(pkt + sizeof(pkt) - 4, crc);
	assert_true(sv_icrc_ok(&f, pkt, sizeof(pkt)));
	if (observable)
		assert_int_equal(xinuse() & UPPER_HALVES, 0);
}

/* ------------------------------------------------------------------ */
/* The wire                                                            */

#define PKT_LEN 40	/* UD SEND ONLY: BTH, DETH, 16 bytes, ICRC */

/* Packet seq of a run: its PSN and second payload word say which; the
 * send time follows when the test measures delays.  The payload starts
 * with a marker: Wireshark's IPoIB heuristic takes a UD payload that
 * starts like "07 00 00 00" for an ethertype and reports it malformed. */
static size_t make_packet(const struct sv_flow *f, uint32_t seq, uint64_t stamp, uint8_t *p)
{
	memset(p, 0, PKT_LEN);
	p[0] = 0x64;					/* UD SEND ONLY */
	p[2] = p[3] = 0xff;				/* P_Key */
	p[7] = 0x11;					/* QP 0x11 */
	p[9] = (uint8_t)(seq >> 16), p[10] = (uint8_t)(seq >> 8), p[11] = (uint8_t)seq;
	p[12] = p[13] = p[14] = p[15] = 0x11;		/* Q_Key */
	p[19] = 0x22;					/* source QP */
	memset(p + 20, 0x5a, 4);
	memcpy(p + 24, &seq, 4);
	memcpy(p + 28, &stamp, 8);
	struct iovec iov = { .iov_base = p, .iov_len = PKT_LEN - 4 };
	put_le32(p + PKT_LEN - 4, sv_icrc(f, &iov, 1, PKT_LEN - 4));
	return PKT_LEN;
}

static int udp_socket(uint16_t *port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t al = sizeof(a);
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), big = 1 << 20;

	assert_true(s >= 0);
	setsockopt(s, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
	assert_int_equal(bind(s, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(getsockname(s, (struct sockaddr *)&a, &al), 0);
	*port = ntohs(a.sin_port);
	return s;
}

/* What a child reports: its counters, and how steadily it sent. */
struct child_status {
	struct sv_fault_counts counts;
	uint64_t max_gap;
};

struct sender {
	int s;
	uint16_t port;
	unsigned first, count;
	uint32_t ep;		/* sv_wire_send's sender */
	bool stamp;
	bool check_due;		/* alone on the wire: its due time is exact */
	int ret;
	uint64_t max_gap;	/* ns between two sends, at most */
};

static void *send_packets(void *arg)
{
	struct sender *w = arg;
	struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons(w->port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct sockaddr_in me;
	socklen_t ml = sizeof(me);
	char src[INET_ADDRSTRLEN];

	if (getsockname(w->s, (struct sockaddr *)&me, &ml) ||
	    !inet_ntop(AF_INET, &me.sin_addr, src, sizeof(src))) {
		w->ret = 11;
		return NULL;
	}
	struct sv_flow f = flow_v4(src, "127.0.0.1", ntohs(me.sin_port), w->port);
	uint64_t last = 0;

	for (unsigned i = w->first; i < w->first + w->count; i++) {
		uint8_t p[PKT_LEN], keep[PKT_LEN];
		size_t len = make_packet(&f, i, w->stamp ? mono_ns() : 0, p);
		struct iovec iov[2] = { { .iov_base = p, .iov_len = 10 },
					{ .iov_base = p + 10, .iov_len = len - 10 } };

		memcpy(keep, p, len);
		uint64_t now = mono_ns();
		if (last && now - last > w->max_gap)
			w->max_gap = now - last;
		last = now;
		uint64_t due;
		if (sv_wire_send(w->s, (struct sockaddr *)&to, sizeof(to), &f, w->ep, iov, 2, len, &due)) {
			w->ret = 12;
			return NULL;
		}
		/* The due time reported is the held queue's own: a flush at
		 * time 0 sends nothing and names it too (0 when none). */
		if (w->check_due && due != sv_wire_flush(0)) {
			w->ret = 16;
			return NULL;
		}
		/* The caller's buffer is the caller's: never flipped. */
		if (memcmp(keep, p, len)) {
			w->ret = 13;
			return NULL;
		}
		/* And reusable at once: the held copy is private. */
		memset(p, 0xee, len);
	}
	return NULL;
}

#define CHILD_THREADS 4

/* The child: sends count packets to 127.0.0.1:port through sv_wire_send
 * with the SOFTVERBS_FAULT it was given, flushes until nothing is held,
 * and writes its counters to status_fd.  flags: t = stamp send times,
 * f = sv_wire_forget before flushing, m = CHILD_THREADS threads share
 * the packets (and the socket) and flush as they go, e = send as the
 * host's second process (sender 1, not 0), a = send from 127.0.0.2. */
static int child(uint16_t port, unsigned count, int status_fd, const char *flags)
{
	struct sockaddr_in me = { .sin_family = AF_INET,
				  .sin_addr.s_addr = htonl(strchr(flags, 'a') ? 0x7f000002 : INADDR_LOOPBACK) };
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	unsigned nt = strchr(flags, 'm') ? CHILD_THREADS : 1;
	struct sender w[CHILD_THREADS];
	pthread_t t[CHILD_THREADS];
	struct child_status st = { .max_gap = 0 };

	if (s < 0 || bind(s, (struct sockaddr *)&me, sizeof(me)))
		return 10;
	for (unsigned i = 0; i < nt; i++) {
		w[i] = (struct sender){ .s = s, .port = port, .first = count / nt * i,
					.count = i + 1 < nt ? count / nt : count - count / nt * i,
					.ep = strchr(flags, 'e') ? 1 : 0,
					.stamp = strchr(flags, 't') != NULL, .check_due = nt == 1 };
		if (nt == 1)
			send_packets(&w[i]);
		else if (pthread_create(&t[i], NULL, send_packets, &w[i]))
			return 15;
	}
	/* With threads, this one flushes while they send. */
	for (unsigned i = 0; nt > 1 && i < 200; i++) {
		sv_wire_flush(mono_ns());
		usleep(100);
	}
	for (unsigned i = 0; i < nt; i++) {
		if (nt > 1)
			pthread_join(t[i], NULL);
		if (w[i].ret)
			return w[i].ret;
		if (w[i].max_gap > st.max_gap)
			st.max_gap = w[i].max_gap;
	}
	if (strchr(flags, 'f'))
		sv_wire_forget(s);
	for (uint64_t next; (next = sv_wire_flush(mono_ns()));) {
		struct timespec ts = { .tv_sec = (time_t)(next / 1000000000),
				       .tv_nsec = (long)(next % 1000000000) };
		clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
	}
	sv_fault_counts(&st.counts);
	if (write(status_fd, &st, sizeof(st)) != (ssize_t)sizeof(st))
		return 14;
	return 0;
}

#define MAX_RX 512

struct rx {
	unsigned n;
	uint32_t seq[MAX_RX];
	uint64_t latency[MAX_RX];	/* ns from the child's stamp */
	bool icrc_ok[MAX_RX];
	uint8_t pkt[MAX_RX][PKT_LEN];
	struct sv_fault_counts counts;
	uint64_t max_gap;		/* the child's longest pause between sends */
};

static void record(struct rx *rx, int s, uint16_t port)
{
	struct sockaddr_in from;
	socklen_t fl = sizeof(from);
	uint8_t p[256];
	ssize_t n = recvfrom(s, p, sizeof(p), MSG_DONTWAIT, (struct sockaddr *)&from, &fl);
	uint64_t stamp, now = mono_ns();
	char src[INET_ADDRSTRLEN];

	if (n < 0)
		return;
	assert_int_equal(n, PKT_LEN);
	assert_true(rx->n < MAX_RX);
	assert_non_null(inet_ntop(AF_INET, &from.sin_addr, src, sizeof(src)));
	struct sv_flow f = flow_v4(src, "127.0.0.1", ntohs(from.sin_port), port);
	memcpy(&rx->seq[rx->n], p + 24, 4);
	memcpy(&stamp, p + 28, 8);
	rx->latency[rx->n] = stamp ? now - stamp : 0;
	rx->icrc_ok[rx->n] = sv_icrc_ok(&f, p, PKT_LEN);
	memcpy(rx->pkt[rx->n], p, PKT_LEN);
	rx->n++;
}

/* Runs a child with SOFTVERBS_FAULT=fault (and SOFTVERBS_PCAP=pcap, or
 * none) and receives what it sends. */
static void run_child(const char *fault, const char *pcap, unsigned count, const char *flags,
		      struct rx *rx)
{
	uint16_t port;
	int s = udp_socket(&port), p[2];
	char *env[256], fault_env[256], pcap_env[256], arg_port[16], arg_count[16], arg_fd[16];
	int ne = 0, st;
	struct child_status cs;
	size_t got = 0;
	pid_t pid;

	memset(rx, 0, sizeof(*rx));
	assert_int_equal(pipe(p), 0);
	fcntl(p[0], F_SETFD, FD_CLOEXEC);
	for (char **e = environ; *e && ne < 250; e++)
		if (strncmp(*e, "SOFTVERBS_FAULT=", 16) && strncmp(*e, "SOFTVERBS_PCAP=", 15))
			env[ne++] = *e;
	snprintf(fault_env, sizeof(fault_env), "SOFTVERBS_FAULT=%s", fault);
	env[ne++] = fault_env;
	if (pcap) {
		snprintf(pcap_env, sizeof(pcap_env), "SOFTVERBS_PCAP=%s", pcap);
		env[ne++] = pcap_env;
	}
	env[ne] = NULL;
	snprintf(arg_port, sizeof(arg_port), "%u", port);
	snprintf(arg_count, sizeof(arg_count), "%u", count);
	snprintf(arg_fd, sizeof(arg_fd), "%d", p[1]);
	char *argv[] = { "test_udp_tap", "--child", arg_port, arg_count, arg_fd, (char *)flags, NULL };
	assert_int_equal(posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, env), 0);
	close(p[1]);

	/* Receive while the child runs: its packets must not wait in a
	 * socket buffer that could overflow. */
	for (bool done = false; !done;) {
		struct pollfd pf[2] = { { .fd = s, .events = POLLIN }, { .fd = p[0], .events = POLLIN } };

		assert_true(poll(pf, 2, 10000) > 0);
		if (pf[0].revents & POLLIN)
			record(rx, s, port);
		if (pf[1].revents & (POLLIN | POLLHUP)) {
			ssize_t r = read(p[0], (char *)&cs + got, sizeof(cs) - got);

			assert_true(r >= 0);
			got += (size_t)r;
			done = r == 0;
		}
	}
	/* Loopback delivers within sendmsg; a short wait covers the rest. */
	for (struct pollfd pf = { .fd = s, .events = POLLIN }; poll(&pf, 1, 50) > 0;)
		record(rx, s, port);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	assert_int_equal(got, sizeof(cs));
	rx->counts = cs.counts;
	rx->max_gap = cs.max_gap;
	close(p[0]);
	close(s);
}

/* A dual-stack socket on [::]:0 that reports each datagram's addresses,
 * traffic class or TOS, and hop limit or TTL. */
static int dual_socket(uint16_t *port)
{
	int s = socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0), one = 1, zero = 0;
	struct sockaddr_in6 a = { .sin6_family = AF_INET6 };
	socklen_t al = sizeof(a);

	assert_true(s >= 0);
	assert_int_equal(setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero)), 0);
	setsockopt(s, IPPROTO_IPV6, IPV6_RECVPKTINFO, &one, sizeof(one));
	setsockopt(s, IPPROTO_IPV6, IPV6_RECVTCLASS, &one, sizeof(one));
	setsockopt(s, IPPROTO_IPV6, IPV6_RECVHOPLIMIT, &one, sizeof(one));
	setsockopt(s, IPPROTO_IP, IP_RECVTOS, &one, sizeof(one));
	setsockopt(s, IPPROTO_IP, IP_RECVTTL, &one, sizeof(one));
	assert_int_equal(bind(s, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(getsockname(s, (struct sockaddr *)&a, &al), 0);
	*port = ntohs(a.sin6_port);
	return s;
}

/* One datagram on r: its source, and its class and hops as received. */
static void recv_marks(int r, struct in6_addr *src, int *tclass, int *hops)
{
	uint8_t buf[256];
	char ctl[256] __attribute__((aligned(8)));
	struct sockaddr_in6 from;
	struct iovec iov = { buf, sizeof(buf) };
	struct msghdr m = { .msg_name = &from, .msg_namelen = sizeof(from), .msg_iov = &iov,
			    .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof(ctl) };
	struct pollfd pf = { .fd = r, .events = POLLIN };

	assert_int_equal(poll(&pf, 1, 2000), 1);
	assert_true(recvmsg(r, &m, 0) > 0);
	*src = from.sin6_addr;
	*tclass = *hops = -1;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
		if ((c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_TCLASS) ||
		    (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS))
			*tclass = c->cmsg_type == IP_TOS ? *(uint8_t *)CMSG_DATA(c) :
				  *(int *)CMSG_DATA(c);
		else if ((c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_HOPLIMIT) ||
			 (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TTL))
			*hops = *(int *)CMSG_DATA(c);
	}
}

/* The wire over loopback from a dual-stack socket, as the link sends:
 * IPv4 to an IPv4-mapped address leaves from the flow's source (not the
 * kernel's pick) with its TOS and TTL; IPv6 with its traffic class and
 * hop limit. */
static void test_wire_dual_stack(void **state)
{
	uint16_t port, sport;
	int r = dual_socket(&port), s = dual_socket(&sport);
	uint8_t p[PKT_LEN];
	struct in6_addr src;
	int tc, hops;

	struct sv_flow f4 = flow_v4("127.0.0.2", "127.0.0.1", sport, port);
	f4.tclass = 0x48, f4.ttl = 5;
	size_t len = make_packet(&f4, 1, 0, p);
	struct iovec iov = { p, len };
	struct sockaddr_in6 to = { .sin6_family = AF_INET6, .sin6_port = htons(port),
				   .sin6_addr = f4.dst };
	assert_int_equal(sv_wire_send(s, (struct sockaddr *)&to, sizeof(to), &f4, 0, &iov, 1, len, NULL), 0);
	recv_marks(r, &src, &tc, &hops);
	assert_memory_equal(&src, &f4.src, 16);		/* ::ffff:127.0.0.2 */
	assert_int_equal(tc, 0x48);
	assert_int_equal(hops, 5);

	struct sv_flow f6 = flow_v6("::1", "::1", sport, port);
	f6.tclass = 0x28, f6.ttl = 9;
	to.sin6_addr = f6.dst;
	len = make_packet(&f6, 2, 0, p);
	iov.iov_len = len;
	int err = sv_wire_send(s, (struct sockaddr *)&to, sizeof(to), &f6, 0, &iov, 1, len, NULL);
	if (err == EADDRNOTAVAIL || err == ENETUNREACH || err == EINVAL) {
		print_message("no ::1 here (%s): the IPv6 half is not run\n", strerror(err));
	} else {
		assert_int_equal(err, 0);
		recv_marks(r, &src, &tc, &hops);
		assert_memory_equal(&src, &in6addr_loopback, 16);
		assert_int_equal(tc, 0x28);
		assert_int_equal(hops, 9);
	}
	close(r);
	close(s);
}

/* Faults off, in this process: one copy, as is, captured. */
static void test_wire_plain(void **state)
{
	uint16_t port, sport;
	int r = udp_socket(&port), s = udp_socket(&sport);
	struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons(port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct sv_flow f = flow_v4("127.0.0.1", "127.0.0.1", sport, port);
	struct sv_fault_counts before, after;
	uint8_t p[PKT_LEN], got[256];
	size_t len = make_packet(&f, 7, 0, p);
	struct iovec iov = { .iov_base = p, .iov_len = len };

	sv_fault_counts(&before);
	assert_int_equal(sv_wire_send(s, (struct sockaddr *)&to, sizeof(to), &f, 0, &iov, 1, len, NULL), 0);
	assert_int_equal(sv_wire_flush(mono_ns()), 0);
	assert_int_equal(recv(r, got, sizeof(got), 0), len);
	assert_memory_equal(got, p, len);
	assert_true(sv_icrc_ok(&f, got, len));
	assert_int_equal(recv(r, got, sizeof(got), MSG_DONTWAIT), -1);
	sv_fault_counts(&after);
	assert_true(after.sent == before.sent + 1);
	assert_true(after.dropped == before.dropped && after.delayed == before.delayed);
	/* A socket error comes back as an errno. */
	struct sockaddr_in6 bad6 = { .sin6_family = AF_INET6 };
	assert_int_not_equal(sv_wire_send(s, (struct sockaddr *)&bad6, sizeof(bad6), &f, 0, &iov, 1, len, NULL), 0);
	close(r);
	close(s);
}

static void test_wire_dup(void **state)
{
	static struct rx rx;

	run_child("dup=1", NULL, 8, "-", &rx);
	assert_int_equal(rx.n, 16);
	for (unsigned i = 0; i < 16; i++) {
		assert_int_equal(rx.seq[i], i / 2);
		assert_true(rx.icrc_ok[i]);
	}
	assert_int_equal(rx.counts.sent, 16);
	assert_int_equal(rx.counts.duplicated, 8);
}

static void test_wire_reorder(void **state)
{
	static struct rx rx;
	/* Every packet reordered: each waits for the next, which overtakes
	 * it; the last has no next and goes at its 1 ms deadline. */
	static const uint32_t want[] = { 1, 0, 3, 2, 5, 4, 7, 6, 8 };
	unsigned seen[SV_ARRAY_LEN(want)] = { 0 };

	for (int attempt = 0;; attempt++) {
		run_child("reorder=1", NULL, 9, "-", &rx);
		assert_int_equal(rx.n, SV_ARRAY_LEN(want));
		assert_int_equal(rx.counts.sent, 9);
		/* A child paused past the 1 ms deadline between two sends
		 * lets a packet go alone: another order, rightly.  A loaded
		 * machine gets a few tries. */
		if (rx.max_gap < 800000 || attempt == 4)
			break;
	}
	for (unsigned i = 0; i < rx.n; i++) {
		assert_true(rx.icrc_ok[i]);
		assert_true(rx.seq[i] < rx.n);
		assert_int_equal(seen[rx.seq[i]]++, 0);
	}
	if (rx.max_gap < 800000) {
		for (unsigned i = 0; i < rx.n; i++)
			assert_int_equal(rx.seq[i], want[i]);
		assert_int_equal(rx.counts.reordered, 5);
	}
}

static void test_wire_delay(void **state)
{
	static struct rx rx;

	run_child("delay=20000", NULL, 8, "t", &rx);
	assert_int_equal(rx.n, 8);
	for (unsigned i = 0; i < rx.n; i++) {
		assert_int_equal(rx.seq[i], i);
		assert_true(rx.latency[i] >= 20000000ull);
		assert_true(rx.icrc_ok[i]);
	}
	assert_int_equal(rx.counts.delayed, 8);
	assert_int_equal(rx.counts.sent, 8);

	/* Reordered and delayed: the pairs still swap (a waiting packet
	 * has 1 ms plus the delay before it goes alone). */
	run_child("delay=100000,reorder=1", NULL, 4, "t", &rx);
	assert_int_equal(rx.n, 4);
	assert_true(rx.max_gap < 100000000ull);
	assert_int_equal(rx.seq[0], 1);
	assert_int_equal(rx.seq[1], 0);
	assert_int_equal(rx.seq[2], 3);
	assert_int_equal(rx.seq[3], 2);
	for (unsigned i = 0; i < rx.n; i++)
		assert_true(rx.latency[i] >= 100000000ull);
}

static void test_wire_forget(void **state)
{
	static struct rx rx;

	run_child("delay=50000,dup=1", NULL, 8, "f", &rx);
	assert_int_equal(rx.n, 0);
	assert_int_equal(rx.counts.sent, 0);
	assert_int_equal(rx.counts.delayed, 8);
}

static void test_wire_drop(void **state)
{
	static struct rx rx;

	run_child("drop=1", NULL, 8, "-", &rx);
	assert_int_equal(rx.n, 0);
	assert_int_equal(rx.counts.dropped, 8);
	assert_int_equal(rx.counts.sent, 0);
}

/* A bad setting leaves the wire clean (and is said on stderr). */
static void test_wire_bad_setting(void **state)
{
	static struct rx rx;

	run_child("drop=2", NULL, 4, "-", &rx);
	assert_int_equal(rx.n, 4);
	assert_int_equal(rx.counts.dropped, 0);
}

static void test_wire_corrupt(void **state)
{
	static struct rx rx;

	run_child("corrupt=1", NULL, 32, "-", &rx);
	assert_int_equal(rx.n, 32);
	assert_int_equal(rx.counts.corrupted, 32);
	for (unsigned i = 0; i < rx.n; i++) {
		uint8_t want[PKT_LEN];
		unsigned diff = 0, where = 0;

		/* Nothing else reorders: arrival i is packet i.  Its ICRC
		 * is the sender's flow's, so the bytes before it are
		 * compared, and a flip in the ICRC itself shows as none. */
		struct sv_flow f = flow_v4("127.0.0.1", "127.0.0.1", 1, 1);
		make_packet(&f, i, 0, want);
		for (unsigned b = 0; b < PKT_LEN - 4; b++)
			if (rx.pkt[i][b] != want[b])
				diff++, where = b;
		assert_true(diff <= 1);
		/* Never the resv8a byte: the ICRC does not cover it. */
		if (diff)
			assert_int_not_equal(where, 4);
		assert_false(rx.icrc_ok[i]);
	}
}

/* Threads sending and flushing at once lose and invent nothing. */
static void test_wire_threads(void **state)
{
	static struct rx rx;
	unsigned seen[128] = { 0 };

	run_child("drop=0.1,dup=0.2,reorder=0.3,corrupt=0.1,delay=300,seed=5", NULL, 128, "m", &rx);
	assert_int_equal(rx.n, rx.counts.sent);
	assert_int_equal(rx.n, 128 - rx.counts.dropped + rx.counts.duplicated);
	assert_true(rx.counts.reordered > 0 && rx.counts.delayed > 0);
	for (unsigned i = 0; i < rx.n; i++)
		if (rx.icrc_ok[i]) {
			assert_true(rx.seq[i] < 128);
			seen[rx.seq[i]]++;
		}
	for (unsigned i = 0; i < 128; i++)
		assert_true(seen[i] <= 2);
}

/* Past HELD_MAX held packets, the rest go out at once, undelayed. */
static void test_wire_held_cap(void **state)
{
	static struct rx rx;

	run_child("delay=10000000", NULL, 4096 + 20, "f", &rx);
	assert_int_equal(rx.counts.delayed, 4096);
	assert_int_equal(rx.counts.sent, 20);
	assert_int_equal(rx.n, 20);
	for (unsigned i = 0; i < rx.n; i++)
		assert_int_equal(rx.seq[i], 4096 + i);
}

static bool same_pattern(const struct rx *a, const struct rx *b)
{
	return a->n == b->n && !memcmp(a->seq, b->seq, a->n * sizeof(a->seq[0]));
}

/* The same seed and sender, the same pattern; another seed, another; and
 * the same seed for another sender (another process of the host, or
 * another host's address) another too: both ends of a connection given
 * one SOFTVERBS_FAULT must not lose the same packet numbers. */
static void test_wire_deterministic(void **state)
{
	static struct rx a, b, c, d, e;

	run_child("drop=0.3,dup=0.3,seed=1234", NULL, 64, "-", &a);
	run_child("drop=0.3,dup=0.3,seed=1234", NULL, 64, "-", &b);
	run_child("drop=0.3,dup=0.3,seed=99", NULL, 64, "-", &c);
	run_child("drop=0.3,dup=0.3,seed=1234", NULL, 64, "e", &d);
	run_child("drop=0.3,dup=0.3,seed=1234", NULL, 64, "a", &e);
	assert_true(a.counts.dropped > 0 && a.counts.duplicated > 0);
	assert_int_equal(a.n, 64 - a.counts.dropped + a.counts.duplicated);
	assert_true(same_pattern(&a, &b));
	assert_memory_equal(&a.counts, &b.counts, sizeof(a.counts));
	assert_false(same_pattern(&a, &c));
	assert_false(same_pattern(&a, &d));
	assert_false(same_pattern(&a, &e));
	assert_false(same_pattern(&d, &e));
	/* Roughly the rates asked for. */
	assert_in_range(a.counts.dropped, 8, 32);
	for (unsigned i = 0; i < e.n; i++)
		assert_true(e.icrc_ok[i]);
}

/* ------------------------------------------------------------------ */
/* Captures                                                            */

struct frame {
	const uint8_t *data;
	uint32_t incl, orig;
};

/* The records of a capture file (whose header is checked); count. */
static unsigned read_pcap(const char *path, uint8_t **buf, struct frame *fr, unsigned max)
{
	struct stat sb;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	unsigned n = 0;
	size_t off = 24;

	assert_true(fd >= 0);
	assert_int_equal(fstat(fd, &sb), 0);
	*buf = malloc((size_t)sb.st_size + 1);
	assert_int_equal(read(fd, *buf, (size_t)sb.st_size), sb.st_size);
	close(fd);
	assert_true(sb.st_size >= 24);
	uint32_t g[6];
	memcpy(g, *buf, 24);
	assert_int_equal(g[0], 0xa1b2c3d4);
	assert_int_equal(g[1], 2 | 4 << 16);		/* version 2.4 */
	assert_int_equal(g[2], 0);			/* thiszone */
	assert_int_equal(g[3], 0);			/* sigfigs */
	assert_true(g[4] >= 65535);			/* snaplen */
	assert_int_equal(g[5], 1);			/* LINKTYPE_ETHERNET */
	while (off < (size_t)sb.st_size) {
		uint32_t r[4];

		assert_true(off + 16 <= (size_t)sb.st_size);
		memcpy(r, *buf + off, 16);
		assert_true(r[2] <= r[3]);
		assert_true(off + 16 + r[2] <= (size_t)sb.st_size);
		assert_true(n < max);
		fr[n++] = (struct frame){ .data = *buf + off + 16, .incl = r[2], .orig = r[3] };
		off += 16 + r[2];
	}
	return n;
}

static uint16_t ones_sum(const uint8_t *p, size_t n, uint32_t sum)
{
	for (size_t i = 0; i < n; i += 2)
		sum += (uint32_t)p[i] << 8 | (i + 1 < n ? p[i + 1] : 0);
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return (uint16_t)sum;
}

/* Ethernet, IP and UDP of a captured frame are valid, and the UDP
 * payload is pkt. */
static void check_frame(const struct frame *fr, const struct sv_flow *f, const uint8_t *pkt,
			size_t len)
{
	const uint8_t *e = fr->data, *ip = e + 14, *udp;
	size_t iplen = f->v4 ? 20 : 40;
	uint8_t ph[40];
	uint32_t sum;

	assert_int_equal(fr->incl, 14 + iplen + 8 + len);
	assert_int_equal(fr->orig, fr->incl);
	assert_int_equal(e[12] << 8 | e[13], f->v4 ? 0x0800 : 0x86dd);
	assert_int_equal(e[0], 0x02);		/* locally administered, unicast */
	assert_memory_equal(e + 2, &f->dst.s6_addr[12], 4);
	assert_memory_equal(e + 8, &f->src.s6_addr[12], 4);
	if (f->v4) {
		assert_int_equal(ip[0], 0x45);
		assert_int_equal(ip[1], f->tclass);
		assert_int_equal(ip[2] << 8 | ip[3], 20 + 8 + len);
		assert_int_equal(ip[6] << 8 | ip[7], 0x4000);
		assert_int_equal(ip[9], 17);
		assert_int_equal(ones_sum(ip, 20, 0), 0xffff);
		memcpy(ph, ip + 12, 8);
		ph[8] = 0, ph[9] = 17;
		put16(ph + 10, (uint16_t)(8 + len));
		sum = ones_sum(ph, 12, 0);
	} else {
		assert_int_equal(ip[0] >> 4, 6);
		assert_int_equal((ip[0] & 0xf) << 4 | ip[1] >> 4, f->tclass);
		assert_int_equal((ip[1] & 0xf) << 16 | ip[2] << 8 | ip[3], f->flow);
		assert_int_equal(ip[4] << 8 | ip[5], 8 + len);
		assert_int_equal(ip[6], 17);
		memcpy(ph, ip + 8, 32);
		sum = ones_sum(ph, 32, 8 + len + 17);
	}
	udp = ip + iplen;
	assert_int_equal(udp[0] << 8 | udp[1], f->sport);
	assert_int_equal(udp[2] << 8 | udp[3], f->dport);
	assert_int_equal(udp[4] << 8 | udp[5], 8 + len);
	assert_true(udp[6] | udp[7]);			/* a checksum, not "none" */
	/* UDP header and payload are contiguous in the frame. */
	assert_int_equal(ones_sum(udp, 8 + len, sum), 0xffff);
	assert_memory_equal(udp + 8, pkt, len);
}

/* A packet with ICRC, of a few kinds tshark must decode. */
static size_t sample(unsigned kind, const struct sv_flow *f, uint8_t *p)
{
	size_t len;

	switch (kind % 4) {
	case 0:
		len = write_only(p);
		break;
	case 1:						/* RC ACKNOWLEDGE, AETH */
		memset(p, 0, 16);
		p[0] = 0x11, p[2] = p[3] = 0xff, p[7] = 0x34, p[11] = 0x2a;
		p[12] = 0x1f, p[15] = 0x05;		/* ACK, credits; MSN 5 */
		len = 16;
		break;
	case 2:
		/* RC SEND ONLY of 16 bytes: Wireshark 4.0's RPC-over-RDMA
		 * heuristic throws on a SEND of less, and the frame shows
		 * as malformed, whatever it carries. */
		memset(p, 0, 28);
		p[0] = 0x04, p[2] = p[3] = 0xff, p[7] = 0x34, p[8] = 0x80, p[11] = 7;
		memcpy(p + 12, "softverbs  tap  ", 16);
		len = 28;
		break;
	default:
		len = make_packet(f, kind, 0, p) - 4;
		break;
	}
	struct iovec iov = { .iov_base = p, .iov_len = len };
	put_le32(p + len, sv_icrc(f, &iov, 1, len));
	return len + 4;
}

static void capture_path(char *out, size_t size)
{
	snprintf(out, size, "%s/main-%d.pcap", tmpdir, (int)getpid());
}

/* Frames in this process's capture so far; *rocev2, those to 4791. */
static unsigned frames_now_to(unsigned *rocev2)
{
	char path[128];
	struct stat sb;
	unsigned to4791 = 0;

	capture_path(path, sizeof(path));
	if (stat(path, &sb))
		return 0;
	uint8_t *buf;
	static struct frame fr[8192];
	unsigned n = read_pcap(path, &buf, fr, SV_ARRAY_LEN(fr));
	for (unsigned i = 0; i < n; i++) {
		const uint8_t *ip = fr[i].data + 14;
		const uint8_t *udp = ip + (fr[i].data[12] == 0x08 ? 20 : 40);

		to4791 += (udp[2] << 8 | udp[3]) == 4791;
	}
	free(buf);
	if (rocev2)
		*rocev2 = to4791;
	return n;
}

static unsigned frames_now(void)
{
	return frames_now_to(NULL);
}

static void test_pcap_file(void **state)
{
	struct sv_flow f4 = flow_v4("10.0.0.1", "10.0.0.2", 49152, 4791);
	struct sv_flow f6 = flow_v6("fd00::1", "fd00::2", 49153, 4791);
	uint8_t pkts[8][64], *buf;
	size_t lens[8];
	static struct frame fr[8192];
	char path[128];

	assert_true(sv_pcap_on());
	unsigned before = frames_now();
	f4.tclass = 0x88, f6.tclass = 0x24, f6.ttl = 0, f6.flow = 0x9abcd;
	for (unsigned i = 0; i < 8; i++) {
		const struct sv_flow *f = i < 4 ? &f4 : &f6;
		lens[i] = sample(i, f, pkts[i]);
		/* Cut in pieces, as the transport gathers headers and data. */
		struct iovec iov[3] = { { pkts[i], 3 }, { pkts[i] + 3, 9 }, { pkts[i] + 12, lens[i] - 12 } };
		sv_pcap_write(f, iov, 3, lens[i]);
	}
	capture_path(path, sizeof(path));
	unsigned n = read_pcap(path, &buf, fr, SV_ARRAY_LEN(fr));
	assert_int_equal(n, before + 8);
	for (unsigned i = 0; i < 8; i++) {
		const struct frame *x = &fr[before + i];
		check_frame(x, i < 4 ? &f4 : &f6, pkts[i], lens[i]);
		/* ttl 0 in the flow is recorded as 64 */
		if (i >= 4)
			assert_int_equal(x->data[14 + 7], 64);
	}
	free(buf);
}

struct writer {
	unsigned id;
};

#define WRITERS 4
#define PER_WRITER 300

static void *write_frames(void *arg)
{
	struct writer *w = arg;
	struct sv_flow f = flow_v4("10.9.0.1", "10.9.0.2", (uint16_t)(1000 + w->id), 4791);

	for (unsigned i = 0; i < PER_WRITER; i++) {
		uint8_t p[PKT_LEN];
		size_t len = make_packet(&f, i, 0, p);
		struct iovec iov = { .iov_base = p, .iov_len = len };

		sv_pcap_write(&f, &iov, 1, len);
	}
	return NULL;
}

/* Threads never interleave inside a record. */
static void test_pcap_threads(void **state)
{
	pthread_t t[WRITERS];
	struct writer w[WRITERS];
	unsigned next[WRITERS] = { 0 }, before = frames_now();
	uint8_t *buf;
	static struct frame fr[8192];
	char path[128];

	for (unsigned i = 0; i < WRITERS; i++) {
		w[i].id = i;
		assert_int_equal(pthread_create(&t[i], NULL, write_frames, &w[i]), 0);
	}
	for (unsigned i = 0; i < WRITERS; i++)
		pthread_join(t[i], NULL);
	capture_path(path, sizeof(path));
	unsigned n = read_pcap(path, &buf, fr, SV_ARRAY_LEN(fr));
	assert_int_equal(n, before + WRITERS * PER_WRITER);
	for (unsigned i = before; i < n; i++) {
		const uint8_t *udp = fr[i].data + 34;
		unsigned id = (unsigned)(udp[0] << 8 | udp[1]) - 1000;
		uint32_t seq;
		uint8_t want[PKT_LEN];

		assert_true(id < WRITERS);
		memcpy(&seq, udp + 8 + 24, 4);
		/* Each thread's frames in its order. */
		assert_int_equal(seq, next[id]++);
		struct sv_flow f = flow_v4("10.9.0.1", "10.9.0.2", (uint16_t)(1000 + id), 4791);
		make_packet(&f, seq, 0, want);
		check_frame(&fr[i], &f, want, PKT_LEN);
	}
	free(buf);
}

/* Runs cmd; its exit status, and its output in out. */
static int run_cmd(const char *cmd, char *out, size_t size)
{
	FILE *p = popen(cmd, "r");
	size_t n = 0;

	assert_non_null(p);
	while (n + 1 < size && fgets(out + n, (int)(size - n), p))
		n += strlen(out + n);
	out[n] = 0;
	int st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* tests/integration/icrc_check.py recomputes every ICRC on its own. */
static void test_pcap_icrc_check(void **state)
{
	const char *script = getenv("SV_ICRC_CHECK");
	char cmd[512], out[8192], path[128];
	static struct rx rx;

	if (!script || access(script, R_OK) || system("python3 -c '' 2>/dev/null"))
		skip();
	capture_path(path, sizeof(path));
	unsigned n;
	frames_now_to(&n);
	snprintf(cmd, sizeof(cmd), "python3 %s %s 2>&1", script, path);
	assert_int_equal(run_cmd(cmd, out, sizeof(out)), 0);
	print_message("%s", out);
	snprintf(cmd, sizeof(cmd), "checked %u ", n);
	assert_non_null(strstr(out, cmd));

	/* A child's capture of corrupted packets: every one is caught. */
	snprintf(path, sizeof(path), "%s/corrupt-%%p.pcap", tmpdir);
	run_child("corrupt=1", path, 5, "-", &rx);
	snprintf(cmd, sizeof(cmd), "python3 %s --port any %s/corrupt-*.pcap 2>&1", script, tmpdir);
	assert_int_equal(run_cmd(cmd, out, sizeof(out)), 1);
	print_message("%s", out);
	for (unsigned i = 1; i <= 5; i++) {
		char want[32];

		snprintf(want, sizeof(want), "frame %u:", i);
		assert_non_null(strstr(out, want));
	}
	/* And a clean child's capture passes, duplicates and all. */
	snprintf(path, sizeof(path), "%s/dup.pcap", tmpdir);
	run_child("dup=1", path, 5, "-", &rx);
	snprintf(cmd, sizeof(cmd), "python3 %s --port any %s 2>&1", script, path);
	assert_int_equal(run_cmd(cmd, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "checked 10 "));
}

/* tshark decodes our frames as RoCEv2 with no expert complaint. */
static void test_pcap_tshark(void **state)
{
	char cmd[512], out[16384], path[128];
	struct sv_flow f4 = flow_v4("10.0.0.1", "10.0.0.2", 49152, 4791);
	struct sv_flow f6 = flow_v6("fd00::1", "fd00::2", 49153, 4791);
	uint8_t p[64];

	if (system("tshark -v >/dev/null 2>&1"))
		skip();
	unsigned before = frames_now();
	for (unsigned i = 0; i < 8; i++) {
		const struct sv_flow *f = i < 4 ? &f4 : &f6;
		size_t len = sample(i, f, p);
		struct iovec iov = { .iov_base = p, .iov_len = len };
		sv_pcap_write(f, &iov, 1, len);
	}
	capture_path(path, sizeof(path));
	snprintf(cmd, sizeof(cmd),
		 "tshark -n -r %s -Y 'frame.number > %u' -T fields -e infiniband.bth.opcode "
		 "-e udp.dstport 2>/dev/null", path, before);
	assert_int_equal(run_cmd(cmd, out, sizeof(out)), 0);
	print_message("%s", out);
	assert_string_equal(out, "10\t4791\n17\t4791\n4\t4791\n100\t4791\n"
				 "10\t4791\n17\t4791\n4\t4791\n100\t4791\n");
	/* Nothing malformed, no warning or error in the whole file. */
	snprintf(cmd, sizeof(cmd),
		 "tshark -n -r %s -Y '_ws.malformed || _ws.expert.severity >= warning' "
		 "2>/dev/null | wc -l", path);
	assert_int_equal(run_cmd(cmd, out, sizeof(out)), 0);
	assert_string_equal(out, "0\n");
}

int main(int argc, char **argv)
{
	if (argc == 6 && !strcmp(argv[1], "--child"))
		return child((uint16_t)atoi(argv[2]), (unsigned)atoi(argv[3]), atoi(argv[4]), argv[5]);

	char tmpl[] = "/tmp/svtest-udp-tap-XXXXXX", path[128];
	assert_non_null(mkdtemp(tmpl));
	snprintf(tmpdir, sizeof(tmpdir), "%s", tmpl);
	/* This process injects no faults; it captures into tmpdir. */
	unsetenv("SOFTVERBS_FAULT");
	snprintf(path, sizeof(path), "%s/main-%%p.pcap", tmpdir);
	setenv("SOFTVERBS_PCAP", path, 1);

	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fault_parse_good),
		cmocka_unit_test(test_fault_parse_bad),
		cmocka_unit_test(test_fault_config_off),
		cmocka_unit_test(test_icrc_hardware_vector),
		cmocka_unit_test(test_icrc_ipv6),
		cmocka_unit_test(test_icrc_ipv6_vector),
		cmocka_unit_test(test_flow_cmsg),
		cmocka_unit_test(test_icrc_ipv4_df),
		cmocka_unit_test(test_icrc_identification),
		cmocka_unit_test(test_icrc_any_identification),
		cmocka_unit_test(test_icrc_iovecs),
		cmocka_unit_test(test_icrc_lengths),
		cmocka_unit_test(test_icrc_upper_clean),
		cmocka_unit_test(test_crc32_fold),
		cmocka_unit_test(test_wire_plain),
		cmocka_unit_test(test_wire_dup),
		cmocka_unit_test(test_wire_reorder),
		cmocka_unit_test(test_wire_delay),
		cmocka_unit_test(test_wire_forget),
		cmocka_unit_test(test_wire_drop),
		cmocka_unit_test(test_wire_bad_setting),
		cmocka_unit_test(test_wire_corrupt),
		cmocka_unit_test(test_wire_deterministic),
		cmocka_unit_test(test_wire_threads),
		cmocka_unit_test(test_wire_held_cap),
		cmocka_unit_test(test_wire_dual_stack),
		cmocka_unit_test(test_pcap_file),
		cmocka_unit_test(test_pcap_threads),
		cmocka_unit_test(test_pcap_icrc_check),
		cmocka_unit_test(test_pcap_tshark),
	};
	int ret = cmocka_run_group_tests(tests, NULL, NULL);

	/* Keep the captures of a failed run for a look. */
	if (!ret) {
		snprintf(path, sizeof(path), "rm -rf %s", tmpdir);
		if (system(path))
			ret = 1;
	} else {
		fprintf(stderr, "test_udp_tap: captures kept in %s\n", tmpdir);
	}
	return ret;
}
