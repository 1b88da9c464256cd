/* SPDX-License-Identifier: MIT */
/*
 * RoCE mode with IPv6 addresses, in a network namespace of the test's
 * own (own_netns.sh) whose interfaces the test sets up before the
 * library reads them: lo (127.0.0.1, ::1) and a veth end sv6a with
 * 198.18.0.9/30, 2001:2::10/64 and the link-local fe80::10, its peer
 * sv6b up without addresses.  Addresses from the benchmarking ranges
 * (RFC 2544, RFC 5180); nothing leaves the namespace.
 *
 *  - the GID table: GID[0], then every IPv4 address IPv4-mapped, then
 *    every IPv6 address, link-local included, each RoCE v2 with its
 *    interface, and nothing else;
 *  - UD between two QPs over an IPv6 GID and an IPv4 one: the 40 bytes
 *    before the message are the IP header, with the traffic class and
 *    hop limit of the address vector, whether the message went by shm
 *    or (ctest's unit.ipv6.udp: SOFTVERBS_TRANSPORT=udp) by packets;
 *    /proc/net/snmp6 tells which;
 *  - RC to an IPv6 address on the link that nobody answers: UDP
 *    datagrams over IPv6, IBV_WC_RETRY_EXC_ERR, and explain mode naming
 *    the peer's IPv6 address; to a link-local address, only from a
 *    link-local source GID (its interface).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <net/if.h>
#include <poll.h>
#include <sys/stat.h>

#include "own_host.h"

#define IF_A		"sv6a"
#define ADDR4		"198.18.0.9"
#define ADDR6		"2001:2::10"
#define LL6		"fe80::10"
#define NOBODY6		"2001:2::99"
#define NOBODY_LL6	"fe80::99"

static bool forced;	/* SOFTVERBS_TRANSPORT=udp: every message by packets */

static int setup_ifaces(void)
{
	static const char *const cmds[] = {
		"ip link add " IF_A " type veth peer name sv6b",
		/* No address but the test's: no EUI-64 link-local, no DAD. */
		"sysctl -qw net.ipv6.conf." IF_A ".addr_gen_mode=1 net.ipv6.conf.sv6b.addr_gen_mode=1 "
		"net.ipv6.conf." IF_A ".accept_dad=0 net.ipv6.conf.sv6b.accept_dad=0 "
		"net.ipv6.conf." IF_A ".disable_ipv6=0 net.ipv6.conf.lo.disable_ipv6=0",
		"ip addr add " ADDR4 "/30 dev " IF_A,
		"ip addr add " ADDR6 "/64 dev " IF_A " nodad",
		"ip addr add " LL6 "/64 dev " IF_A " nodad",
		"ip link set " IF_A " up",
		"ip link set sv6b up",
	};
	return host_setup("test_ipv6", cmds, SV_ARRAY_LEN(cmds));
}

static union ibv_gid gid_of(const char *addr)
{
	union ibv_gid g = { .raw = { 0 } };

	if (strchr(addr, ':')) {
		assert_int_equal(inet_pton(AF_INET6, addr, g.raw), 1);
	} else {
		g.raw[10] = g.raw[11] = 0xff;
		assert_int_equal(inet_pton(AF_INET, addr, g.raw + 12), 1);
	}
	return g;
}

/* The index of addr's GID, or -1. */
static int gid_index(struct fix *f, const char *addr)
{
	union ibv_gid want = gid_of(addr);

	for (int i = 0; i < f->port.gid_tbl_len; i++) {
		union ibv_gid g;
		if (!ibv_query_gid(f->ctx, 1, i, &g) && !memcmp(&g, &want, sizeof(g)))
			return i;
	}
	return -1;
}

/* Udp6OutDatagrams of this namespace. */
static long udp6_out(void)
{
	FILE *p = fopen("/proc/net/snmp6", "r");
	char k[64];
	long v, out = -1;

	assert_non_null(p);
	while (fscanf(p, "%63s %ld", k, &v) == 2)
		if (!strcmp(k, "Udp6OutDatagrams"))
			out = v;
	fclose(p);
	assert_true(out >= 0);
	return out;
}

