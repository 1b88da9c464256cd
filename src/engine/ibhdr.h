/* SPDX-License-Identifier: MIT */
/*
 * The InfiniBand transport headers a RoCEv2 packet carries after its UDP
 * header (IBA 9.2-9.3, Annex A17): BTH, then the extension headers its
 * opcode names, the payload, pad to 4 bytes, and the ICRC (added by the
 * link, transport/udp).  Structs are wire images; byte order is converted
 * only in the accessors below.
 */
#ifndef SV_IBHDR_H
#define SV_IBHDR_H

#include <endian.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define SV_ROCE_PORT	4791	/* IANA, RoCEv2 (Annex A17.2.1) */

struct ib_bth {
	uint8_t opcode;
	uint8_t flags;		/* SE:1 M:1 PadCnt:2 TVer:4 */
	uint16_t pkey;
	uint32_t qpn;		/* resv8a (FECN, BECN) : DestQP 24 */
	uint32_t apsn;		/* AckReq:1 resv7 : PSN 24 */
} __attribute__((packed));
_Static_assert(sizeof(struct ib_bth) == 12, "BTH is 12 bytes (IBA 9.2)");

struct ib_reth {
	uint64_t va;
	uint32_t rkey;
	uint32_t len;
} __attribute__((packed));
_Static_assert(sizeof(struct ib_reth) == 16, "RETH is 16 bytes (IBA 9.3.3)");

struct ib_atmeth {
	uint64_t va;
	uint32_t rkey;
	uint64_t swap_add;
	uint64_t compare;
} __attribute__((packed));
_Static_assert(sizeof(struct ib_atmeth) == 28, "AtomicETH is 28 bytes (IBA 9.3.4)");

struct ib_aeth {
	uint32_t smsn;		/* syndrome 8 : MSN 24 */
} __attribute__((packed));
_Static_assert(sizeof(struct ib_aeth) == 4, "AETH is 4 bytes (IBA 9.3.5)");

struct ib_atmack {
	uint64_t orig;
} __attribute__((packed));
_Static_assert(sizeof(struct ib_atmack) == 8, "AtomicAckETH is 8 bytes (IBA 9.3.6)");

struct ib_deth {
	uint32_t qkey;
	uint32_t sqp;		/* resv8 : SrcQP 24 */
} __attribute__((packed));
_Static_assert(sizeof(struct ib_deth) == 8, "DETH is 8 bytes (IBA 9.3.2)");

struct ib_xrceth {
	uint32_t srqn;		/* resv8 : XRCSRQ 24 */
} __attribute__((packed));
_Static_assert(sizeof(struct ib_xrceth) == 4, "XRCETH is 4 bytes (IBA 9.3.8)");

/* ImmDt and IETH are one big-endian word each, carried as posted. */

/* Opcode = transport (top 3 bits) | operation (low 5 bits), IBA Table 35. */
enum {
	IB_TR_RC = 0x00, IB_TR_UC = 0x20, IB_TR_RD = 0x40, IB_TR_UD = 0x60,
	IB_TR_CNP = 0x80, IB_TR_XRC = 0xa0,
};
#define IB_OPS(X)							\
	X(SEND_FIRST,			0x00)				\
	X(SEND_MIDDLE,			0x01)				\
	X(SEND_LAST,			0x02)				\
	X(SEND_LAST_IMM,		0x03)				\
	X(SEND_ONLY,			0x04)				\
	X(SEND_ONLY_IMM,		0x05)				\
	X(WRITE_FIRST,			0x06)				\
	X(WRITE_MIDDLE,			0x07)				\
	X(WRITE_LAST,			0x08)				\
	X(WRITE_LAST_IMM,		0x09)				\
	X(WRITE_ONLY,			0x0a)				\
	X(WRITE_ONLY_IMM,		0x0b)				\
	X(READ_REQ,			0x0c)				\
	X(READ_RESP_FIRST,		0x0d)				\
	X(READ_RESP_MIDDLE,		0x0e)				\
	X(READ_RESP_LAST,		0x0f)				\
	X(READ_RESP_ONLY,		0x10)				\
	X(ACK,				0x11)				\
	X(ATOMIC_ACK,			0x12)				\
	X(CMP_SWAP,			0x13)				\
	X(FETCH_ADD,			0x14)				\
	X(SEND_LAST_INV,		0x16)				\
	X(SEND_ONLY_INV,		0x17)				\
	X(ATOMIC_WRITE,			0x1d)	/* IBA 1.5 A19; FLUSH is 0x1c */
#define IB_OP_ENUM(name, v) IB_OP_##name = v,
enum ib_op { IB_OPS(IB_OP_ENUM) IB_OP_COUNT = 0x20 };
#undef IB_OP_ENUM

