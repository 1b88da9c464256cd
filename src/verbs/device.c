/* SPDX-License-Identifier: MIT */
/*
 * The device verbs: queries of the devices, their port, GIDs and P_Keys,
 * the device list, and the sysfs view.  The devices themselves and their
 * GID table are the host's (core/port.c).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <inttypes.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <string.h>
#include <unistd.h>

#include "../sv.h"

#undef ibv_query_port

void sv_device_attr(const struct sv_device *dev, struct ibv_device_attr *a)
{
	memset(a, 0, sizeof(*a));
	snprintf(a->fw_ver, sizeof(a->fw_ver), "%s", SV_FW_VER);
	a->node_guid = htobe64(dev->guid);
	a->sys_image_guid = htobe64(dev->guid);
	a->max_mr_size = SV_MAX_MR_SIZE;
	a->page_size_cap = SV_PAGE_SIZE_CAP;
	a->vendor_id = SV_VENDOR_ID;
	a->vendor_part_id = sv_config()->vendor_part_id;
	a->hw_ver = SV_HW_VER;
	a->max_qp = SV_MAX_QP;
	a->max_qp_wr = SV_MAX_QP_WR;
	/* Only what softverbs really does. */
	a->device_cap_flags = IBV_DEVICE_BAD_PKEY_CNTR | IBV_DEVICE_BAD_QKEY_CNTR |
			      IBV_DEVICE_PORT_ACTIVE_EVENT | IBV_DEVICE_SYS_IMAGE_GUID |
			      IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SRQ_RESIZE |
			      IBV_DEVICE_N_NOTIFY_CQ | IBV_DEVICE_CHANGE_PHY_PORT |
			      IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B;
	a->max_mw = SV_MAX_MR;	/* windows and regions share the key table */
	a->max_sge = SV_MAX_SGE;
	a->max_sge_rd = SV_MAX_SGE_RD;
	a->max_cq = SV_MAX_CQ;
	a->max_cqe = SV_MAX_CQE;
	a->max_mr = SV_MAX_MR;
	a->max_pd = SV_MAX_PD;
	a->max_qp_rd_atom = SV_MAX_QP_RD_ATOM;
	a->max_res_rd_atom = SV_MAX_RES_RD_ATOM;
	a->max_qp_init_rd_atom = SV_MAX_QP_INIT_RD_ATOM;
	a->atomic_cap = IBV_ATOMIC_HCA;
	a->max_ah = SV_MAX_AH;
	a->max_srq = SV_MAX_SRQ;
	a->max_srq_wr = SV_MAX_SRQ_WR;
	a->max_srq_sge = SV_MAX_SRQ_SGE;
	/* Groups live in the host registry's attachment table (verbs/mcast.c). */
	a->max_mcast_grp = SV_HOST_MAX_MCAST_ATTACH;
	a->max_mcast_qp_attach = SV_MAX_MCAST_QP_ATTACH;
	a->max_total_mcast_qp_attach = SV_HOST_MAX_MCAST_ATTACH;
	a->max_pkeys = SV_MAX_PKEYS;
	a->local_ca_ack_delay = SV_LOCAL_CA_ACK_DELAY;
	a->phys_port_cnt = SV_NUM_PORTS;
}

void sv_port_attr(const struct sv_device *dev, struct ibv_port_attr *pa)
{
	bool ib = sv_config()->link == SV_LINK_IB;
	bool down = SV_PORT_DOWN(sv_reg_port(dev->index));

	memset(pa, 0, sizeof(*pa));
	/* `softverbs port DEV/1 down` is a cable pulled: DOWN and, like a
	 * link taken down administratively, physically Disabled. */
	pa->state = down ? IBV_PORT_DOWN : IBV_PORT_ACTIVE;
	pa->max_mtu = SV_MAX_MTU;
	pa->active_mtu = sv_port_mtu(dev);
	pa->gid_tbl_len = SV_GID_TBL_LEN;
	pa->port_cap_flags = IBV_PORT_CM_SUP;
	pa->max_msg_sz = SV_MAX_MSG_SZ;
	pa->pkey_tbl_len = SV_PKEY_TBL_LEN;
	/* RoCE ports have no LIDs: the address is the GID (IBA A16.4.1). */
	pa->lid = ib ? sv_port_lid(dev) : 0;
	pa->sm_lid = ib ? pa->lid : 0;
	pa->max_vl_num = 1;
	pa->active_width = 2;	/* 4x */
	pa->active_speed = 32;	/* EDR, 25 Gb/s per lane */
	pa->phys_state = down ? 3 : 5;	/* Disabled, LinkUp */
	pa->link_layer = ib ? IBV_LINK_LAYER_INFINIBAND : IBV_LINK_LAYER_ETHERNET;
	pa->flags = ib ? 0 : IBV_QPF_GRH_REQUIRED;
}

