/* SPDX-License-Identifier: MIT */
/*
 * The QP state transition table of IBA Vol 1 §10.3.1 (Table 91, "QP State
 * Transition Properties") and §11.2.5: for each (current, next) state and
 * QP type, whether the transition exists and which ibv_qp_attr_mask bits
 * it requires and permits.  IBV_QP_STATE itself is always permitted.
 *
 * It is the same table the kernel keeps in ib_modify_qp_is_ok(); every
 * softverbs modify_qp is checked against it before anything changes.
 * XRC_SEND is the kernel's XRC_INI and XRC_RECV its XRC_TGT.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "../sv.h"

enum qpt { T_RC, T_UC, T_UD, T_XRC_SEND, T_XRC_RECV, T_RAW, T_NUM };

static int qpt_index(enum ibv_qp_type t)
{
	switch (t) {
	case IBV_QPT_RC: return T_RC;
	case IBV_QPT_UC: return T_UC;
	case IBV_QPT_UD: return T_UD;
	case IBV_QPT_XRC_SEND: return T_XRC_SEND;
	case IBV_QPT_XRC_RECV: return T_XRC_RECV;
	case IBV_QPT_RAW_PACKET: return T_RAW;
	default: return -1;
	}
}

struct transition {
	bool valid;
	int req[T_NUM];
	int opt[T_NUM];
};

#define S(x) IBV_QPS_##x
#define M(x) IBV_QP_##x

/* Per-type masks shared by several cells. */
#define INIT_REQ_CONN	(M(PKEY_INDEX) | M(PORT) | M(ACCESS_FLAGS))
#define INIT_REQ_UD	(M(PKEY_INDEX) | M(PORT) | M(QKEY))
#define RTR_REQ_UC	(M(AV) | M(PATH_MTU) | M(DEST_QPN) | M(RQ_PSN))
#define RTR_REQ_RC	(RTR_REQ_UC | M(MAX_DEST_RD_ATOMIC) | M(MIN_RNR_TIMER))
#define RTS_REQ_RC	(M(TIMEOUT) | M(RETRY_CNT) | M(RNR_RETRY) | M(SQ_PSN) | M(MAX_QP_RD_ATOMIC))
#define RTS_OPT_UC	(M(CUR_STATE) | M(ALT_PATH) | M(ACCESS_FLAGS) | M(PATH_MIG_STATE))
#define RTS_OPT_RC	(RTS_OPT_UC | M(MIN_RNR_TIMER))
#define UD_OPT_RTS	(M(CUR_STATE) | M(QKEY))