static void test_gid_table(void **state)
{
	struct fix *f = *state;
	unsigned lo = if_nametoindex("lo"), a = if_nametoindex(IF_A);
	const struct {
		const char *addr;
		unsigned ifindex;
	} want[] = { { "127.0.0.1", lo }, { ADDR4, a }, { "::1", lo }, { ADDR6, a }, { LL6, a } };
	int last_v4 = 0, first_v6 = 1 << 30, n = 0;

	assert_int_equal(f->port.link_layer, IBV_LINK_LAYER_ETHERNET);
	/* GID[0]: the GUID's link-local GID, no interface's address. */
	assert_int_equal(be64toh(f->gid.global.subnet_prefix), 0xfe80000000000000ull);
	assert_int_equal(be64toh(f->gid.global.interface_id), be64toh(ibv_get_device_guid(f->list[0])));
	for (size_t i = 0; i < SV_ARRAY_LEN(want); i++) {
		int idx = gid_index(f, want[i].addr);
		struct ibv_gid_entry e;
		if (idx <= 0)
			fail_msg("%s is not in the GID table", want[i].addr);
		assert_int_equal(ibv_query_gid_ex(f->ctx, 1, (uint32_t)idx, &e, 0), 0);
		assert_int_equal(e.gid_type, IBV_GID_TYPE_ROCE_V2);
		if (e.ndev_ifindex != want[i].ifindex)
			fail_msg("%s: ndev_ifindex %u, want %u", want[i].addr, e.ndev_ifindex,
				 want[i].ifindex);
		if (strchr(want[i].addr, ':'))
			first_v6 = idx < first_v6 ? idx : first_v6;
		else
			last_v4 = idx > last_v4 ? idx : last_v4;
	}
	/* IPv4 first, so that adding IPv6 moved no IPv4 GID; and exactly
	 * these: GID[0] and the five addresses. */
	assert_true(last_v4 < first_v6);
	assert_int_equal(gid_index(f, "127.0.0.1"), 1);
	for (int i = 0; i < f->port.gid_tbl_len; i++) {
		union ibv_gid g;
		n += !ibv_query_gid(f->ctx, 1, i, &g) &&
		     memcmp(&g, &(union ibv_gid){ .raw = { 0 } }, sizeof(g));
	}
	assert_int_equal(n, 1 + (int)SV_ARRAY_LEN(want));
	/* The veth's 1500 bytes carry IPv6 + UDP + headers + 1024. */
	assert_int_equal(f->port.active_mtu, IBV_MTU_1024);
}

static struct ibv_qp *ud_qp(struct fix *f)
{
	struct ibv_qp *qp = fix_qp(f, IBV_QPT_UD);

	fix_walk(f, qp, IBV_QPS_RTS);
	return qp;
}

/* A UD message from one QP to another over addr's GID; returns the 40
 * bytes the receiver found before it. */
