/* SPDX-License-Identifier: MIT */
/*
 * Raw packet QPs: the frame a SEND carries goes to every raw packet QP on
 * the host whose flow rules take it (core/registry.c chooses: the
 * best-priority NORMAL matches, else the defaults, plus sniffers), as a
 * NIC's steering would on one Ethernet segment.  Like UD, nothing comes
 * back: a receiver without a WQE, or a WQ not ready, drops the frame and
 * the SEND still succeeds.  The sending QP never receives its own frame.
 *
 * A QP with receive side scaling has no queue of its own: the Toeplitz
 * hash of the fields it names picks a WQ from its indirection table, and
 * the frame completes in that WQ's CQ with the WQ's number as qp_num
 * (mlx5's behaviour).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>

#include "engine.h"

#define ETH_P_IPV4	0x0800
#define ETH_P_IPV6	0x86dd
#define ETH_P_VLAN	0x8100

/* The headers of a frame, in network byte order as the flow filters
 * hold them.  An absent or truncated layer stays zero. */
static void parse(const uint8_t *f, size_t len, struct sv_pkt_key *k)
{
	memset(k, 0, sizeof(*k));
	if (len < 14)
		return;
	memcpy(k->eth.dst_mac, f, 6);
	memcpy(k->eth.src_mac, f + 6, 6);
	size_t off = 12;
	uint16_t type = (uint16_t)(f[off] << 8 | f[off + 1]);
	if (type == ETH_P_VLAN && len >= 18) {
		memcpy(&k->eth.vlan_tag, f + 14, 2);
		off += 4;
		type = (uint16_t)(f[off] << 8 | f[off + 1]);
	}
	memcpy(&k->eth.ether_type, f + off, 2);
	off += 2;
	size_t l4 = 0;
	uint8_t proto = 0;
	if (type == ETH_P_IPV4 && len >= off + 20) {
		const uint8_t *ip = f + off;
		k->l3 = 4;
		k->ip4.tos = ip[1];
		k->ip4.flags = ip[6] >> 5;
		k->ip4.ttl = ip[8];
		k->ip4.proto = proto = ip[9];
		memcpy(&k->ip4.src_ip, ip + 12, 4);
		memcpy(&k->ip4.dst_ip, ip + 16, 4);
		l4 = off + (size_t)(ip[0] & 0xf) * 4;
	} else if (type == ETH_P_IPV6 && len >= off + 40) {
		const uint8_t *ip = f + off;
		uint32_t vtf;
		k->l3 = 6;
		memcpy(&vtf, ip, 4);
		vtf = ntohl(vtf);
		k->ip6.traffic_class = (uint8_t)(vtf >> 20);
		k->ip6.flow_label = htonl(vtf & 0xfffff);
		k->ip6.next_hdr = proto = ip[6];
		k->ip6.hop_limit = ip[7];
		memcpy(k->ip6.src_ip, ip + 8, 16);
		memcpy(k->ip6.dst_ip, ip + 24, 16);
		l4 = off + 40;
	}
	if ((proto == IPPROTO_TCP || proto == IPPROTO_UDP) && l4 && len >= l4 + 4) {
		k->l4proto = proto;
		memcpy(&k->l4.src_port, f + l4, 2);
		memcpy(&k->l4.dst_port, f + l4 + 2, 2);
	}
}

/* The Toeplitz hash (Microsoft RSS): for each input bit set, XOR in the
 * 32 key bits starting at that bit's position. */
static uint32_t toeplitz(const uint8_t *key, uint32_t klen, const uint8_t *in, size_t n)
{
	uint32_t h = 0, win = 0;
	size_t next = 32;	/* the key bit that shifts into the window next */

	for (uint32_t i = 0; i < 4; i++)
		win = win << 8 | (i < klen ? key[i] : 0);
	for (size_t i = 0; i < n; i++) {
		for (int b = 7; b >= 0; b--, next++) {
			if (in[i] >> b & 1)
				h ^= win;
			uint32_t kb = next / 8 < klen ? key[next / 8] >> (7 - next % 8) & 1 : 0;
			win = win << 1 | kb;
		}
	}
	return h;
}

