/* SPDX-License-Identifier: MIT */
/*
 * Names of enum values, the same strings rdma-core prints, and the static
 * rate conversions of IBA 9.11.1 (Table 63).  Tables are indexed by enum
 * value and their lengths are checked against the enums at compile time.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>

#include "../sv.h"

static const char *const node_type_str[] = {
	[IBV_NODE_CA] = "InfiniBand channel adapter", [IBV_NODE_SWITCH] = "InfiniBand switch",
	[IBV_NODE_ROUTER] = "InfiniBand router", [IBV_NODE_RNIC] = "iWARP NIC",
	[IBV_NODE_USNIC] = "usNIC", [IBV_NODE_USNIC_UDP] = "usNIC UDP",
};
_Static_assert(SV_ARRAY_SIZE(node_type_str) == IBV_NODE_USNIC_UDP + 1, "node types");

static const char *const port_state_str[] = {
	[IBV_PORT_NOP] = "no state change (NOP)", [IBV_PORT_DOWN] = "down",
	[IBV_PORT_INIT] = "init", [IBV_PORT_ARMED] = "armed", [IBV_PORT_ACTIVE] = "active",
	[IBV_PORT_ACTIVE_DEFER] = "active defer",
};
_Static_assert(SV_ARRAY_SIZE(port_state_str) == IBV_PORT_ACTIVE_DEFER + 1, "port states");

static const char *const event_type_str[] = {
	[IBV_EVENT_CQ_ERR] = "CQ error",
	[IBV_EVENT_QP_FATAL] = "local work queue catastrophic error",
	[IBV_EVENT_QP_REQ_ERR] = "invalid request local work queue error",
	[IBV_EVENT_QP_ACCESS_ERR] = "local access violation work queue error",
	[IBV_EVENT_COMM_EST] = "communication established",
	[IBV_EVENT_SQ_DRAINED] = "send queue drained",
	[IBV_EVENT_PATH_MIG] = "path migrated",
	[IBV_EVENT_PATH_MIG_ERR] = "path migration request error",
	[IBV_EVENT_DEVICE_FATAL] = "local catastrophic error",
	[IBV_EVENT_PORT_ACTIVE] = "port active",
	[IBV_EVENT_PORT_ERR] = "port error",
	[IBV_EVENT_LID_CHANGE] = "LID change",
	[IBV_EVENT_PKEY_CHANGE] = "P_Key change",
	[IBV_EVENT_SM_CHANGE] = "SM change",
	[IBV_EVENT_SRQ_ERR] = "SRQ catastrophic error",
	[IBV_EVENT_SRQ_LIMIT_REACHED] = "SRQ limit reached",
	[IBV_EVENT_QP_LAST_WQE_REACHED] = "last WQE reached",
	[IBV_EVENT_CLIENT_REREGISTER] = "client reregistration",
	[IBV_EVENT_GID_CHANGE] = "GID table change",
	[IBV_EVENT_WQ_FATAL] = "WQ fatal",
};
_Static_assert(SV_ARRAY_SIZE(event_type_str) == IBV_EVENT_WQ_FATAL + 1, "event types");

#define LOOKUP(table, v) ((unsigned)(v) < SV_ARRAY_SIZE(table) && (table)[v] ? (table)[v] : "unknown")

SV_EXPORT const char *ibv_node_type_str(enum ibv_node_type t) { return LOOKUP(node_type_str, t); }
SV_EXPORT const char *ibv_port_state_str(enum ibv_port_state s) { return LOOKUP(port_state_str, s); }
/* The table is core's: explanations name statuses too. */
SV_EXPORT const char *ibv_wc_status_str(enum ibv_wc_status s) { return sv_wc_status_name(s); }

SV_EXPORT const char *ibv_event_type_str(enum ibv_event_type e)
{
	/* rdma-core answers "unknown" for WQ_FATAL through this function. */
	return e == IBV_EVENT_WQ_FATAL ? "unknown" : LOOKUP(event_type_str, e);
}

/* enum ibv_rate -> multiple of 2.5 Gb/s and Mb/s, IBA Table 63.  The
 * FDR/EDR and later rates are no multiple of 2.5 Gb/s: mult -1. */
static const struct { enum ibv_rate rate; int mult; int mbps; } rates[] = {
	{ IBV_RATE_2_5_GBPS, 1, 2500 }, { IBV_RATE_5_GBPS, 2, 5000 },
	{ IBV_RATE_10_GBPS, 4, 10000 }, { IBV_RATE_20_GBPS, 8, 20000 },
	{ IBV_RATE_30_GBPS, 12, 30000 }, { IBV_RATE_40_GBPS, 16, 40000 },
	{ IBV_RATE_60_GBPS, 24, 60000 }, { IBV_RATE_80_GBPS, 32, 80000 },
	{ IBV_RATE_120_GBPS, 48, 120000 }, { IBV_RATE_14_GBPS, -1, 14062 },
	{ IBV_RATE_56_GBPS, -1, 56250 }, { IBV_RATE_112_GBPS, -1, 112500 },
	{ IBV_RATE_168_GBPS, -1, 168750 }, { IBV_RATE_25_GBPS, -1, 25781 },
	{ IBV_RATE_100_GBPS, -1, 103125 }, { IBV_RATE_200_GBPS, -1, 206250 },
	{ IBV_RATE_300_GBPS, -1, 309375 }, { IBV_RATE_28_GBPS, -1, 28125 },
	{ IBV_RATE_50_GBPS, -1, 53125 }, { IBV_RATE_400_GBPS, -1, 425000 },
	{ IBV_RATE_600_GBPS, -1, 637500 }, { IBV_RATE_800_GBPS, -1, 850000 },
};

SV_EXPORT int ibv_rate_to_mult(enum ibv_rate rate)
{
	for (size_t i = 0; i < SV_ARRAY_SIZE(rates); i++)
		if (rates[i].rate == rate)
			return rates[i].mult;
	return -1;
}

SV_EXPORT enum ibv_rate mult_to_ibv_rate(int mult)
{
	for (size_t i = 0; i < SV_ARRAY_SIZE(rates); i++)
		if (mult > 0 && rates[i].mult == mult)
			return rates[i].rate;
	return IBV_RATE_MAX;
}

SV_EXPORT int ibv_rate_to_mbps(enum ibv_rate rate)
{
	for (size_t i = 0; i < SV_ARRAY_SIZE(rates); i++)
		if (rates[i].rate == rate)
			return rates[i].mbps;
	return -1;
}

SV_EXPORT enum ibv_rate mbps_to_ibv_rate(int mbps)
{
	for (size_t i = 0; i < SV_ARRAY_SIZE(rates); i++)
		if (rates[i].mbps == mbps)
			return rates[i].rate;
	return IBV_RATE_MAX;
}
