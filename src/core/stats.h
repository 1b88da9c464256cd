/* SPDX-License-Identifier: MIT */
/*
 * Packet counters published in a context's shared segment, so that
 * `softverbs status` reads any process's UDP endpoint and QPs without
 * asking it.  The owner writes them (relaxed: they are counters, read
 * alone); a reader maps the segment and loads them.  `on` is stored last
 * (release) when a QP's peer is set, and pairs with the reader's acquire
 * load before it reads the peer.
 */
#ifndef SV_CORE_STATS_H
#define SV_CORE_STATS_H

#include <stdatomic.h>
#include <stdint.h>

/* A context's packet endpoint (engine/pkt.c, transport/udp/udp.c). */
struct sv_pkt_ep_stats {
	_Atomic uint32_t on;		/* 1 while the context's link is open */
	uint16_t port;			/* the UDP port it receives on */
	uint16_t pad;
	_Atomic uint64_t rx_pkts;	/* taken from the wire for this context */
	_Atomic uint64_t rx_bad_icrc, rx_no_owner, rx_forwarded, rx_fwd_in;
	_Atomic uint64_t drop_bad_hdr, drop_unknown_qpn, drop_bad_src;
};

/* A QP whose peer is reached by packets (engine/pkt*.c). */
struct sv_pkt_qp_stats {
	_Atomic uint32_t on;		/* 1 while the peer below is set */
	uint32_t dest_qpn;
	uint8_t peer[16];		/* IPv4-mapped IPv6 address */
	uint16_t sport;			/* the QP's own UDP source port */
	uint16_t pad[3];
	_Atomic uint64_t tx_pkts, rx_pkts, retrans, naks_seq, rnr_naks, dups, drops;
};

#endif
