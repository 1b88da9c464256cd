/* SPDX-License-Identifier: MIT */
/*
 * The RoCEv2 invariant CRC (IBA 7.8.1, Annex A17.8), computed as Linux
 * rxe computes it (drivers/infiniband/sw/rxe/rxe_icrc.c), so that our
 * packets pass an rxe or hardware receiver's check and theirs pass ours.
 *
 * The ICRC is a CRC-32 (the Ethernet/gzip polynomial) over the packet as
 * an IB router would leave it unchanged: the fields a hop may rewrite are
 * replaced with ones.  For RoCEv2 (A17.8) that is, in order:
 *   - 8 bytes of ones standing for the LRH RoCEv2 does not carry;
 *   - the IP header with IPv4 TOS, TTL and header checksum, or IPv6
 *     traffic class, flow label and hop limit, all ones;
 *   - the UDP header with its checksum all ones;
 *   - the BTH with its resv8a byte (byte 4, where A17 puts FECN/BECN,
 *     which switches set on the way) all ones;
 *   - the rest: extension headers, payload, pad.
 * rxe starts the kernel's raw crc32_le from 0xdebb20e3, the raw state after
 * the 8 bytes of ones from ~0, and stores ~crc: that is the gzip CRC-32
 * (zlib's crc32(), ISA-L's crc32_gzip_refl(); sv_crc32() here) of
 * the whole masked buffer.  It stores it through a __be32 pointer without
 * conversion, so the wire carries that value little-endian (on x86, which
 * is what every interoperating rxe runs on).
 *
 * We never see the IP and UDP headers the kernel builds for our datagram,
 * so they are rebuilt from the flow.  The IPv4 identification is not
 * masked: 0 is what the kernel gives a DF datagram on an unconnected
 * socket, except in a GSO run (below).  rxe numbers its own
 * (__ip_select_ident), and so does a ConnectX-4 Lx (unit.udp_tap's
 * captured frame); a UDP socket cannot see them, so over IPv4 their
 * packets pass our check only where the receiver solves for the
 * identification (SOFTVERBS_IPV4_ID=any, sv_icrc_check_any).
 */
#define _GNU_SOURCE
#include <string.h>

#include "tap.h"

#define BTH_BYTES	12
#define BTH_RESV8A	4	/* the masked BTH byte: FECN, BECN, reserved */
#define ICRC_BYTES	4
#define MASKED_LRH	8
#define IPV4_HDR	20
#define IPV6_HDR	40
#define UDP_HDR		8
#define PSEUDO_MAX	(MASKED_LRH + IPV6_HDR + UDP_HDR)

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

/*
 * The masked LRH, IP and UDP headers of a packet of len bytes (ICRC not
 * included) into ph; returns their length.  df chooses the IPv4 flag: we
 * always send DF, but a receiver may be given either.
 */
static size_t pseudo_header(const struct sv_flow *f, size_t len, bool df, uint8_t *ph)
{
	size_t udp_len = UDP_HDR + len + ICRC_BYTES;
	uint8_t *ip = ph + MASKED_LRH, *udp;

	memset(ph, 0xff, MASKED_LRH);
	if (f->v4) {
		ip[0] = 0x45;				/* version 4, IHL 5 */
		ip[1] = 0xff;				/* TOS: masked */
		put16(ip + 2, (uint16_t)(IPV4_HDR + udp_len));
		put16(ip + 4, f->ipid);			/* identification */
		put16(ip + 6, df ? 0x4000 : 0);		/* DF, offset 0 */
		ip[8] = 0xff;				/* TTL: masked */
		ip[9] = 17;				/* UDP */
		put16(ip + 10, 0xffff);			/* checksum: masked */
		memcpy(ip + 12, &f->src.s6_addr[12], 4);
		memcpy(ip + 16, &f->dst.s6_addr[12], 4);
		udp = ip + IPV4_HDR;
	} else {
		/* Version 6, then traffic class and flow label: masked. */
		ip[0] = 0x6f;
		ip[1] = ip[2] = ip[3] = 0xff;
		put16(ip + 4, (uint16_t)udp_len);
		ip[6] = 17;				/* next header: UDP */
		ip[7] = 0xff;				/* hop limit: masked */
		memcpy(ip + 8, f->src.s6_addr, 16);
		memcpy(ip + 24, f->dst.s6_addr, 16);
		udp = ip + IPV6_HDR;
	}
	put16(udp, f->sport);
	put16(udp + 2, f->dport);
	put16(udp + 4, (uint16_t)udp_len);
	put16(udp + 6, 0xffff);				/* checksum: masked */
	return (size_t)(udp + UDP_HDR - ph);
}