static struct sv_device *ctx_dev(struct ibv_context *ctx)
{
	return sv_ctx(ctx)->dev;
}

SV_EXPORT int ibv_query_device(struct ibv_context *ctx, struct ibv_device_attr *attr)
{
	if (!sv_context_live(ctx, "ibv_query_device"))
		return EINVAL;
	if (!attr)
		return sv_fail(EINVAL, "ibv_query_device", "attr is NULL");
	sv_device_attr(ctx_dev(ctx), attr);
	return 0;
}

int sv_query_device_ex(struct ibv_context *ctx, const struct ibv_query_device_ex_input *input,
		       struct ibv_device_attr_ex *attr, size_t attr_size)
{
	struct ibv_device_attr_ex a;

	if (input && input->comp_mask)
		return sv_fail(EINVAL, "ibv_query_device_ex", "input->comp_mask 0x%x is not 0",
			       input->comp_mask);
	if (attr_size < sizeof(a.orig_attr))
		return sv_fail(EINVAL, "ibv_query_device_ex",
			       "attr_size %zu is smaller than struct ibv_device_attr", attr_size);
	memset(&a, 0, sizeof(a));
	sv_device_attr(ctx_dev(ctx), &a.orig_attr);
	a.completion_timestamp_mask = UINT64_MAX;
	a.hca_core_clock = SV_HCA_CORE_CLOCK_KHZ;
	/* IB_UVERBS_DEVICE_ATOMIC_WRITE, kernel uapi ib_user_verbs.h (6.2+):
	 * newer than Debian 12's headers. */
	a.device_cap_flags_ex = a.orig_attr.device_cap_flags | 1ull << 40;
	/* Nothing is pinned: every transport op works on ODP memory, and
	 * an implicit MR can span the address space. */
	a.odp_caps.general_caps = IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT;
	a.odp_caps.per_transport_caps.rc_odp_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV |
		IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC |
		IBV_ODP_SUPPORT_SRQ_RECV;
	a.odp_caps.per_transport_caps.uc_odp_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV |
		IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_SRQ_RECV;
	a.odp_caps.per_transport_caps.ud_odp_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV |
		IBV_ODP_SUPPORT_SRQ_RECV;
	a.xrc_odp_caps = a.odp_caps.per_transport_caps.rc_odp_caps;
	a.phys_port_cnt_ex = SV_NUM_PORTS;
	a.max_dm_size = SV_MAX_DM_SIZE;
	/* Raw packet QPs exist on Ethernet ports (RoCE mode). */
	if (sv_config()->link == SV_LINK_ROCE) {
		a.max_wq_type_rq = SV_MAX_QP;
		a.rss_caps = (struct ibv_rss_caps){
			.supported_qpts = 1u << IBV_QPT_RAW_PACKET,
			.max_rwq_indirection_tables = SV_MAX_QP,
			.max_rwq_indirection_table_size = 1u << SV_MAX_RWQ_IND_LOG,
			.rx_hash_fields_mask = IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4 |
				IBV_RX_HASH_SRC_IPV6 | IBV_RX_HASH_DST_IPV6 |
				IBV_RX_HASH_SRC_PORT_TCP | IBV_RX_HASH_DST_PORT_TCP |
				IBV_RX_HASH_SRC_PORT_UDP | IBV_RX_HASH_DST_PORT_UDP,
			.rx_hash_function = IBV_RX_HASH_FUNC_TOEPLITZ,
		};
	}
	a.tm_caps = (struct ibv_tm_caps){
		.max_rndv_hdr_size = SV_MAX_RNDV_HDR, .max_num_tags = SV_MAX_TM_TAGS,
		.flags = IBV_TM_CAP_RC, .max_ops = SV_MAX_TM_OPS, .max_sge = SV_MAX_SRQ_SGE,
	};
	/* Fields of newer structs than the caller knows are simply not
	 * written, as rdma-core does for older binaries. */
	memcpy(attr, &a, attr_size < sizeof(a) ? attr_size : sizeof(a));
	if (attr_size > sizeof(a))
		memset((char *)attr + sizeof(a), 0, attr_size - sizeof(a));
	return 0;
}