static const struct transition table[IBV_QPS_ERR + 1][IBV_QPS_ERR + 1] = {
	[S(RESET)] = {
		[S(RESET)] = { .valid = true },
		[S(ERR)] = { .valid = true },
		[S(INIT)] = { .valid = true, .req = {
			[T_RC] = INIT_REQ_CONN, [T_UC] = INIT_REQ_CONN, [T_UD] = INIT_REQ_UD,
			[T_XRC_SEND] = INIT_REQ_CONN, [T_XRC_RECV] = INIT_REQ_CONN,
			[T_RAW] = M(PORT) } },
	},
	[S(INIT)] = {
		[S(RESET)] = { .valid = true },
		[S(ERR)] = { .valid = true },
		[S(INIT)] = { .valid = true, .opt = {
			[T_RC] = INIT_REQ_CONN, [T_UC] = INIT_REQ_CONN, [T_UD] = INIT_REQ_UD,
			[T_XRC_SEND] = INIT_REQ_CONN, [T_XRC_RECV] = INIT_REQ_CONN,
			[T_RAW] = M(PORT) } },
		[S(RTR)] = { .valid = true,
			.req = { [T_RC] = RTR_REQ_RC, [T_UC] = RTR_REQ_UC,
				 [T_XRC_SEND] = RTR_REQ_UC, [T_XRC_RECV] = RTR_REQ_RC },
			.opt = { [T_RC] = M(ALT_PATH) | M(ACCESS_FLAGS) | M(PKEY_INDEX),
				 [T_UC] = M(ALT_PATH) | M(ACCESS_FLAGS) | M(PKEY_INDEX),
				 [T_UD] = M(PKEY_INDEX) | M(QKEY),
				 [T_XRC_SEND] = M(ALT_PATH) | M(ACCESS_FLAGS) | M(PKEY_INDEX),
				 [T_XRC_RECV] = M(ALT_PATH) | M(ACCESS_FLAGS) | M(PKEY_INDEX) } },
	},
	[S(RTR)] = {
		[S(RESET)] = { .valid = true },
		[S(ERR)] = { .valid = true },
		[S(RTS)] = { .valid = true,
			.req = { [T_RC] = RTS_REQ_RC, [T_UC] = M(SQ_PSN), [T_UD] = M(SQ_PSN),
				 [T_XRC_SEND] = RTS_REQ_RC, [T_XRC_RECV] = M(TIMEOUT) | M(SQ_PSN) },
			.opt = { [T_RC] = RTS_OPT_RC, [T_UC] = RTS_OPT_UC, [T_UD] = UD_OPT_RTS,
				 [T_XRC_SEND] = RTS_OPT_UC, [T_XRC_RECV] = RTS_OPT_RC } },
	},
	[S(RTS)] = {
		[S(RESET)] = { .valid = true },
		[S(ERR)] = { .valid = true },
		[S(RTS)] = { .valid = true,
			.opt = { [T_RC] = RTS_OPT_RC, [T_UC] = RTS_OPT_UC, [T_UD] = UD_OPT_RTS,
				 [T_XRC_SEND] = RTS_OPT_UC, [T_XRC_RECV] = RTS_OPT_RC } },
		[S(SQD)] = { .valid = true,
			.opt = { [T_RC] = M(EN_SQD_ASYNC_NOTIFY), [T_UC] = M(EN_SQD_ASYNC_NOTIFY),
				 [T_UD] = M(EN_SQD_ASYNC_NOTIFY), [T_XRC_SEND] = M(EN_SQD_ASYNC_NOTIFY),
				 [T_XRC_RECV] = M(EN_SQD_ASYNC_NOTIFY) } },
	},
	[S(SQD)] = {
		[S(RESET)] = { .valid = true },
		[S(ERR)] = { .valid = true },
		[S(RTS)] = { .valid = true,
			.opt = { [T_RC] = RTS_OPT_RC, [T_UC] = RTS_OPT_UC, [T_UD] = UD_OPT_RTS,
				 [T_XRC_SEND] = RTS_OPT_UC, [T_XRC_RECV] = RTS_OPT_RC } },
		[S(SQD)] = { .valid = true,
			.opt = {
				[T_RC] = M(PORT) | M(AV) | M(TIMEOUT) | M(RETRY_CNT) | M(RNR_RETRY) |
					 M(MAX_QP_RD_ATOMIC) | M(MAX_DEST_RD_ATOMIC) | M(ALT_PATH) |
					 M(ACCESS_FLAGS) | M(PKEY_INDEX) | M(MIN_RNR_TIMER) |
					 M(PATH_MIG_STATE),
				[T_UC] = M(AV) | M(ALT_PATH) | M(ACCESS_FLAGS) | M(PKEY_INDEX) |
					 M(PATH_MIG_STATE),
				[T_UD] = M(PKEY_INDEX) | M(QKEY),
				[T_XRC_SEND] = M(PORT) | M(AV) | M(TIMEOUT) | M(RETRY_CNT) |
					 M(RNR_RETRY) | M(MAX_QP_RD_ATOMIC) | M(ALT_PATH) |
					 M(ACCESS_FLAGS) | M(PKEY_INDEX) | M(PATH_MIG_STATE),
				[T_XRC_RECV] = M(PORT) | M(AV) | M(TIMEOUT) | M(MAX_DEST_RD_ATOMIC) |
					 M(ALT_PATH) | M(ACCESS_FLAGS) | M(PKEY_INDEX) |
					 M(MIN_RNR_TIMER) | M(PATH_MIG_STATE) } },
	},
	/* SQE (IBA 10.3.1.6) exists for UC and UD only: an RC send error
	 * takes the whole QP to ERR. */
	[S(SQE)] = {
		[S(RESET)] = { .valid = true },
		[S(ERR)] = { .valid = true },
		[S(RTS)] = { .valid = true,
			.opt = { [T_UC] = M(CUR_STATE) | M(ACCESS_FLAGS), [T_UD] = UD_OPT_RTS } },
	},
	[S(ERR)] = {
		[S(RESET)] = { .valid = true },
		[S(ERR)] = { .valid = true },
	},
};

#undef S
#undef M

static bool state_ok(enum ibv_qp_state s)
{
	return (unsigned)s <= IBV_QPS_ERR;
}

/* SQE -> RTS does not exist for connected types, although the row has
 * a valid bit: that cell is only meaningful for UC and UD. */
static bool cell_valid(int t, enum ibv_qp_state cur, enum ibv_qp_state next)
{
	if (!table[cur][next].valid)
		return false;
	if (cur == IBV_QPS_SQE && next == IBV_QPS_RTS)
		return t == T_UC || t == T_UD;
	return true;
}

int sv_qp_transition_check(enum ibv_qp_type type, enum ibv_qp_state cur,
			   enum ibv_qp_state next, int mask,
			   struct sv_qp_transition_error *why)
{
	int t = qpt_index(type);

