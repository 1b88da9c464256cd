/* SPDX-License-Identifier: MIT */
/*
 * Every device and port limit softverbs reports, in one place.
 *
 * ibv_query_device, ibv_query_port and every validation in the verbs layer
 * read these names, so a limit changes here and nowhere else.  The values
 * are chosen to look like a real RoCE/IB HCA (rxe's rxe_param.h is the
 * model) while keeping the per-process memory of a maximal resource request
 * bounded: a soft device pays for queue depth in host memory.
 */
#ifndef SV_PARAMS_H
#define SV_PARAMS_H

#include <stdint.h>

#define SV_VERSION_STRING	"0.1.0"
#define SV_FW_VER		"0.1.0"

/* The vendor id rxe reports (RXE_VENDOR_ID): nonzero, as consumers check,
 * and no real vendor's, so perftest classes the device as UNKNOWN and
 * drives it through ibv_post_send, the path every RDMA program can use. */
#define SV_VENDOR_ID		0xffffff
#define SV_VENDOR_PART_ID	0
#define SV_HW_VER		1

#define SV_MAX_DEVICES		8
#define SV_NUM_PORTS		1
#define SV_PORT			1

#define SV_MAX_MR_SIZE		UINT64_MAX	/* nothing is pinned */
#define SV_PAGE_SIZE_CAP	0xfffff000u	/* 4 KiB and every larger page */
#define SV_MAX_QP		16384	/* per context */
#define SV_MAX_QP_WR		16384
#define SV_MAX_SGE		32
#define SV_MAX_SGE_RD		32
#define SV_MAX_INLINE_DATA	256
#define SV_MAX_CQ		16384
#define SV_MAX_CQE		65536
#define SV_MAX_MR		65536
#define SV_MAX_PD		65536
#define SV_MAX_QP_RD_ATOM	128
#define SV_MAX_QP_INIT_RD_ATOM	128
#define SV_MAX_RES_RD_ATOM	(SV_MAX_QP_RD_ATOM * SV_MAX_QP)
#define SV_MAX_AH		65536
#define SV_MAX_SRQ		16384
#define SV_MAX_SRQ_WR		16384
#define SV_MAX_SRQ_SGE		32
/* Tag matching (IBV_SRQT_TM): a list entry's handle keeps its index in
 * 16 bits; the list is scanned under the SRQ's lock per message. */
#define SV_MAX_TM_TAGS		255
#define SV_MAX_TM_OPS		4096
#define SV_MAX_RNDV_HDR		64	/* TMH + RVH + 32 bytes of the sender's own header */
#define SV_MAX_FIN_DUE		16	/* FINs one QP may await a receive WQE for */
/* Send-queue slots of a tag-matching SRQ's RC QP for rendezvous from
 * another host: a READ and its FIN each, for this many at once. */
#define SV_TM_HIDDEN_WQES	(2 * SV_MAX_FIN_DUE)
#define SV_MAX_DM_SIZE		(4u << 20)	/* per allocation; shared segment memory */
#define SV_DM_MAX_LOG_ALIGN	12
#define SV_MAX_PKEYS		1
#define SV_LOCAL_CA_ACK_DELAY	15
#define SV_NUM_COMP_VECTORS	1

#define SV_MAX_MSG_SZ		(1u << 31)	/* 2 GiB */
#define SV_GID_TBL_LEN		16
#define SV_PKEY_TBL_LEN		SV_MAX_PKEYS
#define SV_DEFAULT_PKEY		0xffff
#define SV_MAX_MTU		IBV_MTU_4096
#define SV_QKEY_MASK		0xffffffffu
#define SV_PSN_MASK		0xffffffu
#define SV_QPN_MASK		0xffffffu
#define SV_MCAST_QPN		0xffffffu	/* IBA 9.6.1: the multicast destination QP */

/* Completion timestamps are CLOCK_MONOTONIC nanoseconds: a 1 GHz clock. */
#define SV_HCA_CORE_CLOCK_KHZ	1000000ull

/* A locker of a shared queue's mutex spins this many times (each a CPU
 * pause, about 10-40 ns) before it sleeps in the kernel (or, for a lock
 * only its owner's threads take, yields). */
#define SV_LOCK_SPINS		256

/* A QP's receive queue (and a WQ) has this many slots more than max_recv_wr
 * (max_wr) asks for, and reports the total back, as providers report their
 * rounded sizes.
 * An application that keeps the queue topped up at the size it asked for
 * then never posts into the slot the sender takes next: the post can
 * fetch its next slot early (sv_rq_post()) without taking the line the
 * sender is about to read.  ib_send_lat, which keeps rx_depth posted: see
 * docs/architecture.md section 10. */
#define SV_RQ_SLACK		2

/* Host registry: QPNs are allocated host-wide from a range of
 * SV_HOST_MAX_QP that starts above QP 0 and 1 (the IB special QPs, SMI
 * and GSI), one range for each of SV_QPN_USERS user slots (uid modulo
 * SV_QPN_USERS): sv_qpn_base, core/registry.c. */
#define SV_QPN_BASE		0x11
#define SV_QPN_USERS		255
#define SV_HOST_MAX_QP		65536
#define SV_HOST_MAX_ENDPOINTS	4096
/* The registry's layout version, part of its file name (core/registry.c). */
#define SV_REGISTRY_VERSION	10u
#define SV_HOST_MAX_MCAST_ATTACH 4096	/* (QP, group) attachments */
#define SV_MAX_MCAST_QP_ATTACH	64	/* members one multicast send reaches */
#define SV_HOST_MAX_FLOWS	1024	/* flow steering rules of raw packet QPs */
#define SV_MAX_FLOW_TARGETS	64	/* QPs one raw frame reaches */
#define SV_MAX_RAW_FRAME	9216	/* a jumbo Ethernet frame */
#define SV_MAX_RWQ_IND_LOG	8	/* RSS indirection tables of up to 256 WQs */
#define SV_MAX_RSS_KEY		128

/* IB unicast LIDs are 0x0001..0xbfff (IBA 4.1.3). */
#define SV_LID_MAX_UNICAST	0xbfff

/* The IBTA IB subnet prefix for link-local GIDs. */
#define SV_GID_PREFIX		0xfe80000000000000ull

#endif
