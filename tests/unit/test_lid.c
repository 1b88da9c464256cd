/* SPDX-License-Identifier: MIT */
/*
 * IB mode with SOFTVERBS_LID=addr, in a network namespace of the test's
 * own (own_netns.sh) whose interface the test sets up before the library
 * reads it: a veth end svla with 198.18.0.9/28 (its primary address) and
 * 198.18.0.3/28, MTU 1500; addresses from the RFC 2544 benchmarking
 * range, nothing leaves the namespace.  The subnet 198.18.0.0/28 numbers
 * the hosts: this port's LID is 9, and LID 3 is the host 198.18.0.3,
 * which the test plays with a plain UDP socket on 198.18.0.3:4791.
 *
 *  - the port: LID 9, InfiniBand, the MTU a 1500-byte link carries;
 *  - modify_qp to RTR, from a table of dlids: this host's, the subnet's
 *    hosts, and those no host of the subnet has (0, the broadcast host
 *    part, beyond the subnet), refused with an explanation that names it;
 *  - RC to LID 3: a SEND leaves as a RoCEv2 packet from 198.18.0.9 to
 *    198.18.0.3 with the QP's destination QPN;
 *  - UD from LID 3: a datagram sent from 198.18.0.3 completes with slid
 *    3, no GRH, the 40 bytes before the message left as they were.
 */
#define _GNU_SOURCE
#include <poll.h>

#include "icrc_hand.h"
#include "own_host.h"

#define IF_A		"svla"
#define ADDR		"198.18.0.9"
#define HOST3		"198.18.0.3"
#define OWN_LID		9
#define QKEY		0x11111111u

static int setup_ifaces(void)
{
	static const char *const cmds[] = {
		"ip link add " IF_A " type veth peer name svlb",
		"ip link set " IF_A " mtu 1500",
		"ip addr add " ADDR "/28 dev " IF_A,
		"ip addr add " HOST3 "/28 dev " IF_A,
		"ip link set " IF_A " up",
		"ip link set svlb up",
	};
	return host_setup("test_lid", cmds, SV_ARRAY_LEN(cmds));
}

/* The host 198.18.0.3: a UDP socket on its address, port 4791 (beside
 * the library's [::]:4791, SO_REUSEPORT; the more specific bind takes
 * what is sent to its address). */
static int host3_socket(void)
{
	int one = 1, fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(4791) };

	assert_true(fd >= 0);
	assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)), 0);
	assert_int_equal(inet_pton(AF_INET, HOST3, &a.sin_addr), 1);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	return fd;
}

/* An RC QP to dlid through INIT to RTR: 0 or modify_qp's error. */
static int rc_to(struct fix *f, struct ibv_qp *qp, uint16_t dlid)
{
	struct ibv_qp_attr a;

	fix_valid_attr(f, qp, &a);
	a.qp_state = IBV_QPS_INIT;
	assert_int_equal(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				       IBV_QP_ACCESS_FLAGS), 0);
	a.qp_state = IBV_QPS_RTR;
	a.dest_qp_num = 0x123;
	a.ah_attr.dlid = dlid;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			     IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
			     IBV_QP_MIN_RNR_TIMER);
}

static void test_port(void **state)
{
	struct fix *f = *state;

	assert_int_equal(f->port.link_layer, IBV_LINK_LAYER_INFINIBAND);
	assert_int_equal(f->port.lid, OWN_LID);
	/* 1500 bytes less the IP, UDP, BTH, extension headers and ICRC. */
	assert_int_equal(f->port.active_mtu, IBV_MTU_1024);
}

static void test_routes(void **state)
{
	struct fix *f = *state;
	static const char *const off = "is not on this host (its LID is 0x9) nor a host's of its "
				       "subnet, 198.18.0.0/28";
	static const struct {
		uint16_t dlid;
		int err;
		const char *why;	/* what explain mode says, after "dlid 0x%x " */
	} cases[] = {
		{ OWN_LID, 0, NULL },	/* this host: by shm */
		{ 3, 0, NULL },		/* 198.18.0.3 */
		{ 1, 0, NULL },		/* the first host of the subnet */
		{ 14, 0, NULL },	/* the last */
		{ 15, EINVAL, off },	/* 198.18.0.15: the broadcast address */
		{ 16, EINVAL, off },	/* beyond the subnet */
		{ 0x1234, EINVAL, off },
		{ 0, EINVAL, NULL },	/* no LID: refused before routing */
	};

	for (size_t i = 0; i < SV_ARRAY_LEN(cases); i++) {
		struct ibv_qp *qp = fix_qp(f, IBV_QPT_RC);
		char want[128];
		int err = rc_to(f, qp, cases[i].dlid);
		if (err != cases[i].err)
			fail_msg("dlid 0x%x: modify_qp to RTR returned %d, not %d", cases[i].dlid, err,
				 cases[i].err);
		snprintf(want, sizeof(want), "dlid 0x%x %s", cases[i].dlid, cases[i].why);
		if (cases[i].why && !host_said(want))
			fail_msg("explain mode did not say \"%s\"", want);
		assert_int_equal(ibv_destroy_qp(qp), 0);
	}
}