/*
 * The head of a packet is gathered behind its pseudo-header and the CRC
 * runs once over both: a small packet (an ACK, a SEND of a few bytes)
 * is then one call, where CRCing its pieces in place (the pseudo-header,
 * the BTH up to resv8a, resv8a, the rest) took four.  Measured in a loop
 * on this project's machines, a 24-byte packet: 54 ns in four calls, 23
 * in one.  GATHER bytes cover the headers of every packet that carries
 * little or no payload (an ACK, a READ request, an atomic, a short SEND);
 * a longer packet's rest runs in place, where sv_crc32() folds from 256
 * bytes on.  A head of 192 bytes left the fold less of each
 * packet and the narrower CRC more: sv_icrc() of a 4,124-byte packet took
 * 220 ns against 205 with 64, of a 1,052-byte one 112 against 96, and 24-
 * and 64-byte packets 28-35 ns with either (IPv4, the best of 15 loops of
 * 200,000, on this project's Zen 3 machines).
 */
#define GATHER	64

/* Copies the first len bytes of pkt[0..n), at most max, into out;
 * returns how many. */
static size_t gather(uint8_t *out, size_t max, const struct iovec *pkt, int n, size_t len)
{
	size_t want = len < max ? len : max, off = 0;

	for (int i = 0; i < n && off < want; i++) {
		size_t k = pkt[i].iov_len < want - off ? pkt[i].iov_len : want - off;
		memcpy(out + off, pkt[i].iov_base, k);
		off += k;
	}
	return off;
}

/* Continues crc over bytes from..len of pkt[0..n). */
static uint32_t crc_from(uint32_t crc, const struct iovec *pkt, int n, size_t from, size_t len)
{
	size_t off = 0;

	for (int i = 0; i < n && off < len; i++) {
		size_t l = pkt[i].iov_len < len - off ? pkt[i].iov_len : len - off;
		if (off + l > from) {
			size_t skip = from > off ? from - off : 0;
			crc = sv_crc32(crc, (const uint8_t *)pkt[i].iov_base + skip, l - skip);
		}
		off += l;
	}
	return crc;
}

/*
 * ISA-L's CRC on an AVX-512 machine (crc32_gzip_refl_by16_10, ISA-L 2.30)
 * returns with the vector registers' upper halves dirty: it has no
 * VZEROUPPER.  Every SSE instruction after it then pays for that state
 * until something clears it: measured on this project's machines, a CRC
 * of 4 KiB followed by eight small memsets took 300 ns against 80 with
 * the upper halves cleared, and a sender spent about 5% of its core on
 * the first instruction after each ICRC.  So the upper halves are cleared
 * once the packet's CRC is done (Intel's optimization manual: VZEROUPPER
 * between AVX and SSE code).  Only where AVX exists, as VZEROUPPER is an
 * AVX instruction; it costs about 2 ns, also where ISA-L chose another CRC.
 */
static void clean_upper(void)
{
#if defined(__x86_64__)
	if (__builtin_cpu_supports("avx"))
		__asm__ volatile("vzeroupper" ::: "memory");
#endif
}

static uint32_t icrc(const struct sv_flow *f, const struct iovec *pkt, int n, size_t len, bool df)
{
	uint8_t b[PSEUDO_MAX + GATHER];
	size_t phlen = pseudo_header(f, len, df, b);
	size_t head = gather(b + phlen, GATHER, pkt, n, len);

	if (head > BTH_RESV8A)
		b[phlen + BTH_RESV8A] = 0xff;
	uint32_t crc = sv_crc32(0, b, phlen + head);
	if (head < len)
		crc = crc_from(crc, pkt, n, head, len);
	clean_upper();
	return crc;
}

uint32_t sv_icrc(const struct sv_flow *f, const struct iovec *pkt, int n, size_t len)
{
	return icrc(f, pkt, n, len, true);
}

