/* SPDX-License-Identifier: MIT */
/*
 * Every cell of the QP state transition table, for RC, UC and UD.
 *
 * The expectation below is IBA Vol 1 Table 91 restated as text, in a shape
 * unrelated to the library's table, so a wrong cell in either one fails.
 * Two layers are checked: the table function itself (all seven states,
 * SQE included) and ibv_modify_qp() on live QPs driven into each state
 * the API can reach, with state and attributes verified afterwards.
 */
#include <stdio.h>

#include "helpers.h"
#include "sv.h"

struct cell {
	const char *types, *from, *to, *req, *opt;
};

static const struct cell spec[] = {
	{ "RC UC UD", "RESET", "RESET", "", "" },
	{ "RC UC UD", "RESET", "ERR", "", "" },
	{ "RC UC", "RESET", "INIT", "PKEY_INDEX PORT ACCESS_FLAGS", "" },
	{ "UD", "RESET", "INIT", "PKEY_INDEX PORT QKEY", "" },
	{ "RC UC UD", "INIT", "RESET", "", "" },
	{ "RC UC UD", "INIT", "ERR", "", "" },
	{ "RC UC", "INIT", "INIT", "", "PKEY_INDEX PORT ACCESS_FLAGS" },
	{ "UD", "INIT", "INIT", "", "PKEY_INDEX PORT QKEY" },
	{ "RC", "INIT", "RTR", "AV PATH_MTU DEST_QPN RQ_PSN MAX_DEST_RD_ATOMIC MIN_RNR_TIMER",
	  "ALT_PATH ACCESS_FLAGS PKEY_INDEX" },
	{ "UC", "INIT", "RTR", "AV PATH_MTU DEST_QPN RQ_PSN", "ALT_PATH ACCESS_FLAGS PKEY_INDEX" },
	{ "UD", "INIT", "RTR", "", "PKEY_INDEX QKEY" },
	{ "RC UC UD", "RTR", "RESET", "", "" },
	{ "RC UC UD", "RTR", "ERR", "", "" },
	{ "RC", "RTR", "RTS", "TIMEOUT RETRY_CNT RNR_RETRY SQ_PSN MAX_QP_RD_ATOMIC",
	  "CUR_STATE ALT_PATH ACCESS_FLAGS MIN_RNR_TIMER PATH_MIG_STATE" },
	{ "UC", "RTR", "RTS", "SQ_PSN", "CUR_STATE ALT_PATH ACCESS_FLAGS PATH_MIG_STATE" },
	{ "UD", "RTR", "RTS", "SQ_PSN", "CUR_STATE QKEY" },
	{ "RC UC UD", "RTS", "RESET", "", "" },
	{ "RC UC UD", "RTS", "ERR", "", "" },
	{ "RC", "RTS", "RTS", "", "CUR_STATE ACCESS_FLAGS ALT_PATH PATH_MIG_STATE MIN_RNR_TIMER" },
	{ "UC", "RTS", "RTS", "", "CUR_STATE ACCESS_FLAGS ALT_PATH PATH_MIG_STATE" },
	{ "UD", "RTS", "RTS", "", "CUR_STATE QKEY" },
	{ "RC UC UD", "RTS", "SQD", "", "EN_SQD_ASYNC_NOTIFY" },
	{ "RC UC UD", "SQD", "RESET", "", "" },
	{ "RC UC UD", "SQD", "ERR", "", "" },
	{ "RC", "SQD", "RTS", "", "CUR_STATE ALT_PATH ACCESS_FLAGS MIN_RNR_TIMER PATH_MIG_STATE" },
	{ "UC", "SQD", "RTS", "", "CUR_STATE ALT_PATH ACCESS_FLAGS PATH_MIG_STATE" },
	{ "UD", "SQD", "RTS", "", "CUR_STATE QKEY" },
	{ "RC", "SQD", "SQD", "", "PORT AV TIMEOUT RETRY_CNT RNR_RETRY MAX_QP_RD_ATOMIC "
	  "MAX_DEST_RD_ATOMIC ALT_PATH ACCESS_FLAGS PKEY_INDEX MIN_RNR_TIMER PATH_MIG_STATE" },
	{ "UC", "SQD", "SQD", "", "AV ALT_PATH ACCESS_FLAGS PKEY_INDEX PATH_MIG_STATE" },
	{ "UD", "SQD", "SQD", "", "PKEY_INDEX QKEY" },
	{ "RC UC UD", "SQE", "RESET", "", "" },
	{ "RC UC UD", "SQE", "ERR", "", "" },
	{ "UC", "SQE", "RTS", "", "CUR_STATE ACCESS_FLAGS" },
	{ "UD", "SQE", "RTS", "", "CUR_STATE QKEY" },
	{ "RC UC UD", "ERR", "RESET", "", "" },
	{ "RC UC UD", "ERR", "ERR", "", "" },
};