static void ud_grh(struct fix *f, const char *addr, uint8_t tclass, uint8_t hops, uint8_t *grh,
		   long *v6_datagrams)
{
	struct ibv_qp *tx = ud_qp(f), *rx = ud_qp(f);
	static char buf[40 + 64], msg[13] = "ipv6 ud grh!";
	struct ibv_mr *mr = ibv_reg_mr(f->pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *smr = ibv_reg_mr(f->pd, msg, sizeof(msg), 0);
	int idx = gid_index(f, addr);
	struct ibv_wc wc;

	assert_non_null(mr);
	assert_non_null(smr);
	assert_true(idx > 0);
	memset(buf, 0xee, sizeof(buf));
	struct ibv_ah_attr av = {
		.is_global = 1, .port_num = 1,
		.grh = { .dgid = gid_of(addr), .sgid_index = (uint8_t)idx, .hop_limit = hops,
			 .traffic_class = tclass },
	};
	struct ibv_ah *ah = ibv_create_ah(f->pd, &av);
	assert_non_null(ah);
	struct ibv_sge rs = { (uintptr_t)buf, sizeof(buf), mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 1, .sg_list = &rs, .num_sge = 1 }, *brw;
	assert_int_equal(ibv_post_recv(rx, &rw, &brw), 0);
	long before = udp6_out();
	struct ibv_sge ss = { (uintptr_t)msg, sizeof(msg), smr->lkey };
	struct ibv_send_wr sw = {
		.wr_id = 2, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.ud = { .ah = ah, .remote_qpn = rx->qp_num, .remote_qkey = 0x11111111 },
	}, *bsw;
	assert_int_equal(ibv_post_send(tx, &sw, &bsw), 0);
	for (int got = 0; got < 2;) {
		if (!host_poll(f->cq, &wc, 5))
			fail_msg("UD over %s: no completion", addr);
		if (wc.status != IBV_WC_SUCCESS)
			fail_msg("UD over %s: %s", addr, ibv_wc_status_str(wc.status));
		if (wc.wr_id == 1) {
			assert_int_equal(wc.byte_len, 40 + sizeof(msg));
			assert_true(wc.wc_flags & IBV_WC_GRH);
		}
		got++;
	}
	*v6_datagrams = udp6_out() - before;
	assert_memory_equal(buf + 40, msg, sizeof(msg));
	memcpy(grh, buf, 40);
	assert_int_equal(ibv_destroy_ah(ah), 0);
	assert_int_equal(ibv_dereg_mr(mr), 0);
	assert_int_equal(ibv_dereg_mr(smr), 0);
	assert_int_equal(ibv_destroy_qp(tx), 0);
	assert_int_equal(ibv_destroy_qp(rx), 0);
}

/* RoCEv2 (A17.4.5.1): the GRH of a UD receive is the IPv6 header, next
 * header UDP, as the packet carried it; the IPv4 header for IPv4. */
static void test_ud_grh(void **state)
{
	struct fix *f = *state;
	uint8_t g[40], addr[16];
	long v6;
	/* UDP, BTH, DETH, 13 bytes, 3 of pad, ICRC. */
	unsigned udp_len = 8 + 12 + 8 + 13 + 3 + 4;

	ud_grh(f, ADDR6, 0x28, 9, g, &v6);
	assert_int_equal(g[0] >> 4, 6);
	assert_int_equal((g[0] & 0xf) << 4 | g[1] >> 4, 0x28);
	assert_int_equal(g[4] << 8 | g[5], udp_len);
	assert_int_equal(g[6], 17);
	assert_int_equal(g[7], 9);
	inet_pton(AF_INET6, ADDR6, addr);
	assert_memory_equal(g + 8, addr, 16);
	assert_memory_equal(g + 24, addr, 16);
	/* An address of this host: shm, unless packets are forced, which
	 * then go over IPv6 to it. */
	if (forced)
		assert_true(v6 >= 1);
	else
		assert_int_equal(v6, 0);

	ud_grh(f, ADDR4, 0x48, 5, g, &v6);
	assert_int_equal(v6, 0);
	const uint8_t *ip = g + 20;
	assert_int_equal(ip[0], 0x45);
	assert_int_equal(ip[1], 0x48);
	assert_int_equal(ip[2] << 8 | ip[3], 20 + udp_len);
	assert_int_equal(ip[8], 5);
	assert_int_equal(ip[9], 17);
	inet_pton(AF_INET, ADDR4, addr);
	assert_memory_equal(ip + 12, addr, 4);
	assert_memory_equal(ip + 16, addr, 4);
}

/* An RC QP at RTR towards dgid from the source GID src; the errno. */
static int rc_to(struct fix *f, struct ibv_qp *qp, const char *dgid, const char *src)
{
	struct ibv_qp_attr a;

	fix_valid_attr(f, qp, &a);
	a.qp_state = IBV_QPS_INIT;
	assert_int_equal(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				       IBV_QP_ACCESS_FLAGS), 0);
	a.qp_state = IBV_QPS_RTR;
	a.dest_qp_num = 0x11;
	a.ah_attr.grh.dgid = gid_of(dgid);
	a.ah_attr.grh.sgid_index = (uint8_t)gid_index(f, src);
	int err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				IBV_QP_MIN_RNR_TIMER);
	if (err)
		return err;
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 8;		/* 1 ms */
	a.retry_cnt = 1;
	assert_int_equal(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
				       IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				       IBV_QP_MAX_QP_RD_ATOMIC), 0);
	return 0;
}