/*
 * The IPv4 identification.  A UDP socket neither sets nor sees it, and
 * the ICRC covers it.  A datagram of ours leaves with 0 (DF, unconnected
 * socket), but a UDP GSO run (udp.c link_flush) does not stay one
 * datagram on a wire: the kernel's software segmentation numbers the
 * packets it cuts from the super-packet's identification on, 0, 1, 2 ...
 * (inet_gso_segment), and a NIC that segments in its place is meant to
 * write the same.  With every ICRC computed for 0, 502 of 611 frames of an
 * ib_write_bw across the test veth, made to segment in software
 * (gso_max_segs 1), failed icrc_check.py, as they would an rxe's or a
 * NIC's check; softverbs' own check passed them, assuming 0 as the
 * sender had.  So the k-th packet of a run carries the ICRC for
 * identification k, and a receiver, which cannot read the identification,
 * accepts any below SV_ICRC_IDS: a run delivered whole (a veth, UDP_GRO)
 * puts the k-th packet k-th in its datagram, the hint, and packets that
 * the receiver's GRO merged from a wire may start anywhere in a run.
 * That lets a corrupted packet through with probability about 64 in
 * 2^32, not 1 in 2^32.  Accepting every identification, which a
 * receiver of rxe's or a NIC's IPv4 packets needs, makes it 1 in 2^16:
 * only where the user asks for it (sv_icrc_check_any, below).
 *
 * The identification enters the CRC linearly: with the rest fixed,
 * ICRC(id) = ICRC(0) ^ D(id), D being the CRC, with no preset and no
 * final complement, of the two identification bytes followed by the
 * bytes after them as zeros: the two bytes' remainder times x^(8m) mod P,
 * m the bytes after them.  D of each power of two is kept per packet
 * length, per thread: a run's packets share one length.
 */
#define POLY_REFLECTED	0xedb88320u	/* P, bit-reflected: x^0 at bit 31 */
#define ID_BITS		6		/* SV_ICRC_IDS == 1 << ID_BITS */

_Static_assert(SV_ICRC_IDS == 1 << ID_BITS, "one basis value per bit");

/* a * b mod P, both bit-reflected. */
static uint32_t mulmod(uint32_t a, uint32_t b)
{
	uint32_t p = 0;

	for (uint32_t m = 0x80000000u; m; m >>= 1) {
		if (a & m)
			p ^= b;
		b = b >> 1 ^ (b & 1 ? POLY_REFLECTED : 0);
	}
	return p;
}

/* x^(8 * 2^i) mod P, bit-reflected: written once, before main(), and
 * only read. */
static uint32_t x8pow2[32];

__attribute__((constructor)) static void icrc_setup(void)
{
	x8pow2[0] = 0x00800000u;			/* x^8 */
	for (int i = 1; i < 32; i++)
		x8pow2[i] = mulmod(x8pow2[i - 1], x8pow2[i - 1]);
}

/* x^(8n) mod P, bit-reflected; n is a packet's length. */
static uint32_t xpow8(uint32_t n)
{
	uint32_t r = 0x80000000u;			/* x^0 */

	for (int i = 0; n; i++, n >>= 1)
		if (n & 1)
			r = mulmod(r, x8pow2[i]);
	return r;
}

/* The CRC of the identification's two bytes alone, big-endian as on the
 * wire, with no preset and no final complement. */
static uint32_t id_rem(unsigned id)
{
	const uint8_t b[2] = { (uint8_t)(id >> 8), (uint8_t)id };
	uint32_t c = 0;

	for (int i = 0; i < 2; i++) {
		c ^= b[i];
		for (int k = 0; k < 8; k++)
			c = c >> 1 ^ (c & 1 ? POLY_REFLECTED : 0);
	}
	return c;
}

/*
 * Every identification (SOFTVERBS_IPV4_ID=any): D is one-to-one on 16-bit
 * identifications (the two bytes' polynomial, of degree below 16, times
 * x^(32 + 8m), and x is a unit mod P), so D(2^0) ... D(2^15) span a
 * 16-dimensional space of 32-bit differences, and a difference in it is D
 * of exactly one identification.  It is found by elimination: the basis
 * as rows, each free of the leading bits of the rows before it and
 * knowing which identification bits make it, taken in order.  A corrupted
 * packet's difference is in that space with probability 2^16 in 2^32, and
 * so is a single flipped bit's, whose difference depends only on its
 * place: CRC-32 no longer catches every single-bit error, only all but
 * about one place in 2^16.  Only a DF header is solved for, as rxe and
 * NICs send: solving the header without DF as well would double those
 * odds.
 */
#define ANY_BITS	16

/* One packet length's basis: D of each identification bit, and the same
 * reduced for solving, made on first use. */
