/* SPDX-License-Identifier: MIT */
/*
 * The rest of the rdma-core 44 ABI: the IBVERBS_PRIVATE_34 provider
 * interface, fork control, the kernel-struct marshalling helpers that
 * librdmacm uses, and the verbs of later features, which answer
 * EOPNOTSUPP until they exist.  reference/abi.md §1 lists who needs what.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <infiniband/sa.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>

#include "../sv.h"

/* ---- IBVERBS_PRIVATE_34 ---- */

/* No installed header declares the provider ABI (it lives in rdma-core's
 * driver.h, which Debian does not ship); these are its prototypes. */
void verbs_register_driver_34(const void *ops);
int execute_ioctl(void);
unsigned int __ioctl_final_num_attrs(void);
int verbs_init_cq(void);
void verbs_set_ops(void);
void verbs_uninit_context(void);
void __verbs_log(void);
void *_verbs_init_and_alloc_context(void);
void *verbs_open_device(void);
int ibv_dontfork_range(void *base, size_t size);
int ibv_dofork_range(void *base, size_t size);
void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst, struct ib_uverbs_ah_attr *src);
void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst, struct ib_uverbs_qp_attr *src);
void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec *dst, struct ib_user_path_rec *src);
void ibv_copy_path_rec_to_kern(struct ib_user_path_rec *dst, struct ibv_sa_path_rec *src);
int ibv_resolve_eth_l2_from_gid(struct ibv_context *ctx, struct ibv_ah_attr *attr,
				uint8_t eth_mac[6], uint16_t *vid);

/* libmlx5 and libefa register themselves from their constructors when
 * perftest loads them.  softverbs is the only provider; nothing to keep. */
SV_EXPORT void verbs_register_driver_34(const void *ops)
{
	(void)ops;
}

/* A data object in rdma-core (libmlx5 reads it); no device is ever
 * disassociated from softverbs. */
SV_EXPORT bool verbs_allow_disassociate_destroy;

/*
 * The provider-side command helpers: real providers call them to reach the
 * kernel.  Only libmlx5 and libefa import them, and only on their own
 * devices, which softverbs never creates.  Each exists so those libraries
 * load, and answers EOPNOTSUPP if called.  They take no parameters here:
 * under the SysV ABIs a caller passing arguments to them is harmless.
 */
#define PROVIDER_CMDS(X) \
	X(advise_mr) X(alloc_dm) X(alloc_mw) X(alloc_pd) X(attach_mcast) X(close_xrcd) \
	X(create_ah) X(create_counters) X(create_cq) X(create_cq_ex) X(create_flow) \
	X(create_flow_action_esp) X(create_qp) X(create_qp_ex) X(create_qp_ex2) \
	X(create_rwq_ind_table) X(create_srq) X(create_srq_ex) X(create_wq) X(dealloc_mw) \
	X(dealloc_pd) X(dereg_mr) X(destroy_ah) X(destroy_counters) X(destroy_cq) \
	X(destroy_flow) X(destroy_flow_action) X(destroy_qp) X(destroy_rwq_ind_table) \
	X(destroy_srq) X(destroy_wq) X(detach_mcast) X(free_dm) X(get_context) X(modify_cq) \
	X(modify_flow_action_esp) X(modify_qp) X(modify_qp_ex) X(modify_srq) X(modify_wq) \
	X(open_qp) X(open_xrcd) X(poll_cq) X(post_recv) X(post_send) X(post_srq_recv) \
	X(query_context) X(query_device_any) X(query_mr) X(query_port) X(query_qp) \
	X(query_srq) X(read_counters) X(reg_dm_mr) X(reg_dmabuf_mr) X(reg_mr) \
	X(req_notify_cq) X(rereg_mr) X(resize_cq)

#define CMD_PROTO(name) int ibv_cmd_##name(void);
PROVIDER_CMDS(CMD_PROTO)
#undef CMD_PROTO
#define CMD(name) SV_EXPORT int ibv_cmd_##name(void) { return EOPNOTSUPP; }
PROVIDER_CMDS(CMD)
#undef CMD

SV_EXPORT int execute_ioctl(void) { return EOPNOTSUPP; }
SV_EXPORT unsigned int __ioctl_final_num_attrs(void) { return 0; }
SV_EXPORT int verbs_init_cq(void) { return EOPNOTSUPP; }
SV_EXPORT void verbs_set_ops(void) { }
SV_EXPORT void verbs_uninit_context(void) { }
SV_EXPORT void __verbs_log(void) { }