	memset(why, 0, sizeof(*why));
	if (t < 0 || !state_ok(cur) || !state_ok(next) || !cell_valid(t, cur, next)) {
		why->illegal = true;
		return EINVAL;
	}
	const struct transition *tr = &table[cur][next];
	why->required = tr->req[t];
	why->optional = tr->opt[t];
	why->missing = tr->req[t] & ~mask;
	why->extra = mask & ~(tr->req[t] | tr->opt[t] | IBV_QP_STATE);
	return why->missing || why->extra ? EINVAL : 0;
}

int sv_qp_required_mask(enum ibv_qp_type type, enum ibv_qp_state cur,
			enum ibv_qp_state next)
{
	int t = qpt_index(type);

	if (t < 0 || !state_ok(cur) || !state_ok(next) || !cell_valid(t, cur, next))
		return -1;
	return table[cur][next].req[t] | IBV_QP_STATE;
}

int sv_qp_next_hop(enum ibv_qp_type type, enum ibv_qp_state cur, enum ibv_qp_state goal)
{
	int t = qpt_index(type), prev[IBV_QPS_ERR + 1], queue[IBV_QPS_ERR + 1];
	int head = 0, tail = 0;

	if (t < 0 || !state_ok(cur) || !state_ok(goal))
		return -1;
	for (int i = 0; i <= IBV_QPS_ERR; i++)
		prev[i] = -2;
	prev[cur] = -1;
	queue[tail++] = cur;
	/* Breadth-first over the table: at most 7 states. */
	while (head < tail) {
		int s = queue[head++];

		for (int n = 0; n <= IBV_QPS_ERR; n++) {
			if (prev[n] != -2 || !cell_valid(t, s, n))
				continue;
			prev[n] = s;
			queue[tail++] = n;
		}
	}
	if (prev[goal] == -2 || goal == cur)
		return -1;
	int hop = goal;
	while (prev[hop] != (int)cur)
		hop = prev[hop];
	return hop;
}

#define QP_STATES(X) X(RESET) X(INIT) X(RTR) X(RTS) X(SQD) X(SQE) X(ERR) X(UNKNOWN)
#define NAME(s) [IBV_QPS_##s] = #s,
static const char *const state_names[] = { QP_STATES(NAME) };
#undef NAME
_Static_assert(SV_ARRAY_SIZE(state_names) == IBV_QPS_UNKNOWN + 1, "state names");

const char *sv_qp_state_name(enum ibv_qp_state s)
{
	return (unsigned)s < SV_ARRAY_SIZE(state_names) ? state_names[s] : "?";
}

const char *sv_qp_type_name(enum ibv_qp_type t)
{
	if ((unsigned)t == SHM_TYPE_XSRQ)	/* registry entries of XRC SRQs */
		return "XRC_SRQ";
	switch (t) {
	case IBV_QPT_RC: return "RC";
	case IBV_QPT_UC: return "UC";
	case IBV_QPT_UD: return "UD";
	case IBV_QPT_RAW_PACKET: return "RAW_PACKET";
	case IBV_QPT_XRC_SEND: return "XRC_SEND";
	case IBV_QPT_XRC_RECV: return "XRC_RECV";
	case IBV_QPT_DRIVER: return "DRIVER";
	default: return "?";
	}
}

#define QP_ATTR_BITS(X) X(STATE) X(CUR_STATE) X(EN_SQD_ASYNC_NOTIFY) X(ACCESS_FLAGS) \
	X(PKEY_INDEX) X(PORT) X(QKEY) X(AV) X(PATH_MTU) X(TIMEOUT) X(RETRY_CNT) \
	X(RNR_RETRY) X(RQ_PSN) X(MAX_QP_RD_ATOMIC) X(ALT_PATH) X(MIN_RNR_TIMER) \
	X(SQ_PSN) X(MAX_DEST_RD_ATOMIC) X(PATH_MIG_STATE) X(CAP) X(DEST_QPN) \
	X(RATE_LIMIT)
#define BIT(b) { IBV_QP_##b, "IBV_QP_" #b },
static const struct { int bit; const char *name; } mask_names[] = { QP_ATTR_BITS(BIT) };
#undef BIT

const char *sv_qp_mask_str(int mask, char *buf, size_t len)
{
	size_t n = 0;

	buf[0] = 0;
	for (size_t i = 0; i < SV_ARRAY_SIZE(mask_names) && n < len; i++) {
		if (!(mask & mask_names[i].bit))
			continue;
		n += (size_t)snprintf(buf + n, len - n, "%s%s", n ? "|" : "", mask_names[i].name);
		mask &= ~mask_names[i].bit;
	}
	if (mask && n < len)
		snprintf(buf + n, len - n, "%sunknown bits 0x%x", n ? "|" : "", (unsigned)mask);
	if (!buf[0])
		snprintf(buf, len, "no attribute bits");
	return buf;
}