struct id_basis {
	size_t len;			/* + 1; 0 an empty slot */
	uint32_t d[ANY_BITS];
	bool reduced;
	uint32_t row[ANY_BITS];
	uint16_t bits[ANY_BITS];	/* the identification bits row[i] is D of */
	uint8_t lead[ANY_BITS];		/* row[i]'s leading bit: no later row has it */
};

/* Kept per thread: a run's full packets' length and its last one's, on
 * each side of a few QPs; a miss costs some 30 multiplications. */
#define ID_KEPT		8

static struct id_basis *id_basis(size_t len)
{
	static __thread struct id_basis kept[ID_KEPT];
	static __thread unsigned next;

	for (unsigned i = 0; i < ID_KEPT; i++)
		if (kept[i].len == len + 1)
			return &kept[i];
	struct id_basis *b = &kept[next++ % ID_KEPT];
	/* After the identification: the rest of the IPv4 header, UDP, the
	 * packet. */
	uint32_t x = xpow8((uint32_t)(IPV4_HDR - 6 + UDP_HDR + len));
	for (int i = 0; i < ANY_BITS; i++)
		b->d[i] = mulmod(id_rem(1u << i), x);
	b->reduced = false;
	b->len = len + 1;
	return b;
}

/* D(id) from the basis d of its packet's length. */
static uint32_t id_sum(const uint32_t *d, unsigned id)
{
	uint32_t v = 0;

	for (int i = 0; i < ID_BITS; i++)
		if (id >> i & 1)
			v ^= d[i];
	return v;
}

uint32_t sv_icrc_id(size_t len, unsigned id)
{
	return id_sum(id_basis(len)->d, id);
}

/* The identification whose D is diff, or -1 when none is. */
static int id_solve(struct id_basis *b, uint32_t diff)
{
	unsigned id = 0;

	if (!b->reduced) {
		for (int i = 0; i < ANY_BITS; i++) {
			uint32_t v = b->d[i];
			uint16_t m = (uint16_t)(1u << i);
			for (int j = 0; j < i; j++)
				if (v >> b->lead[j] & 1) {
					v ^= b->row[j];
					m ^= b->bits[j];
				}
			/* v != 0: D is one-to-one. */
			b->row[i] = v;
			b->bits[i] = m;
			b->lead[i] = (uint8_t)(31 - __builtin_clz(v));
		}
		b->reduced = true;
	}
	for (int i = 0; i < ANY_BITS; i++)
		if (diff >> b->lead[i] & 1) {
			diff ^= b->row[i];
			id ^= b->bits[i];
		}
	return diff ? -1 : (int)id;
}

static int check(const struct sv_flow *f, const uint8_t *buf, size_t len, unsigned hint, bool any)
{
	struct iovec iov;
	uint32_t want;

	if (len < BTH_BYTES + ICRC_BYTES)
		return -1;
	len -= ICRC_BYTES;
	want = (uint32_t)buf[len] | (uint32_t)buf[len + 1] << 8 |
	       (uint32_t)buf[len + 2] << 16 | (uint32_t)buf[len + 3] << 24;
	iov = (struct iovec){ .iov_base = (void *)buf, .iov_len = len };
	struct sv_flow f0 = *f;
	f0.ipid = 0;
	uint32_t diff = icrc(&f0, &iov, 1, len, true) ^ want;
	if (!diff)
		return 0;
	if (f->v4) {
		struct id_basis *b = id_basis(len);
		if (hint && hint < SV_ICRC_IDS && id_sum(b->d, hint) == diff)
			return (int)hint;
		if (any) {
			/* Solved for: the solution is unique, 0-63 included. */
			int id = id_solve(b, diff);
			if (id >= 0)
				return id;
		} else {
			/* Those below SV_ICRC_IDS, in Gray code order: one XOR
			 * a step. */
			uint32_t v = 0;
			for (unsigned k = 1; k < SV_ICRC_IDS; k++) {
				v ^= b->d[__builtin_ctz(k)];
				if (v == diff)
					return (int)(k ^ k >> 1);
			}
		}
		/* A sender that lets its datagrams fragment: rare (rxe and we
		 * set DF), so it pays a second pass rather than every packet
		 * paying a crc32_combine. */
		if (icrc(&f0, &iov, 1, len, false) == want)
			return 0;
	}
	return -1;
}

int sv_icrc_check(const struct sv_flow *f, const uint8_t *buf, size_t len, unsigned hint)
{
	return check(f, buf, len, hint, false);
}

int sv_icrc_check_any(const struct sv_flow *f, const uint8_t *buf, size_t len, unsigned hint)
{
	return check(f, buf, len, hint, true);
}