SV_EXPORT void *_verbs_init_and_alloc_context(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

SV_EXPORT void *verbs_open_device(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

/* ---- fork ---- */

/* Nothing is pinned or DMA-mapped, so fork() is always safe: the answer
 * rdma-core gives on kernels with copy-on-fork for pinned pages. */
SV_EXPORT int ibv_fork_init(void) { return 0; }
SV_EXPORT enum ibv_fork_status ibv_is_fork_initialized(void) { return IBV_FORK_UNNEEDED; }
SV_EXPORT int ibv_dontfork_range(void *base, size_t size) { (void)base; (void)size; return 0; }
SV_EXPORT int ibv_dofork_range(void *base, size_t size) { (void)base; (void)size; return 0; }

/* ---- kernel structure marshalling (librdmacm) ---- */

SV_EXPORT void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst, struct ib_uverbs_ah_attr *src)
{
	memcpy(dst->grh.dgid.raw, src->grh.dgid, sizeof(dst->grh.dgid));
	dst->grh.flow_label = src->grh.flow_label;
	dst->grh.sgid_index = src->grh.sgid_index;
	dst->grh.hop_limit = src->grh.hop_limit;
	dst->grh.traffic_class = src->grh.traffic_class;
	dst->dlid = src->dlid;
	dst->sl = src->sl;
	dst->src_path_bits = src->src_path_bits;
	dst->static_rate = src->static_rate;
	dst->is_global = src->is_global;
	dst->port_num = src->port_num;
}

SV_EXPORT void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst, struct ib_uverbs_qp_attr *src)
{
	dst->cur_qp_state = src->cur_qp_state;
	dst->path_mtu = src->path_mtu;
	dst->path_mig_state = src->path_mig_state;
	dst->qkey = src->qkey;
	dst->rq_psn = src->rq_psn;
	dst->sq_psn = src->sq_psn;
	dst->dest_qp_num = src->dest_qp_num;
	dst->qp_access_flags = src->qp_access_flags;
	dst->cap.max_send_wr = src->max_send_wr;
	dst->cap.max_recv_wr = src->max_recv_wr;
	dst->cap.max_send_sge = src->max_send_sge;
	dst->cap.max_recv_sge = src->max_recv_sge;
	dst->cap.max_inline_data = src->max_inline_data;
	ibv_copy_ah_attr_from_kern(&dst->ah_attr, &src->ah_attr);
	ibv_copy_ah_attr_from_kern(&dst->alt_ah_attr, &src->alt_ah_attr);
	dst->pkey_index = src->pkey_index;
	dst->alt_pkey_index = src->alt_pkey_index;
	dst->en_sqd_async_notify = src->en_sqd_async_notify;
	dst->sq_draining = src->sq_draining;
	dst->max_rd_atomic = src->max_rd_atomic;
	dst->max_dest_rd_atomic = src->max_dest_rd_atomic;
	dst->min_rnr_timer = src->min_rnr_timer;
	dst->port_num = src->port_num;
	dst->timeout = src->timeout;
	dst->retry_cnt = src->retry_cnt;
	dst->rnr_retry = src->rnr_retry;
	dst->alt_port_num = src->alt_port_num;
	dst->alt_timeout = src->alt_timeout;
}

/* The two path-record layouts share field names; one list serves both
 * directions so they cannot drift apart. */
#define PATH_FIELDS(X) X(dlid) X(slid) X(raw_traffic) X(flow_label) X(reversible) X(mtu) \
	X(pkey) X(hop_limit) X(traffic_class) X(numb_path) X(sl) X(mtu_selector) \
	X(rate_selector) X(rate) X(packet_life_time_selector) X(packet_life_time) X(preference)
#define COPY(f) dst->f = src->f;

SV_EXPORT void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec *dst, struct ib_user_path_rec *src)
{
	memcpy(dst->dgid.raw, src->dgid, sizeof(dst->dgid));
	memcpy(dst->sgid.raw, src->sgid, sizeof(dst->sgid));
	PATH_FIELDS(COPY)
}

SV_EXPORT void ibv_copy_path_rec_to_kern(struct ib_user_path_rec *dst, struct ibv_sa_path_rec *src)
{
	memcpy(dst->dgid, src->dgid.raw, sizeof(dst->dgid));
	memcpy(dst->sgid, src->sgid.raw, sizeof(dst->sgid));
	PATH_FIELDS(COPY)
}
#undef COPY

/* ---- features still to come: EOPNOTSUPP, never a fake success ---- */

SV_EXPORT int ibv_resolve_eth_l2_from_gid(struct ibv_context *ctx, struct ibv_ah_attr *attr,
					  uint8_t eth_mac[6], uint16_t *vid)
{
	(void)ctx; (void)attr; (void)eth_mac; (void)vid;
	return sv_fail(EOPNOTSUPP, "ibv_resolve_eth_l2_from_gid", "softverbs has no Ethernet "
		       "neighbours to resolve");
}

SV_EXPORT int ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	(void)qp; (void)ece;
	return sv_fail(EOPNOTSUPP, "ibv_query_ece", "enhanced connection establishment is a "
		       "vendor extension softverbs does not have");
}

SV_EXPORT int ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	(void)qp; (void)ece;
	return sv_fail(EOPNOTSUPP, "ibv_set_ece", "enhanced connection establishment is a "
		       "vendor extension softverbs does not have");
}

SV_EXPORT int ibv_query_qp_data_in_order(struct ibv_qp *qp, enum ibv_wr_opcode op, uint32_t flags)
{
	(void)qp; (void)op; (void)flags;
	/* 0 = "not guaranteed": what rdma-core answers for a provider that
	 * makes no ordering promise, and true until the data path makes one. */
	return 0;
}