int sv_query_port_op(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr,
		     size_t attr_len)
{
	struct ibv_port_attr pa;

	if (!sv_context_live(ctx, "ibv_query_port"))
		return EINVAL;
	if (port < 1 || port > SV_NUM_PORTS)
		return sv_fail(EINVAL, "ibv_query_port", "%s has port 1 only; port %u asked",
			       ctx->device->name, port);
	if (!attr)
		return sv_fail(EINVAL, "ibv_query_port", "attr is NULL");
	sv_port_attr(ctx_dev(ctx), &pa);
	memcpy(attr, &pa, attr_len < sizeof(pa) ? attr_len : sizeof(pa));
	return 0;
}

/* The exported symbol serves binaries built before ibv_port_attr grew:
 * like rdma-core, it fills only the old 48-byte layout (through `flags`). */
#define COMPAT_PORT_ATTR_LEN offsetof(struct ibv_port_attr, port_cap_flags2)

SV_EXPORT int ibv_query_port(struct ibv_context *ctx, uint8_t port,
			     struct _compat_ibv_port_attr *attr)
{
	return sv_query_port_op(ctx, port, (struct ibv_port_attr *)attr, COMPAT_PORT_ATTR_LEN);
}

SV_EXPORT int _ibv_query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t index,
				struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size)
{
	struct ibv_gid_entry e = { 0 };

	if (!sv_context_live(ctx, "ibv_query_gid_ex"))
		return EINVAL;
	if (flags || !entry || entry_size < sizeof(e))
		return sv_fail(EINVAL, "ibv_query_gid_ex", "flags must be 0 and entry_size >= %zu",
			       sizeof(e));
	if (port < 1 || port > SV_NUM_PORTS || index >= SV_GID_TBL_LEN)
		return sv_fail(EINVAL, "ibv_query_gid_ex", "port %u index %u out of range "
			       "(port 1, index < %d)", port, index, SV_GID_TBL_LEN);
	if (!sv_gid_entry(ctx_dev(ctx), index, &e.gid, (enum ibv_gid_type *)&e.gid_type))
		return ENODATA;	/* an empty slot, not an error to explain */
	e.gid_index = index;
	e.port_num = port;
	e.ndev_ifindex = sv_gid_ifindex(ctx_dev(ctx), index);
	memcpy(entry, &e, sizeof(e));
	return 0;
}

SV_EXPORT ssize_t _ibv_query_gid_table(struct ibv_context *ctx, struct ibv_gid_entry *entries,
				       size_t max_entries, uint32_t flags, size_t entry_size)
{
	size_t n = 0;

	if (!sv_context_live(ctx, "ibv_query_gid_table"))
		return -EINVAL;
	if (flags || entry_size < sizeof(*entries) || (!entries && max_entries))
		return -sv_fail(EINVAL, "ibv_query_gid_table", "flags must be 0, entry_size >= %zu",
				sizeof(*entries));
	for (uint32_t i = 0; i < SV_GID_TBL_LEN; i++) {
		struct ibv_gid_entry *e = (void *)((char *)entries + n * entry_size);

		if (!sv_gid_entry(ctx_dev(ctx), i, NULL, NULL))
			continue;
		if (n == max_entries)
			return -sv_fail(EINVAL, "ibv_query_gid_table",
					"max_entries %zu is too small", max_entries);
		_ibv_query_gid_ex(ctx, SV_PORT, i, e, 0, entry_size);
		n++;
	}
	return (ssize_t)n;
}