static const struct { const char *name; int bit; } bits[] = {
	{ "CUR_STATE", IBV_QP_CUR_STATE }, { "EN_SQD_ASYNC_NOTIFY", IBV_QP_EN_SQD_ASYNC_NOTIFY },
	{ "ACCESS_FLAGS", IBV_QP_ACCESS_FLAGS }, { "PKEY_INDEX", IBV_QP_PKEY_INDEX },
	{ "PORT", IBV_QP_PORT }, { "QKEY", IBV_QP_QKEY }, { "AV", IBV_QP_AV },
	{ "PATH_MTU", IBV_QP_PATH_MTU }, { "TIMEOUT", IBV_QP_TIMEOUT },
	{ "RETRY_CNT", IBV_QP_RETRY_CNT }, { "RNR_RETRY", IBV_QP_RNR_RETRY },
	{ "RQ_PSN", IBV_QP_RQ_PSN }, { "MAX_QP_RD_ATOMIC", IBV_QP_MAX_QP_RD_ATOMIC },
	{ "ALT_PATH", IBV_QP_ALT_PATH }, { "MIN_RNR_TIMER", IBV_QP_MIN_RNR_TIMER },
	{ "SQ_PSN", IBV_QP_SQ_PSN }, { "MAX_DEST_RD_ATOMIC", IBV_QP_MAX_DEST_RD_ATOMIC },
	{ "PATH_MIG_STATE", IBV_QP_PATH_MIG_STATE }, { "CAP", IBV_QP_CAP },
	{ "DEST_QPN", IBV_QP_DEST_QPN }, { "RATE_LIMIT", IBV_QP_RATE_LIMIT },
};

static const char *const state_names[] = { "RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR" };
static const struct { const char *name; enum ibv_qp_type type; } types[] = {
	{ "RC", IBV_QPT_RC }, { "UC", IBV_QPT_UC }, { "UD", IBV_QPT_UD },
};

