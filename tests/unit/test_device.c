/* SPDX-License-Identifier: MIT */
/*
 * The device model as a program sees it, in the link layer the test runs
 * with (ctest runs this binary once with SOFTVERBS_LINK_LAYER=ib and once
 * with roce, and once with two custom-named devices).
 */
#include <arpa/inet.h>
#include <endian.h>
#include <stdio.h>

#include "helpers.h"

/* Private rdma-core 44 ABI, declared in its (uninstalled) driver.h. */
enum ibv_gid_type_sysfs { IBV_GID_TYPE_SYSFS_IB_ROCE_V1, IBV_GID_TYPE_SYSFS_ROCE_V2 };
int ibv_query_gid_type(struct ibv_context *ctx, uint8_t port, unsigned int index,
		       enum ibv_gid_type_sysfs *type);
int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size);
const char *ibv_get_sysfs_path(void);

static bool roce(void)
{
	const char *l = getenv("SOFTVERBS_LINK_LAYER");
	return l && !strcmp(l, "roce");
}

static void test_device_list(void **state)
{
	(void)state;
	const char *n = getenv("SOFTVERBS_DEVICES");
	const char *name = getenv("SOFTVERBS_DEVICE_NAME");
	int want = n ? atoi(n) : 1, got = -1;
	struct ibv_device **l = ibv_get_device_list(&got);
	char expect[64];

	assert_non_null(l);
	assert_int_equal(got, want);
	assert_null(l[got]);
	for (int i = 0; i < got; i++) {
		snprintf(expect, sizeof(expect), "%s%d", name ? name : "softverbs", i);
		assert_string_equal(ibv_get_device_name(l[i]), expect);
		assert_int_equal(ibv_get_device_index(l[i]), i);
		assert_int_equal(l[i]->transport_type, IBV_TRANSPORT_IB);
		assert_true(ibv_get_device_guid(l[i]) != 0);
		if (i)	/* every device has its own GUID */
			assert_true(ibv_get_device_guid(l[i]) != ibv_get_device_guid(l[0]));
	}
	ibv_free_device_list(l);
}

static void test_query_device(void **state)
{
	struct fix *f = *state;
	struct ibv_device_attr a;
	struct ibv_device_attr_ex x;

	assert_int_equal(ibv_query_device(f->ctx, &a), 0);
	assert_true(a.vendor_id != 0);
	assert_int_equal(a.phys_port_cnt, 1);
	assert_int_equal(a.atomic_cap, IBV_ATOMIC_HCA);
	assert_true(a.max_qp >= 1024 && a.max_qp_wr >= 1024 && a.max_sge >= 16);
	assert_true(a.max_cqe >= 4096 && a.max_mr >= 1024 && a.max_srq >= 1024);
	assert_true(a.max_qp_rd_atom >= 16 && a.max_qp_init_rd_atom >= 16);
	assert_int_equal(a.node_guid, ibv_get_device_guid(f->ctx->device));
	assert_int_equal(ibv_query_device_ex(f->ctx, NULL, &x), 0);
	assert_memory_equal(&x.orig_attr, &a, sizeof(a));
	assert_int_equal(x.phys_port_cnt_ex, 1);
	assert_true(x.completion_timestamp_mask != 0);
	assert_true(x.hca_core_clock != 0);
	struct ibv_query_device_ex_input in = { .comp_mask = 1 };
	assert_int_equal(ibv_query_device_ex(f->ctx, &in, &x), EINVAL);
}

static void test_query_port(void **state)
{
	struct fix *f = *state;
	struct ibv_port_attr p;

	assert_int_equal(ibv_query_port(f->ctx, 1, &p), 0);
	assert_int_equal(p.state, IBV_PORT_ACTIVE);
	assert_int_equal(p.max_mtu, IBV_MTU_4096);
	assert_true(p.max_msg_sz >= (1u << 30));
	assert_int_equal(p.pkey_tbl_len, 1);
	assert_true(p.gid_tbl_len >= 1);
	if (roce()) {
		assert_int_equal(p.link_layer, IBV_LINK_LAYER_ETHERNET);
		assert_int_equal(p.lid, 0);
		assert_true(p.flags & IBV_QPF_GRH_REQUIRED);
	} else {
		assert_int_equal(p.link_layer, IBV_LINK_LAYER_INFINIBAND);
		assert_true(p.lid >= 1 && p.lid <= 0xbfff);
	}
	/* Port 2 does not exist. */
	assert_int_equal(ibv_query_port(f->ctx, 2, &p), EINVAL);
	/* The exported (pre-1.4 ABI) entry point fills only 48 bytes. */
	struct ibv_port_attr big;
	memset(&big, 0xab, sizeof(big));
	assert_int_equal((ibv_query_port)(f->ctx, 1, (struct _compat_ibv_port_attr *)&big), 0);
	assert_int_equal(big.state, IBV_PORT_ACTIVE);
	assert_int_equal(big.port_cap_flags2, 0xabab);
}