/* What an operation carries and where it sits in a message. */
enum {
	IBH_RETH = 1 << 0, IBH_ATMETH = 1 << 1, IBH_AETH = 1 << 2, IBH_ATMACK = 1 << 3,
	IBH_IMM = 1 << 4, IBH_IETH = 1 << 5, IBH_PAYLOAD = 1 << 6,
	IBH_FIRST = 1 << 7, IBH_MIDDLE = 1 << 8, IBH_LAST = 1 << 9,	/* ONLY = FIRST|LAST */
	IBH_SEND = 1 << 10, IBH_WRITE = 1 << 11, IBH_READ = 1 << 12, IBH_ATOMIC = 1 << 13,
	IBH_RESP = 1 << 14,		/* from a responder: ACK, read response, atomic ACK */
	IBH_RECV = 1 << 15,		/* consumes a receive WQE (at its last packet) */
	IBH_WORD = 1 << 16,		/* atomic write: one 8-byte store */
};

struct ib_opinfo {
	const char *name;
	uint32_t flags;
	uint8_t types;		/* transports it exists in: bits of 1 << (tr >> 5) */
};
#define IBT(tr) (1u << ((tr) >> 5))
#define IBT_RC  IBT(IB_TR_RC)
#define IBT_UC  IBT(IB_TR_UC)
#define IBT_UD  IBT(IB_TR_UD)
#define IBT_XRC IBT(IB_TR_XRC)

extern const struct ib_opinfo ib_opinfo[IB_OP_COUNT];

/* Bytes of the headers after BTH for opcode op in transport tr. */
unsigned ib_hdr_len(uint8_t opcode);
const char *ib_opcode_name(uint8_t opcode);

/* ---- accessors ---- */
static inline unsigned bth_op(const struct ib_bth *b) { return b->opcode & 0x1f; }
static inline unsigned bth_tr(const struct ib_bth *b) { return b->opcode & 0xe0; }
static inline uint32_t bth_qpn(const struct ib_bth *b) { return be32toh(b->qpn) & 0xffffff; }
static inline uint32_t bth_psn(const struct ib_bth *b) { return be32toh(b->apsn) & 0xffffff; }
static inline bool bth_ackreq(const struct ib_bth *b) { return be32toh(b->apsn) >> 31; }
static inline unsigned bth_pad(const struct ib_bth *b) { return (b->flags >> 4) & 3; }
static inline bool bth_se(const struct ib_bth *b) { return b->flags >> 7; }
static inline unsigned bth_tver(const struct ib_bth *b) { return b->flags & 0xf; }

static inline void bth_set(struct ib_bth *b, uint8_t opcode, bool se, unsigned pad,
			   uint16_t pkey, uint32_t qpn, bool ackreq, uint32_t psn)
{
	b->opcode = opcode;
	b->flags = (uint8_t)((se ? 0x80 : 0) | (pad & 3) << 4);	/* M = 0, TVer = 0 */
	b->pkey = htobe16(pkey);
	b->qpn = htobe32(qpn & 0xffffff);
	b->apsn = htobe32((ackreq ? 1u << 31 : 0) | (psn & 0xffffff));
}

/* AETH syndromes (IBA 9.3.5, Table 42). */
enum { AETH_ACK = 0x00, AETH_RNR = 0x20, AETH_NAK = 0x60 };
enum { NAK_PSN_SEQ = 0, NAK_INV_REQ = 1, NAK_REM_ACCESS = 2, NAK_REM_OP = 3 };
#define AETH_CREDITS_INVALID	0x1f	/* end-to-end credits not used */

static inline uint8_t aeth_syn(const struct ib_aeth *a) { return (uint8_t)(be32toh(a->smsn) >> 24); }
static inline uint32_t aeth_msn(const struct ib_aeth *a) { return be32toh(a->smsn) & 0xffffff; }
static inline void aeth_set(struct ib_aeth *a, uint8_t syn, uint32_t msn)
{
	a->smsn = htobe32((uint32_t)syn << 24 | (msn & 0xffffff));
}

static inline uint32_t deth_sqp(const struct ib_deth *d) { return be32toh(d->sqp) & 0xffffff; }

/*
 * PSNs are 24-bit and wrap (IBA 9.7.1): a - b as a signed 24-bit
 * distance, so that "a is later than b" is psn_compare(a, b) > 0 for
 * any two PSNs less than 2^23 apart.
 */
static inline int32_t psn_compare(uint32_t a, uint32_t b)
{
	return (int32_t)((a - b) << 8) >> 8;
}
static inline uint32_t psn_add(uint32_t a, uint32_t n) { return (a + n) & 0xffffff; }

/* Unaligned big-endian fields of packed headers. */
static inline uint64_t ib_get64(const void *p) { uint64_t v; memcpy(&v, p, 8); return be64toh(v); }
static inline uint32_t ib_get32(const void *p) { uint32_t v; memcpy(&v, p, 4); return be32toh(v); }
static inline void ib_put64(void *p, uint64_t v) { v = htobe64(v); memcpy(p, &v, 8); }
static inline void ib_put32(void *p, uint32_t v) { v = htobe32(v); memcpy(p, &v, 4); }

#endif