/* The fields RSS hashes, in the order the Microsoft specification puts
 * them: source address, destination address, source port, destination
 * port. */
static uint32_t rss_hash(const struct shm_rss *r, const struct sv_pkt_key *k)
{
	uint8_t in[36];
	size_t n = 0;

#define PUT(cond, src, len) do { if (cond) { memcpy(in + n, src, len); n += len; } } while (0)
	PUT(k->l3 == 4 && (r->fields & IBV_RX_HASH_SRC_IPV4), &k->ip4.src_ip, 4);
	PUT(k->l3 == 4 && (r->fields & IBV_RX_HASH_DST_IPV4), &k->ip4.dst_ip, 4);
	PUT(k->l3 == 6 && (r->fields & IBV_RX_HASH_SRC_IPV6), k->ip6.src_ip, 16);
	PUT(k->l3 == 6 && (r->fields & IBV_RX_HASH_DST_IPV6), k->ip6.dst_ip, 16);
	bool tcp = k->l4proto == IPPROTO_TCP, udp = k->l4proto == IPPROTO_UDP;
	PUT((tcp && (r->fields & IBV_RX_HASH_SRC_PORT_TCP)) ||
	    (udp && (r->fields & IBV_RX_HASH_SRC_PORT_UDP)), &k->l4.src_port, 2);
	PUT((tcp && (r->fields & IBV_RX_HASH_DST_PORT_TCP)) ||
	    (udp && (r->fields & IBV_RX_HASH_DST_PORT_UDP)), &k->l4.dst_port, 2);
#undef PUT
	return toeplitz(r->key, r->key_len, in, n);
}

/* Where a frame for raw QP qpn goes: its own receive queue in RTR or
 * later, or the WQ its RSS picks when that WQ is ready. */
static bool raw_target(struct sv_qp *qp, uint32_t qpn, const struct sv_pkt_key *k,
		       struct sv_target *t)
{
	if (sv_resp_locate(qp, qpn, t) != SV_R_OK || t->qp->type != IBV_QPT_RAW_PACKET)
		return false;
	if (!t->qp->rss_off)
		return sv_resp_receiving(t->qp);
	const struct shm_rss *r = shm_at(t->seg, t->qp->rss_off);
	t->wq_off = r->wq_off[rss_hash(r, k) & ((1u << r->log_size) - 1)];
	struct shm_wq *wq = shm_at(t->seg, t->wq_off);
	t->rcq_off = wq->cq_off;
	t->wq_num = wq->wq_num;
	return atomic_load_explicit(&wq->wq_state, memory_order_relaxed) == IBV_WQS_RDY;
}

enum sv_result sv_raw_send(struct sv_qp *qp, struct sv_swqe *w, const struct iovec *frame,
			   int n, uint64_t len)
{
	uint32_t qpns[SV_MAX_FLOW_TARGETS];
	uint8_t hdr[128];
	struct sv_pkt_key k;

	if (len > SV_MAX_RAW_FRAME)
		return SV_R_LOC_LEN;
	size_t h = len < sizeof(hdr) ? len : sizeof(hdr);
	size_t got = 0;
	for (int i = 0; i < n && got < h; i++) {
		size_t c = frame[i].iov_len < h - got ? frame[i].iov_len : h - got;
		struct iovec d = { hdr + got, c }, s = { frame[i].iov_base, c };
		sv_copy_iov(&d, 1, &s, 1);	/* the frame may be in GPU memory */
		got += c;
	}
	parse(hdr, h, &k);
	int nt = sv_reg_flow_targets(&k, qp->attr.port_num ? qp->attr.port_num : SV_PORT, qpns,
				     SV_MAX_FLOW_TARGETS);
	for (int i = 0; i < nt; i++) {
		struct sv_target t = { .why = "" };
		if (qpns[i] == qp->ex.qp_base.qp_num || !raw_target(qp, qpns[i], &k, &t))
			continue;
		sv_deliver_recv(qp, w, &t, frame, n, len, true);
	}
	return SV_R_OK;
}