SV_EXPORT int ibv_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid)
{
	struct ibv_gid_entry e;
	int ret;

	if (index < 0 || !gid)
		return sv_fail(EINVAL, "ibv_query_gid", "negative index or NULL gid"), -1;
	ret = _ibv_query_gid_ex(ctx, port, (uint32_t)index, &e, 0, sizeof(e));
	/* rdma-core returns an all-zero GID for an empty slot. */
	if (ret == ENODATA) {
		memset(gid, 0, sizeof(*gid));
		return 0;
	}
	if (ret)
		return -1;
	*gid = e.gid;
	return 0;
}

SV_EXPORT int ibv_query_gid_type(struct ibv_context *ctx, uint8_t port, unsigned int index,
				 enum ibv_gid_type_sysfs *type)
{
	struct ibv_gid_entry e;
	int ret = _ibv_query_gid_ex(ctx, port, index, &e, 0, sizeof(e));

	if (ret == ENODATA) {
		/* rdma-core reads sysfs here, which has a type for every slot. */
		*type = sv_config()->link == SV_LINK_IB ? IBV_GID_TYPE_SYSFS_IB_ROCE_V1
							  : IBV_GID_TYPE_SYSFS_ROCE_V2;
		return 0;
	}
	if (ret)
		return -1;
	*type = e.gid_type == IBV_GID_TYPE_ROCE_V2 ? IBV_GID_TYPE_SYSFS_ROCE_V2
						   : IBV_GID_TYPE_SYSFS_IB_ROCE_V1;
	return 0;
}

SV_EXPORT int ibv_query_pkey(struct ibv_context *ctx, uint8_t port, int index, __be16 *pkey)
{
	if (!sv_context_live(ctx, "ibv_query_pkey"))
		return -1;
	if (port < 1 || port > SV_NUM_PORTS || index < 0 || index >= SV_PKEY_TBL_LEN || !pkey) {
		sv_fail(EINVAL, "ibv_query_pkey", "port %u index %d out of range (port 1, index < %d)",
			port, index, SV_PKEY_TBL_LEN);
		return -1;
	}
	*pkey = htobe16(SV_DEFAULT_PKEY);
	return 0;
}

SV_EXPORT int ibv_get_pkey_index(struct ibv_context *ctx, uint8_t port, __be16 pkey)
{
	for (int i = 0; i < SV_PKEY_TBL_LEN; i++) {
		__be16 p;

		if (ibv_query_pkey(ctx, port, i, &p))
			return -1;
		/* The membership bit (0x8000) is ignored, as rdma-core does. */
		if ((be16toh(p) & 0x7fff) == (be16toh(pkey) & 0x7fff))
			return i;
	}
	errno = ENOENT;
	return -1;
}

/* ---- device list and names ---- */

SV_EXPORT struct ibv_device **ibv_get_device_list(int *num)
{
	int n = sv_device_count();
	struct ibv_device **l = calloc((size_t)n + 1, sizeof(*l));

	if (!l) {
		errno = ENOMEM;
		return NULL;
	}
	for (int i = 0; i < n; i++)
		l[i] = &sv_device_at(i)->ibdev;
	if (num)
		*num = n;
	return l;
}

SV_EXPORT void ibv_free_device_list(struct ibv_device **list)
{
	/* The devices themselves live as long as the library. */
	free(list);
}

SV_EXPORT const char *ibv_get_device_name(struct ibv_device *dev)
{
	struct sv_device *d = sv_device_get(dev);

	return d ? d->ibdev.name : sv_fail_null(EINVAL, "ibv_get_device_name", "unknown device");
}

SV_EXPORT __be64 ibv_get_device_guid(struct ibv_device *dev)
{
	struct sv_device *d = sv_device_get(dev);

	if (!d) {
		sv_fail(EINVAL, "ibv_get_device_guid", "unknown device");
		return 0;
	}
	return htobe64(d->guid);
}

SV_EXPORT int ibv_get_device_index(struct ibv_device *dev)
{
	struct sv_device *d = sv_device_get(dev);

	return d ? (int)d->index : -1;
}

/* ---- sysfs ---- */

SV_EXPORT const char *ibv_get_sysfs_path(void)
{
	const char *p = getenv("SYSFS_PATH");

	return p && *p ? p : "/sys";
}

/* The device directory's attribute files, as ib_core names them. */
const char *const sv_device_attr_files[] = { "node_type", "node_guid", "sys_image_guid",
					     "fw_ver", "hca_type", "hw_rev", "board_id",
					     "node_desc", NULL };