static void test_rc_to_lid(void **state)
{
	struct fix *f = *state;
	int fd = host3_socket();
	struct ibv_qp *qp = fix_qp(f, IBV_QPT_RC);
	static char msg[16] = "lid 3, please";
	struct ibv_mr *mr = ibv_reg_mr(f->pd, msg, sizeof(msg), 0);
	assert_non_null(mr);
	struct ibv_sge s = { (uintptr_t)msg, sizeof(msg), mr->lkey };
	struct ibv_send_wr w = { .wr_id = 1, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND },
			   *bad;
	struct pollfd p = { fd, POLLIN, 0 };
	struct sockaddr_in from;
	socklen_t fl = sizeof(from);
	uint8_t pkt[256];
	char who[INET_ADDRSTRLEN];

	assert_int_equal(rc_to(f, qp, 3), 0);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 1,
				 .rnr_retry = 1, .sq_psn = 5, .max_rd_atomic = 1 };
	assert_int_equal(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
				       IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				       IBV_QP_MAX_QP_RD_ATOMIC), 0);
	assert_int_equal(ibv_post_send(qp, &w, &bad), 0);
	assert_int_equal(poll(&p, 1, 5000), 1);
	ssize_t n = recvfrom(fd, pkt, sizeof(pkt), 0, (struct sockaddr *)&from, &fl);
	/* BTH (12 bytes), the 16-byte message, the ICRC. */
	assert_int_equal(n, 12 + 16 + 4);
	assert_string_equal(inet_ntop(AF_INET, &from.sin_addr, who, sizeof(who)), ADDR);
	assert_int_equal(pkt[0], 0x04);				/* RC SEND_ONLY */
	assert_int_equal((pkt[5] << 16) | (pkt[6] << 8) | pkt[7], 0x123);	/* DestQP */
	assert_int_equal((pkt[9] << 16) | (pkt[10] << 8) | pkt[11], 5);	/* PSN */
	assert_memory_equal(pkt + 12, msg, sizeof(msg));
	assert_int_equal(ibv_destroy_qp(qp), 0);
	assert_int_equal(ibv_dereg_mr(mr), 0);
	close(fd);
}

static void test_ud_from_lid(void **state)
{
	struct fix *f = *state;
	int fd = host3_socket();
	struct ibv_qp *qp = fix_qp(f, IBV_QPT_UD);
	static uint8_t buf[40 + 64];
	struct ibv_mr *mr = ibv_reg_mr(f->pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	assert_non_null(mr);
	struct ibv_sge s = { (uintptr_t)buf, sizeof(buf), mr->lkey };
	struct ibv_recv_wr r = { .wr_id = 2, .sg_list = &s, .num_sge = 1 }, *bad;
	struct sockaddr_in me = { .sin_family = AF_INET, .sin_port = htons(4791) };
	struct sockaddr_in src;
	socklen_t sl = sizeof(src);
	struct ibv_wc wc;

	fix_walk(f, qp, IBV_QPS_RTS);
	memset(buf, 0xa5, sizeof(buf));
	assert_int_equal(ibv_post_recv(qp, &r, &bad), 0);

	/* UD SEND_ONLY (IBA 9.2, 9.3.2): BTH, DETH, 12 bytes, the ICRC. */
	uint8_t pkt[12 + 8 + 12 + 4] = {
		0x64, 0x00, 0xff, 0xff, 0x00,
		(uint8_t)(qp->qp_num >> 16), (uint8_t)(qp->qp_num >> 8), (uint8_t)qp->qp_num,
		0x00, 0x00, 0x00, 0x07,
		(uint8_t)(QKEY >> 24), (uint8_t)(QKEY >> 16), (uint8_t)(QKEY >> 8), (uint8_t)QKEY,
		0x00, 0x00, 0x00, 0x42,
	};
	memcpy(pkt + 20, "from host 3", 12);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&src, &sl), 0);
	struct sv_flow fl = flow_v4(HOST3, ADDR, ntohs(src.sin_port), 4791);
	/* A receiver sees no IP header: it takes DF and identification 0,
	 * what softverbs and RoCE NICs send (icrc.c). */
	uint32_t icrc = hand_icrc_v4(&fl, pkt, 32, true);
	for (int i = 0; i < 4; i++)
		pkt[32 + i] = (uint8_t)(icrc >> (8 * i));	/* little-endian (A17.8) */
	assert_int_equal(inet_pton(AF_INET, ADDR, &me.sin_addr), 1);
	assert_int_equal(sendto(fd, pkt, sizeof(pkt), 0, (struct sockaddr *)&me, sizeof(me)),
			 (ssize_t)sizeof(pkt));

	if (!host_poll(f->cq, &wc, 5))
		fail_msg("the datagram from " HOST3 " never completed");
	assert_int_equal(wc.status, IBV_WC_SUCCESS);
	assert_int_equal(wc.wr_id, 2);
	assert_int_equal(wc.src_qp, 0x42);
	assert_int_equal(wc.slid, 3);
	assert_false(wc.wc_flags & IBV_WC_GRH);
	assert_int_equal(wc.byte_len, 40 + 12);
	for (int i = 0; i < 40; i++)
		assert_int_equal(buf[i], 0xa5);
	assert_string_equal((char *)buf + 40, "from host 3");
	assert_int_equal(ibv_destroy_qp(qp), 0);
	assert_int_equal(ibv_dereg_mr(mr), 0);
	close(fd);
}

int main(void)
{
	const char *l = getenv("SOFTVERBS_LINK_LAYER"), *lid = getenv("SOFTVERBS_LID");

	/* Never touch the interfaces of a namespace that is not ours. */
	if (!getenv("SV_NETNS_PRIVATE") || !l || strcmp(l, "ib") || !lid || strcmp(lid, "addr")) {
		printf("skipped: test_lid needs SOFTVERBS_LINK_LAYER=ib, SOFTVERBS_LID=addr and a "
		       "network namespace of its own (own_netns.sh)\n");
		return 0;
	}
	if (setup_ifaces())
		return 1;
	/* Explain lines go to stderr, which the tests read back. */
	if (host_explain_capture("test-lid"))
		return 1;

	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_port, fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_routes, fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_rc_to_lid, fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_ud_from_lid, fix_setup, fix_teardown),
	};
	return host_explain_release(cmocka_run_group_tests(tests, NULL, NULL));
}
