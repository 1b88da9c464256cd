/* SPDX-License-Identifier: MIT */
/*
 * The GSI (QP1) between libibverbs.so.1 and librdmacm.so.1: how CM MADs
 * cross hosts.
 *
 * On the wire a CM MAD is what the IBTA and the kernel's ib_cm send: a
 * RoCEv2 UD SEND_ONLY to DestQP 1, with a DETH of Q_Key 0x80010000 and
 * SrcQP 1, carrying one 256-byte MAD (IBA 13.4, chapter 12).  librdmacm
 * formats and parses the MADs (rdmacm/mad.c); libibverbs' packet engine
 * sends them (softverbs_gsi_send) and takes them in (engine/gsi.c).
 *
 * Which process of the receiving host gets a MAD is what the kernel's
 * ib_cm decides with its tables of service IDs and communication IDs.  A
 * host here has no kernel CM, so the same two keys name abstract AF_UNIX
 * datagram sockets of the network namespace:
 *
 *   "softverbs-cm:svc:SERVICE_ID"   a listener (REQ, SIDR_REQ)
 *   "softverbs-cm:comm:ID"          a connection's local communication ID
 *                                   (every other message: its Remote
 *                                   Communication ID, or a SIDR_REP's
 *                                   Request ID)
 *
 * The packet engine of whichever process the kernel gave the packet to
 * sends it on there, as a struct sv_gsi_dgram.  A bind of the name is the
 * claim on the ID, so two processes cannot hold one, and a dead process's
 * names go with its sockets.
 */
#ifndef SV_GSI_H
#define SV_GSI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

#define SV_GSI_QPN	1
#define SV_GSI_QKEY	0x80010000u	/* IBA 10.2.4: the GSI's well-known Q_Key */
#define SV_MAD_SIZE	256
#define SV_MAD_HDR	24		/* the common MAD header, IBA 13.4.2 */
#define SV_MGMT_CLASS_CM 0x07
#define SV_CM_CLASS_VERSION 2

/* CM attribute IDs (IBA table 197) the dispatch looks at. */
enum { SV_CM_ATTR_REQ = 0x0010, SV_CM_ATTR_REJ = 0x0012, SV_CM_ATTR_DREQ = 0x0015,
       SV_CM_ATTR_DREP = 0x0016, SV_CM_ATTR_SIDR_REQ = 0x0017, SV_CM_ATTR_SIDR_REP = 0x0018 };

/* What the engine writes to the name: the MAD and where it came from. */
struct sv_gsi_dgram {
	uint8_t src_gid[16];	/* the sender's address, as a RoCEv2 GID */
	uint8_t dst_gid[16];	/* the address it was sent to */
	uint16_t src_port;	/* its UDP source port */
	uint8_t tclass;
	uint8_t pad[5];
	uint8_t mad[SV_MAD_SIZE];
};
_Static_assert(sizeof(struct sv_gsi_dgram) == 40 + SV_MAD_SIZE, "no holes");

enum sv_gsi_key { SV_GSI_SVC, SV_GSI_COMM };

static inline socklen_t sv_gsi_name(struct sockaddr_un *u, enum sv_gsi_key k, uint64_t id)
{
	int n;

	*u = (struct sockaddr_un){ .sun_family = AF_UNIX };
	if (k == SV_GSI_SVC)
		n = snprintf(u->sun_path + 1, sizeof(u->sun_path) - 1, "softverbs-cm:svc:%016llx",
			     (unsigned long long)id);
	else
		n = snprintf(u->sun_path + 1, sizeof(u->sun_path) - 1, "softverbs-cm:comm:%08x",
			     (unsigned)id);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static inline bool sv_gid_v4(const uint8_t g[16])
{
	return !memcmp(g, "\0\0\0\0\0\0\0\0\0\0\xff\xff", 12);
}

/*
 * The answer to a MAD nobody takes, as ib_cm gives it when it finds no
 * cm_id: REJ reason 8, invalid service ID, for a REQ (cm_req_handler);
 * SIDR_REP status 1, not supported, for a SIDR_REQ (cm_sidr_req_handler);
 * DREP for a DREQ (cm_dreq_handler: the connection is gone already, its
 * DREP was lost, and the peer asks again).  false for anything else.
 * Fields: IBA tables 108, 113 and 120, after the 24-byte MAD header.
 */
static inline bool sv_cm_no_taker(const uint8_t in[SV_MAD_SIZE], uint8_t out[SV_MAD_SIZE])
{
	const uint8_t *i = in + SV_MAD_HDR;
	uint8_t *o = out + SV_MAD_HDR;
	uint16_t attr = (uint16_t)(in[16] << 8 | in[17]);

	memset(out, 0, SV_MAD_SIZE);
	memcpy(out, in, 16);		/* version, class, method, TID; status 0 */
	out[4] = out[5] = out[6] = out[7] = 0;
	switch (attr) {
	case SV_CM_ATTR_REQ:		/* Remote Comm ID: the REQ's; REJected: the REQ */
		out[17] = SV_CM_ATTR_REJ;
		memcpy(o + 4, i, 4);
		o[11] = 8;
		return true;
	case SV_CM_ATTR_DREQ:		/* the two Comm IDs swapped */
		out[17] = SV_CM_ATTR_DREP;
		memcpy(o, i + 4, 4);
		memcpy(o + 4, i, 4);
		return true;
	case SV_CM_ATTR_SIDR_REQ:	/* Request ID, status, Service ID */
		out[17] = SV_CM_ATTR_SIDR_REP;
		memcpy(o, i, 4);
		o[4] = 1;
		memcpy(o + 12, i + 8, 8);
		return true;
	}
	return false;
}

struct ibv_context;
/*
 * Exported by libibverbs.so.1 under SOFTVERBS_PRIVATE_1.
 *
 * softverbs_gsi_open: from now on this process takes RoCEv2 packets for
 * the context's device (it joins the host's port 4791), so that MADs sent
 * to this host reach it.  0, or -1 with errno.
 *
 * softverbs_gsi_send: one MAD from QP1 at sgid (an IPv4-mapped GID of this
 * host) to QP1 at dgid.  0, or -1 with errno (EHOSTUNREACH: no route).
 *
 * softverbs_gsi_will: the same MAD, sent by this process's guard
 * (core/guard.h) once this process has died, unless
 * softverbs_gsi_will_cancel(key) comes first; a later will of the same key
 * replaces it.  0, or -1 with errno.
 */
int softverbs_gsi_open(struct ibv_context *ctx);
int softverbs_gsi_send(struct ibv_context *ctx, const uint8_t sgid[16], const uint8_t dgid[16],
		       uint8_t tclass, const uint8_t mad[SV_MAD_SIZE]);
int softverbs_gsi_will(struct ibv_context *ctx, uint64_t key, const uint8_t sgid[16],
		       const uint8_t dgid[16], uint8_t tclass, const uint8_t mad[SV_MAD_SIZE]);
void softverbs_gsi_will_cancel(uint64_t key);

#endif