/*
 * One of those files' contents, from the device model: what
 * ibv_read_sysfs_file() answers (ibv_devinfo reads board_id) and what the
 * device view writes (tools/view.c).  Its length, or -1 for another file.
 */
int sv_device_attr_file(const struct sv_device *d, const char *file, char *buf, size_t size)
{
	char val[128];

	if (!strcmp(file, "board_id"))
		snprintf(val, sizeof(val), "SOFTVERBS_%u", d->index);
	else if (!strcmp(file, "fw_ver"))
		snprintf(val, sizeof(val), "%s", SV_FW_VER);
	else if (!strcmp(file, "hca_type"))
		snprintf(val, sizeof(val), "softverbs");
	else if (!strcmp(file, "hw_rev"))
		snprintf(val, sizeof(val), "%d", SV_HW_VER);
	else if (!strcmp(file, "node_type"))
		snprintf(val, sizeof(val), "1: CA");
	else if (!strcmp(file, "node_desc"))
		snprintf(val, sizeof(val), "softverbs %s", d->ibdev.name);
	else if (!strcmp(file, "node_guid") || !strcmp(file, "sys_image_guid"))
		snprintf(val, sizeof(val), "%04x:%04x:%04x:%04x",
			 (unsigned)(d->guid >> 48), (unsigned)(d->guid >> 32) & 0xffff,
			 (unsigned)(d->guid >> 16) & 0xffff, (unsigned)d->guid & 0xffff);
	else
		return -1;
	size_t n = strlen(val);
	if (!size)
		return -1;
	if (n >= size)
		n = size - 1;
	memcpy(buf, val, n);
	buf[n] = 0;
	return (int)n;
}

/*
 * softverbs devices have no sysfs directory of their own (outside a
 * device view): reads of their attribute files are answered from the
 * device model; anything else is read from the real file system.
 */
static int synthetic_attr(const char *dir, const char *file, char *buf, size_t size)
{
	for (int i = 0; i < sv_device_count(); i++)
		if (!strcmp(dir, sv_device_at(i)->ibdev.ibdev_path))
			return sv_device_attr_file(sv_device_at(i), file, buf, size);
	return -2;
}

SV_EXPORT int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size)
{
	char path[512];
	int fd, n;

	if (!dir || !file || !buf)
		return -1;
	n = synthetic_attr(dir, file, buf, size);
	if (n != -2)
		return n;
	if (snprintf(path, sizeof(path), "%s/%s", dir, file) >= (int)sizeof(path))
		return -1;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || !size) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	n = (int)read(fd, buf, size);
	close(fd);
	if (n < 0)
		return -1;
	if (n > 0 && buf[n - 1] == '\n')
		n--;
	if ((size_t)n >= size)
		n = (int)size - 1;
	buf[n] = 0;
	return n;
}

SV_EXPORT int ibv_read_ibdev_sysfs_file(char *buf, size_t size, void *sysfs_dev,
					const char *fnfmt, ...)
{
	(void)buf; (void)size; (void)sysfs_dev; (void)fnfmt;
	/* Providers' private sysfs reader; softverbs has no provider sysfs. */
	errno = EOPNOTSUPP;
	return -1;
}

/*
 * `softverbs port DEV/1 up|down`: the port changes state for every
 * process of the host, as a cable plugged or pulled would; each context's
 * progress thread, woken here, delivers PORT_ACTIVE or PORT_ERR.
 * Returns 0, EALREADY, or an errno.
 */
int sv_port_set_state(unsigned dev, bool up)
{
	/* Static: too large for a stack; only the command (and tests) call this. */
	static struct sv_reg_ep_info eps[SV_HOST_MAX_ENDPOINTS];
	int ret = sv_reg_port_set(dev, up);

	if (ret)
		return ret;
	int n = sv_reg_list_eps(eps, (int)SV_ARRAY_SIZE(eps));
	for (int i = 0; i < n; i++) {
		if (eps[i].dev_index != dev)
			continue;
		struct shm_hdr *h = sv_seg_peer(eps[i].index, eps[i].pid, eps[i].start_time);
		if (h)
			sv_seg_ring(h);
	}
	return 0;
}