/* A SEND nobody answers: datagrams over IPv6, then RETRY_EXC_ERR, and
 * explain mode names the peer. */
static void send_unanswered(struct fix *f, struct ibv_qp *qp, const char *peer_text)
{
	static char msg[64];
	struct ibv_mr *mr = ibv_reg_mr(f->pd, msg, sizeof(msg), 0);
	assert_non_null(mr);
	struct ibv_sge s = { (uintptr_t)msg, sizeof(msg), mr->lkey };
	struct ibv_send_wr w = { .wr_id = 7, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED }, *bad;
	struct ibv_wc wc;
	char want[128];

	long before = udp6_out();
	assert_int_equal(ibv_post_send(qp, &w, &bad), 0);
	if (!host_poll(f->cq, &wc, 10))
		fail_msg("no completion for a SEND to %s", peer_text);
	assert_int_equal(wc.status, IBV_WC_RETRY_EXC_ERR);
	/* The first try and one retry, at least. */
	assert_true(udp6_out() - before >= 2);
	snprintf(want, sizeof(want), "at %s: transport retry counter exceeded", peer_text);
	if (!host_said(want))
		fail_msg("explain mode did not say \"%s\"", want);
	assert_int_equal(ibv_dereg_mr(mr), 0);
}

static void test_rc_unanswered(void **state)
{
	struct fix *f = *state;
	struct ibv_qp *qp = fix_qp(f, IBV_QPT_RC);

	assert_int_equal(rc_to(f, qp, NOBODY6, ADDR6), 0);
	send_unanswered(f, qp, NOBODY6);
	assert_int_equal(ibv_destroy_qp(qp), 0);
}

static void test_rc_link_local(void **state)
{
	struct fix *f = *state;
	struct ibv_qp *qp = fix_qp(f, IBV_QPT_RC);
	char peer[64];

	/* A link-local peer needs the interface: a global source GID has
	 * none to offer. */
	assert_int_equal(rc_to(f, qp, NOBODY_LL6, ADDR6), EINVAL);
	assert_true(host_said("dgid " NOBODY_LL6 " is link-local: grh.sgid_index must name"));
	assert_int_equal(ibv_destroy_qp(qp), 0);
	qp = fix_qp(f, IBV_QPT_RC);
	assert_int_equal(rc_to(f, qp, NOBODY_LL6, LL6), 0);
	snprintf(peer, sizeof(peer), "%s%%%u", NOBODY_LL6, if_nametoindex(IF_A));
	send_unanswered(f, qp, peer);
	assert_int_equal(ibv_destroy_qp(qp), 0);
}

int main(void)
{
	const char *t = getenv("SOFTVERBS_TRANSPORT");
	const char *l = getenv("SOFTVERBS_LINK_LAYER");

	/* Never touch the interfaces of a namespace that is not ours. */
	if (!getenv("SV_NETNS_PRIVATE") || !l || strcmp(l, "roce")) {
		printf("skipped: test_ipv6 needs SOFTVERBS_LINK_LAYER=roce and a network namespace "
		       "of its own (own_netns.sh)\n");
		return 0;
	}
	if (access("/proc/net/snmp6", R_OK)) {
		printf("skipped: test_ipv6: this kernel has no IPv6\n");
		return 0;
	}
	if (setup_ifaces())
		return 1;
	forced = t && !strcmp(t, "udp");
	/* Explain lines go to stderr, which the tests read back. */
	if (host_explain_capture("test-ipv6"))
		return 1;

	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_gid_table, fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_ud_grh, fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_rc_unanswered, fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_rc_link_local, fix_setup, fix_teardown),
	};
	return host_explain_release(cmocka_run_group_tests(tests, NULL, NULL));
}