static int parse_mask(const char *s)
{
	int mask = 0;
	char buf[512], *save, *tok;

	snprintf(buf, sizeof(buf), "%s", s);
	for (tok = strtok_r(buf, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
		size_t i;
		for (i = 0; i < sizeof(bits) / sizeof(bits[0]); i++)
			if (!strcmp(tok, bits[i].name))
				break;
		assert_true(i < sizeof(bits) / sizeof(bits[0]));
		mask |= bits[i].bit;
	}
	return mask;
}

static bool has_word(const char *list, const char *w)
{
	size_t n = strlen(w);
	for (const char *p = strstr(list, w); p; p = strstr(p + 1, w))
		if ((p == list || p[-1] == ' ') && (p[n] == 0 || p[n] == ' '))
			return true;
	return false;
}

/* The spec's cell for (type, from, to), or NULL when illegal. */
static const struct cell *lookup(const char *type, int from, int to)
{
	for (size_t i = 0; i < sizeof(spec) / sizeof(spec[0]); i++)
		if (has_word(spec[i].types, type) && !strcmp(spec[i].from, state_names[from]) &&
		    !strcmp(spec[i].to, state_names[to]))
			return &spec[i];
	return NULL;
}

static void test_table_every_cell(void **state)
{
	(void)state;
	int checked = 0;

	for (size_t t = 0; t < 3; t++) {
		for (int from = 0; from <= IBV_QPS_ERR; from++) {
			for (int to = 0; to <= IBV_QPS_ERR; to++) {
				const struct cell *c = lookup(types[t].name, from, to);
				struct sv_qp_transition_error w;
				int rc;

				if (!c) {
					/* Illegal with any mask at all. */
					for (size_t b = 0; b < sizeof(bits) / sizeof(bits[0]); b++) {
						rc = sv_qp_transition_check(types[t].type, from, to,
									    IBV_QP_STATE | bits[b].bit, &w);
						assert_int_equal(rc, EINVAL);
						assert_true(w.illegal);
					}
					assert_int_equal(sv_qp_transition_check(types[t].type, from, to,
										IBV_QP_STATE, &w), EINVAL);
					checked++;
					continue;
				}
				int req = parse_mask(c->req), opt = parse_mask(c->opt);
				assert_int_equal(sv_qp_transition_check(types[t].type, from, to,
									IBV_QP_STATE | req, &w), 0);
				assert_int_equal(sv_qp_transition_check(types[t].type, from, to,
									IBV_QP_STATE | req | opt, &w), 0);
				for (size_t b = 0; b < sizeof(bits) / sizeof(bits[0]); b++) {
					int bit = bits[b].bit;
					if (req & bit) {
						rc = sv_qp_transition_check(types[t].type, from, to,
									    IBV_QP_STATE | (req & ~bit), &w);
						assert_int_equal(rc, EINVAL);
						assert_int_equal(w.missing, bit);
					} else if (!(opt & bit)) {
						rc = sv_qp_transition_check(types[t].type, from, to,
									    IBV_QP_STATE | req | bit, &w);
						assert_int_equal(rc, EINVAL);
						assert_int_equal(w.extra, bit);
					}
				}
				checked++;
			}
		}
	}
	assert_int_equal(checked, 3 * 7 * 7);
}

/* Drives a fresh QP from RESET to `to` along the legal path. */
static void drive(struct fix *f, struct ibv_qp *qp, enum ibv_qp_state to)
{
	static const enum ibv_qp_state path[] = { IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_SQD };
	struct ibv_qp_attr a;
	const char *type = qp->qp_type == IBV_QPT_RC ? "RC" : qp->qp_type == IBV_QPT_UC ? "UC" : "UD";

	if (to == IBV_QPS_RESET)
		return;
	if (to == IBV_QPS_ERR) {
		fix_valid_attr(f, qp, &a);
		a.qp_state = IBV_QPS_ERR;
		assert_int_equal(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);
		return;
	}
	for (size_t i = 0; i < 4; i++) {
		const struct cell *c = lookup(type, qp->state, path[i]);
		fix_valid_attr(f, qp, &a);
		a.qp_state = path[i];
		assert_non_null(c);
		assert_int_equal(ibv_modify_qp(qp, &a, IBV_QP_STATE | parse_mask(c->req)), 0);
		assert_int_equal(qp->state, path[i]);
		if (path[i] == to)
			return;
	}
}

static void test_modify_qp_every_reachable_cell(void **state)
{
	struct fix *f = *state;
	static const enum ibv_qp_state reachable[] = {
		IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_SQD, IBV_QPS_ERR,
	};
	int cells = 0;

	for (size_t t = 0; t < 3; t++) {
		for (size_t r = 0; r < sizeof(reachable) / sizeof(reachable[0]); r++) {
			for (int to = 0; to <= IBV_QPS_ERR; to++) {
				enum ibv_qp_state from = reachable[r];
				struct ibv_qp *qp = fix_qp(f, types[t].type);
				const struct cell *c = lookup(types[t].name, from, to);
				struct ibv_qp_attr a, q;
				struct ibv_qp_init_attr qi;

				drive(f, qp, from);
				fix_valid_attr(f, qp, &a);
				a.qp_state = to;
				a.cur_qp_state = from;
				if (!c) {
					assert_int_equal(ibv_modify_qp(qp, &a, IBV_QP_STATE), EINVAL);
					assert_int_equal(qp->state, from);
				} else {
					int req = parse_mask(c->req), opt = parse_mask(c->opt);
					/* Each required bit left out is refused, state kept. */
					for (size_t b = 0; b < sizeof(bits) / sizeof(bits[0]); b++) {
						int bit = bits[b].bit;
						int mask = req & bit ? IBV_QP_STATE | (req & ~bit)
								     : !(opt & bit) ? IBV_QP_STATE | req | bit : 0;
						if (!mask)
							continue;
						assert_int_equal(ibv_modify_qp(qp, &a, mask), EINVAL);
						assert_int_equal(qp->state, from);
					}
					assert_int_equal(ibv_modify_qp(qp, &a, IBV_QP_STATE | req | opt), 0);
					assert_int_equal(qp->state, to);
					assert_int_equal(ibv_query_qp(qp, &q, IBV_QP_STATE, &qi), 0);
					assert_int_equal(q.qp_state, to);
				}
				assert_int_equal(ibv_destroy_qp(qp), 0);
				cells++;
			}
		}
	}
	assert_int_equal(cells, 3 * 6 * 7);
}

/* Values the spec rules out, each alone in an otherwise valid
 * INIT->RTR->RTS sequence of an RC QP. */
struct bad_value {
	const char *what;
	enum ibv_qp_state to;
	int bit;
	void (*spoil)(struct ibv_qp_attr *a);
};

static void bad_port(struct ibv_qp_attr *a) { a->port_num = 2; }
static void bad_pkey(struct ibv_qp_attr *a) { a->pkey_index = 1; }
static void bad_access(struct ibv_qp_attr *a) { a->qp_access_flags = 1 << 12; }
static void bad_mtu_big(struct ibv_qp_attr *a) { a->path_mtu = IBV_MTU_4096; }
static void bad_mtu_enum(struct ibv_qp_attr *a) { a->path_mtu = (enum ibv_mtu)9; }
static void bad_dlid(struct ibv_qp_attr *a) { a->ah_attr.dlid = 0; a->ah_attr.is_global = 0; }
static void bad_av_port(struct ibv_qp_attr *a) { a->ah_attr.port_num = 3; }
static void bad_sgid(struct ibv_qp_attr *a) { a->ah_attr.is_global = 1; a->ah_attr.grh.sgid_index = 15; a->ah_attr.grh.dgid.raw[15] = 1; }
static void bad_sl(struct ibv_qp_attr *a) { a->ah_attr.sl = 16; }
static void bad_dest_qpn(struct ibv_qp_attr *a) { a->dest_qp_num = 1u << 24; }
static void bad_dest_rd(struct ibv_qp_attr *a) { a->max_dest_rd_atomic = 129; }
static void bad_rnr_timer(struct ibv_qp_attr *a) { a->min_rnr_timer = 32; }
static void bad_timeout(struct ibv_qp_attr *a) { a->timeout = 32; }
static void bad_retry(struct ibv_qp_attr *a) { a->retry_cnt = 8; }
static void bad_rnr_retry(struct ibv_qp_attr *a) { a->rnr_retry = 8; }
static void bad_rd_atomic(struct ibv_qp_attr *a) { a->max_rd_atomic = 129; }
static void bad_mig(struct ibv_qp_attr *a) { a->path_mig_state = (enum ibv_mig_state)3; }
static void bad_alt(struct ibv_qp_attr *a) { a->alt_timeout = 32; }

static const struct bad_value bad_values[] = {
	{ "port_num 2", IBV_QPS_INIT, IBV_QP_PORT, bad_port },
	{ "pkey_index 1", IBV_QPS_INIT, IBV_QP_PKEY_INDEX, bad_pkey },
	{ "access bit 12, undefined", IBV_QPS_INIT, IBV_QP_ACCESS_FLAGS, bad_access },
	{ "path_mtu above active_mtu", IBV_QPS_RTR, IBV_QP_PATH_MTU, bad_mtu_big },
	{ "path_mtu not an enum", IBV_QPS_RTR, IBV_QP_PATH_MTU, bad_mtu_enum },
	{ "dlid 0 without GRH", IBV_QPS_RTR, IBV_QP_AV, bad_dlid },
	{ "ah port 3", IBV_QPS_RTR, IBV_QP_AV, bad_av_port },
	{ "empty sgid_index", IBV_QPS_RTR, IBV_QP_AV, bad_sgid },
	{ "sl 16", IBV_QPS_RTR, IBV_QP_AV, bad_sl },
	{ "dest_qp_num 2^24", IBV_QPS_RTR, IBV_QP_DEST_QPN, bad_dest_qpn },
	{ "max_dest_rd_atomic 129", IBV_QPS_RTR, IBV_QP_MAX_DEST_RD_ATOMIC, bad_dest_rd },
	{ "min_rnr_timer 32", IBV_QPS_RTR, IBV_QP_MIN_RNR_TIMER, bad_rnr_timer },
	{ "alt_timeout 32", IBV_QPS_RTR, IBV_QP_ALT_PATH, bad_alt },
	{ "timeout 32", IBV_QPS_RTS, IBV_QP_TIMEOUT, bad_timeout },
	{ "retry_cnt 8", IBV_QPS_RTS, IBV_QP_RETRY_CNT, bad_retry },
	{ "rnr_retry 8", IBV_QPS_RTS, IBV_QP_RNR_RETRY, bad_rnr_retry },
	{ "max_rd_atomic 129", IBV_QPS_RTS, IBV_QP_MAX_QP_RD_ATOMIC, bad_rd_atomic },
	{ "path_mig_state 3", IBV_QPS_RTS, IBV_QP_PATH_MIG_STATE, bad_mig },
};

static void test_invalid_values(void **state)
{
	struct fix *f = *state;

	/* The fixture runs with SOFTVERBS_MTU=2048 (see CMakeLists); in RoCE
	 * mode an interface with a smaller MTU lowers the port's, as on rxe. */
	if (f->port.link_layer == IBV_LINK_LAYER_ETHERNET)
		assert_true(f->port.active_mtu <= IBV_MTU_2048);
	else
		assert_int_equal(f->port.active_mtu, IBV_MTU_2048);
	for (size_t i = 0; i < sizeof(bad_values) / sizeof(bad_values[0]); i++) {
		const struct bad_value *bv = &bad_values[i];
		struct ibv_qp *qp = fix_qp(f, IBV_QPT_RC);
		struct ibv_qp_attr a, q;
		struct ibv_qp_init_attr qi;
		const struct cell *c;

		drive(f, qp, bv->to == IBV_QPS_INIT ? IBV_QPS_RESET : bv->to == IBV_QPS_RTR ?
			     IBV_QPS_INIT : IBV_QPS_RTR);
		enum ibv_qp_state from = qp->state;
		c = lookup("RC", from, bv->to);
		fix_valid_attr(f, qp, &a);
		a.qp_state = bv->to;
		bv->spoil(&a);
		int mask = IBV_QP_STATE | parse_mask(c->req) | bv->bit;
		if (ibv_modify_qp(qp, &a, mask) != EINVAL)
			fail_msg("%s was accepted", bv->what);
		assert_int_equal(qp->state, from);
		assert_int_equal(ibv_query_qp(qp, &q, IBV_QP_STATE, &qi), 0);
		assert_int_equal(q.qp_state, from);
		assert_int_equal(ibv_destroy_qp(qp), 0);
	}
}

/* A mismatched IBV_QP_CUR_STATE is refused; PSNs keep 24 bits. */
static void test_cur_state_and_psn(void **state)
{
	struct fix *f = *state;
	struct ibv_qp *qp = fix_qp(f, IBV_QPT_RC);
	struct ibv_qp_attr a, q;
	struct ibv_qp_init_attr qi;

	drive(f, qp, IBV_QPS_RTR);
	fix_valid_attr(f, qp, &a);
	a.qp_state = IBV_QPS_RTS;
	a.cur_qp_state = IBV_QPS_INIT;
	int mask = IBV_QP_STATE | parse_mask(lookup("RC", IBV_QPS_RTR, IBV_QPS_RTS)->req);
	assert_int_equal(ibv_modify_qp(qp, &a, mask | IBV_QP_CUR_STATE), EINVAL);
	assert_int_equal(qp->state, IBV_QPS_RTR);
	a.cur_qp_state = IBV_QPS_RTR;
	a.sq_psn = 0xab123456;
	assert_int_equal(ibv_modify_qp(qp, &a, mask | IBV_QP_CUR_STATE), 0);
	assert_int_equal(ibv_query_qp(qp, &q, IBV_QP_SQ_PSN, &qi), 0);
	assert_int_equal(q.sq_psn, 0x123456);
	assert_int_equal(q.timeout, 14);
	assert_int_equal(q.dest_qp_num, qp->qp_num);
	assert_int_equal(q.path_mtu, IBV_MTU_1024);
	/* RESET forgets every attribute. */
	a.qp_state = IBV_QPS_RESET;
	assert_int_equal(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);
	assert_int_equal(ibv_query_qp(qp, &q, IBV_QP_SQ_PSN, &qi), 0);
	assert_int_equal(q.sq_psn, 0);
	assert_int_equal(q.qp_state, IBV_QPS_RESET);
	assert_int_equal(ibv_destroy_qp(qp), 0);
}

static void test_next_hop(void **state)
{
	(void)state;
	assert_int_equal(sv_qp_next_hop(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_RTS), IBV_QPS_INIT);
	assert_int_equal(sv_qp_next_hop(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTS), IBV_QPS_RTR);
	assert_int_equal(sv_qp_next_hop(IBV_QPT_UD, IBV_QPS_ERR, IBV_QPS_RTS), IBV_QPS_RESET);
	assert_int_equal(sv_qp_next_hop(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_SQE), -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_table_every_cell),
		cmocka_unit_test(test_next_hop),
		cmocka_unit_test_setup_teardown(test_modify_qp_every_reachable_cell, fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_invalid_values, fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_cur_state_and_psn, fix_setup, fix_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