static void test_gid_table(void **state)
{
	struct fix *f = *state;
	struct ibv_gid_entry e[32];
	union ibv_gid g;
	enum ibv_gid_type_sysfs t;
	char s[64];

	ssize_t n = ibv_query_gid_table(f->ctx, e, 32, 0);
	assert_true(n >= 1);
	assert_int_equal(ibv_query_gid(f->ctx, 1, 0, &g), 0);
	assert_memory_equal(&g, &e[0].gid, sizeof(g));
	/* GID 0 is the link-local GID from the port GUID (IBA 4.1.1). */
	assert_int_equal(be64toh(g.global.subnet_prefix), 0xfe80000000000000ull);
	assert_int_equal(g.global.interface_id, ibv_get_device_guid(f->ctx->device));
	assert_int_equal(ibv_query_gid_type(f->ctx, 1, 0, &t), 0);
	if (roce()) {
		assert_int_equal(e[0].gid_type, IBV_GID_TYPE_ROCE_V2);
		assert_int_equal(t, IBV_GID_TYPE_SYSFS_ROCE_V2);
		/* 127.0.0.1 is always among the IPv4-mapped RoCEv2 GIDs. */
		bool lo = false;
		for (ssize_t i = 1; i < n; i++) {
			inet_ntop(AF_INET6, e[i].gid.raw, s, sizeof(s));
			lo |= !strcmp(s, "::ffff:127.0.0.1");
			assert_int_equal(e[i].gid_type, IBV_GID_TYPE_ROCE_V2);
		}
		assert_true(lo);
	} else {
		assert_int_equal(n, 1);
		assert_int_equal(e[0].gid_type, IBV_GID_TYPE_IB);
		assert_int_equal(t, IBV_GID_TYPE_SYSFS_IB_ROCE_V1);
	}
	/* An empty slot: ENODATA from the _ex call, zeros from the old one. */
	struct ibv_gid_entry one;
	assert_int_equal(ibv_query_gid_ex(f->ctx, 1, 15, &one, 0), ENODATA);
	assert_int_equal(ibv_query_gid(f->ctx, 1, 15, &g), 0);
	static const union ibv_gid zero;
	assert_memory_equal(&g, &zero, sizeof(g));
	assert_int_equal(ibv_query_gid(f->ctx, 1, 16, &g), -1);
	assert_int_equal(ibv_query_gid_ex(f->ctx, 1, 0, &one, 1), EINVAL);
	assert_true(ibv_query_gid_table(f->ctx, e, 0, 0) < 0);
}

static void test_pkey(void **state)
{
	struct fix *f = *state;
	__be16 k;

	assert_int_equal(ibv_query_pkey(f->ctx, 1, 0, &k), 0);
	assert_int_equal(be16toh(k), 0xffff);
	assert_int_equal(ibv_query_pkey(f->ctx, 1, 1, &k), -1);
	assert_int_equal(ibv_query_pkey(f->ctx, 2, 0, &k), -1);
	assert_int_equal(ibv_get_pkey_index(f->ctx, 1, htobe16(0xffff)), 0);
	assert_int_equal(ibv_get_pkey_index(f->ctx, 1, htobe16(0x7fff)), 0);
	assert_int_equal(ibv_get_pkey_index(f->ctx, 1, htobe16(0x1234)), -1);
}

static void test_sysfs(void **state)
{
	struct fix *f = *state;
	char buf[64];

	assert_string_equal(ibv_get_sysfs_path(), "/sys");
	int n = ibv_read_sysfs_file(f->ctx->device->ibdev_path, "board_id", buf, sizeof(buf));
	assert_true(n > 0);
	assert_int_equal((int)strlen(buf), n);
	assert_int_equal(ibv_read_sysfs_file(f->ctx->device->ibdev_path, "nonexistent", buf,
					     sizeof(buf)), -1);
	/* Other paths are read from the file system, newline stripped. */
	n = ibv_read_sysfs_file("/proc/sys/kernel", "ostype", buf, sizeof(buf));
	assert_int_equal(n, 5);
	assert_string_equal(buf, "Linux");
}

static void test_strings(void **state)
{
	(void)state;
	static const struct { int v; const char *s; } wc[] = {
		{ IBV_WC_SUCCESS, "success" }, { IBV_WC_LOC_LEN_ERR, "local length error" },
		{ IBV_WC_WR_FLUSH_ERR, "Work Request Flushed Error" },
		{ IBV_WC_REM_ACCESS_ERR, "remote access error" },
		{ IBV_WC_RETRY_EXC_ERR, "transport retry counter exceeded" },
		{ IBV_WC_RNR_RETRY_EXC_ERR, "RNR retry counter exceeded" },
		{ IBV_WC_GENERAL_ERR, "general error" }, { 99, "unknown" },
	};
	for (size_t i = 0; i < sizeof(wc) / sizeof(wc[0]); i++)
		assert_string_equal(ibv_wc_status_str((enum ibv_wc_status)wc[i].v), wc[i].s);
	assert_string_equal(ibv_event_type_str(IBV_EVENT_PORT_ACTIVE), "port active");
	assert_string_equal(ibv_event_type_str(IBV_EVENT_QP_LAST_WQE_REACHED), "last WQE reached");
	assert_string_equal(ibv_port_state_str(IBV_PORT_ACTIVE), "active");
	assert_string_equal(ibv_node_type_str(IBV_NODE_CA), "InfiniBand channel adapter");
	assert_int_equal(ibv_rate_to_mult(IBV_RATE_40_GBPS), 16);
	assert_int_equal(mult_to_ibv_rate(16), IBV_RATE_40_GBPS);
	assert_int_equal(ibv_rate_to_mult(IBV_RATE_100_GBPS), -1);
	assert_int_equal(ibv_rate_to_mbps(IBV_RATE_100_GBPS), 103125);
	assert_int_equal(mbps_to_ibv_rate(25781), IBV_RATE_25_GBPS);
	assert_int_equal(mbps_to_ibv_rate(1), IBV_RATE_MAX);
	assert_int_equal(ibv_is_fork_initialized(), IBV_FORK_UNNEEDED);
	assert_int_equal(ibv_fork_init(), 0);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, fix_setup, fix_teardown)
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_device_list), T(test_query_device), T(test_query_port),
		T(test_gid_table), T(test_pkey), T(test_sysfs), cmocka_unit_test(test_strings),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
