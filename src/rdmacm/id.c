/* SPDX-License-Identifier: MIT */
/*
 * rdma_cm ids: creation, destruction, options, the device list, and the
 * explain lines every failure of the library goes through.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cm.h"

#define CM_STATE_NAME(s) [CM_##s] = #s,
static const char *const state_names[] = { CM_STATES(CM_STATE_NAME) };
#undef CM_STATE_NAME

const char *cm_state_name(enum cm_state s)
{
	return s < CM_NSTATES ? state_names[s] : "?";
}

/* ---- devices: opened once per process, as librdmacm does ---- */
static struct ibv_context **contexts;
static struct ibv_pd **pds;
static int ncontexts;
/* cm_mu may be held or not by the callers of cm_default_pd. */
static pthread_mutex_t pd_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t dev_once = PTHREAD_ONCE_INIT;

static void open_devices(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);

	if (!list)
		return;
	contexts = calloc((size_t)n + 1, sizeof(*contexts));
	pds = calloc((size_t)n + 1, sizeof(*pds));
	if (contexts && pds)
		for (int i = 0; i < n; i++)
			if ((contexts[ncontexts] = ibv_open_device(list[i])))
				ncontexts++;
	ibv_free_device_list(list);
}

/* Every address of the host maps to the first device, port 1. */
struct ibv_context *cm_device(void)
{
	pthread_once(&dev_once, open_devices);
	return ncontexts ? contexts[0] : NULL;
}

/* An id that gets an address gets the device, port 1 and the device's
 * PD, as librdmacm's ucma_get_device gives every id its device's PD. */
void cm_use_device(struct cm_id *c)
{
	c->id.verbs = cm_device();
	c->id.port_num = 1;
	if (!c->id.pd)
		c->id.pd = cm_default_pd(c->id.verbs);
}

struct ibv_pd *cm_default_pd(struct ibv_context *ctx)
{
	for (int i = 0; i < ncontexts; i++)
		if (contexts[i] == ctx) {
			pthread_mutex_lock(&pd_mu);
			if (!pds[i])
				pds[i] = ibv_alloc_pd(ctx);
			pthread_mutex_unlock(&pd_mu);
			return pds[i];
		}
	return NULL;
}

CM_EXPORT struct ibv_context **rdma_get_devices(int *num_devices)
{
	struct ibv_context **l;

	cm_device();
	l = calloc((size_t)ncontexts + 1, sizeof(*l));
	if (!l) {
		if (num_devices)
			*num_devices = 0;
		errno = ENOMEM;
		return NULL;
	}
	memcpy(l, contexts, (size_t)ncontexts * sizeof(*l));
	if (num_devices)
		*num_devices = ncontexts;
	return l;
}

CM_EXPORT void rdma_free_devices(struct ibv_context **list)
{
	free(list);
}

/* ---- explain ---- */
static void describe(const struct cm_id *c, char *buf, size_t len)
{
	char src[64], dst[64];

	if (!c) {
		snprintf(buf, len, "-");
		return;
	}
	snprintf(buf, len, "id %p (%s, %s) %s -> %s", (const void *)c,
		 c->id.ps == RDMA_PS_UDP ? "UDP" : c->id.ps == RDMA_PS_IB ? "IB" :
		 c->id.ps == RDMA_PS_IPOIB ? "IPOIB" : "TCP", cm_state_name(c->state),
		 cm_addr_str(&c->id.route.addr.src_addr, src, sizeof(src)),
		 cm_addr_str(&c->id.route.addr.dst_addr, dst, sizeof(dst)));
}

int cm_fail(int err, struct cm_id *c, const char *verb, const char *fmt, ...)
{
	char what[256], cause[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(cause, sizeof(cause), fmt, ap);
	va_end(ap);
	describe(c, what, sizeof(what));
	softverbs_cm_explain(verb, "failed (%s): %s: %s", strerrorname_np(err) ?
			     strerrorname_np(err) : "?", what, cause);
	errno = err;
	return -1;
}

void cm_explain_event(const struct cm_id *c, const struct rdma_cm_event *ev, const char *why)
{
	char what[256];

	describe(c, what, sizeof(what));
	softverbs_cm_explain(rdma_event_str(ev->event), "status %d: %s: %s", ev->status, what, why);
}

CM_EXPORT const char *rdma_event_str(enum rdma_cm_event_type event)
{
	static const char *const names[] = {
		[RDMA_CM_EVENT_ADDR_RESOLVED] = "RDMA_CM_EVENT_ADDR_RESOLVED",
		[RDMA_CM_EVENT_ADDR_ERROR] = "RDMA_CM_EVENT_ADDR_ERROR",
		[RDMA_CM_EVENT_ROUTE_RESOLVED] = "RDMA_CM_EVENT_ROUTE_RESOLVED",
		[RDMA_CM_EVENT_ROUTE_ERROR] = "RDMA_CM_EVENT_ROUTE_ERROR",
		[RDMA_CM_EVENT_CONNECT_REQUEST] = "RDMA_CM_EVENT_CONNECT_REQUEST",
		[RDMA_CM_EVENT_CONNECT_RESPONSE] = "RDMA_CM_EVENT_CONNECT_RESPONSE",
		[RDMA_CM_EVENT_CONNECT_ERROR] = "RDMA_CM_EVENT_CONNECT_ERROR",
		[RDMA_CM_EVENT_UNREACHABLE] = "RDMA_CM_EVENT_UNREACHABLE",
		[RDMA_CM_EVENT_REJECTED] = "RDMA_CM_EVENT_REJECTED",
		[RDMA_CM_EVENT_ESTABLISHED] = "RDMA_CM_EVENT_ESTABLISHED",
		[RDMA_CM_EVENT_DISCONNECTED] = "RDMA_CM_EVENT_DISCONNECTED",
		[RDMA_CM_EVENT_DEVICE_REMOVAL] = "RDMA_CM_EVENT_DEVICE_REMOVAL",
		[RDMA_CM_EVENT_MULTICAST_JOIN] = "RDMA_CM_EVENT_MULTICAST_JOIN",
		[RDMA_CM_EVENT_MULTICAST_ERROR] = "RDMA_CM_EVENT_MULTICAST_ERROR",
		[RDMA_CM_EVENT_ADDR_CHANGE] = "RDMA_CM_EVENT_ADDR_CHANGE",
		[RDMA_CM_EVENT_TIMEWAIT_EXIT] = "RDMA_CM_EVENT_TIMEWAIT_EXIT",
	};
	return (unsigned)event < sizeof(names) / sizeof(names[0]) ? names[event] :
		"UNKNOWN EVENT";
}

/* ---- ids ---- */
bool cm_ps_valid(enum rdma_port_space ps)
{
	return ps == RDMA_PS_TCP || ps == RDMA_PS_UDP || ps == RDMA_PS_IB || ps == RDMA_PS_IPOIB;
}

/* The user's share of a message's private data. */
int cm_private_max(const struct cm_id *c, enum cm_msg_type t)
{
	/* The kernel's cma_user_data_offset: the header is left out only for
	 * AF_IB addresses, and softverbs binds IPv4 and IPv6 only. */
	int ip = CM_IP_HDR;

	switch (t) {
	case CM_MSG_REQ: return CM_PDATA_REQ - ip;
	case CM_MSG_SIDR_REQ: return CM_PDATA_SIDR_REQ - ip;
	case CM_MSG_REP: return CM_PDATA_REP;
	case CM_MSG_REJ: return CM_PDATA_REJ;
	case CM_MSG_RTU: return CM_PDATA_RTU;
	case CM_MSG_DREQ: return CM_PDATA_DREQ;
	case CM_MSG_DREP: return CM_PDATA_DREP;
	case CM_MSG_SIDR_REP: return CM_PDATA_SIDR_REP;
	default: return 0;
	}
}

struct cm_id *cm_id_new(struct cm_chan *ch, void *context, enum rdma_port_space ps,
			enum ibv_qp_type qpt)
{
	struct cm_id *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->fd = c->mfd = c->port_fd = -1;
	c->id.context = context;
	c->id.ps = ps;
	c->id.qp_type = qpt;
	c->state = CM_IDLE;
	c->afonly = -1;
	cm_chan_attach(ch, c);
	return c;
}

void cm_id_free(struct cm_id *c)
{
	if (c->fd >= 0)
		close(c->fd);
	if (c->mfd >= 0)
		close(c->mfd);
	if (c->port_fd >= 0)
		close(c->port_fd);
	cm_mad_forget(c);
	free(c->id.route.path_rec);
	free(c->ep_qp_attr);
	free(c);
}

static enum ibv_qp_type ps_qp_type(enum rdma_port_space ps)
{
	return ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB ? IBV_QPT_UD : IBV_QPT_RC;
}

CM_EXPORT int rdma_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id,
			     void *context, enum rdma_port_space ps)
{
	struct cm_chan *ch;
	struct cm_id *c;

	if (!id)
		return cm_fail(EINVAL, NULL, "rdma_create_id", "id is NULL");
	if (!cm_ps_valid(ps))
		return cm_fail(EINVAL, NULL, "rdma_create_id", "port space 0x%x is not TCP, UDP, "
			       "IB or IPOIB", (unsigned)ps);
	if (!cm_device())
		return cm_fail(ENODEV, NULL, "rdma_create_id", "no softverbs device");
	ch = channel ? (struct cm_chan *)channel : cm_chan_new(true);
	if (!ch)
		return cm_fail(errno, NULL, "rdma_create_id", "a private channel: %s",
			       strerror(errno));
	pthread_mutex_lock(&cm_mu);
	c = cm_id_new(ch, context, ps, ps_qp_type(ps));
	pthread_mutex_unlock(&cm_mu);
	if (!c) {
		if (!channel)
			cm_chan_release(ch);
		return cm_fail(ENOMEM, NULL, "rdma_create_id", "out of memory");
	}
	*id = &c->id;
	return 0;
}

CM_EXPORT int rdma_destroy_id(struct rdma_cm_id *id)
{
	struct cm_id *c = cm_of(id);
	struct cm_chan *priv;

	if (!id)
		return cm_fail(EINVAL, NULL, "rdma_destroy_id", "id is NULL");
	pthread_mutex_lock(&cm_mu);
	c->destroying = true;
	cm_mcast_leave_all(c);
	cm_drop_connection(c);
	priv = cm_leave_channel(c);
	cm_mad_forget(c);	/* mad.c's list is walked under cm_mu */
	pthread_mutex_unlock(&cm_mu);
	if (priv)
		cm_chan_release(priv);
	cm_id_free(c);
	return 0;
}

CM_EXPORT int rdma_set_option(struct rdma_cm_id *id, int level, int optname, void *optval,
			      size_t optlen)
{
	struct cm_id *c = cm_of(id);

	if (!id || !optval)
		return cm_fail(EINVAL, c, "rdma_set_option", "%s is NULL", id ? "optval" : "id");
	if (level == RDMA_OPTION_ID) {
		switch (optname) {
		case RDMA_OPTION_ID_TOS:
			if (optlen != sizeof(uint8_t))
				break;
			c->tos = *(uint8_t *)optval;
			c->tos_set = true;
			return 0;
		case RDMA_OPTION_ID_REUSEADDR:
			if (optlen != sizeof(int))
				break;
			if (c->state != CM_IDLE)
				return cm_fail(EINVAL, c, "rdma_set_option", "REUSEADDR must be set "
					       "before the id is bound (kernel rdma_set_reuseaddr)");
			c->reuseaddr = *(int *)optval;
			return 0;
		case RDMA_OPTION_ID_AFONLY:
			if (optlen != sizeof(int))
				break;
			if (c->state != CM_IDLE)
				return cm_fail(EINVAL, c, "rdma_set_option", "AFONLY must be set "
					       "before the id is bound (kernel rdma_set_afonly)");
			c->afonly = *(int *)optval;
			return 0;
		case RDMA_OPTION_ID_ACK_TIMEOUT:
			if (optlen != sizeof(uint8_t))
				break;
			c->ack_timeout = *(uint8_t *)optval;
			c->ack_timeout_set = true;
			return 0;
		default:
			return cm_fail(ENOSYS, c, "rdma_set_option", "no RDMA_OPTION_ID option %d",
				       optname);
		}
		return cm_fail(EINVAL, c, "rdma_set_option", "option %d: optlen %zu is not the "
			       "option's size", optname, optlen);
	}
	if (level == RDMA_OPTION_IB && optname == RDMA_OPTION_IB_PATH) {
		struct ibv_path_data *p = optval;

		if (optlen < sizeof(*p) || optlen % sizeof(*p))
			return cm_fail(EINVAL, c, "rdma_set_option", "IB_PATH: optlen %zu is not a "
				       "multiple of struct ibv_path_data", optlen);
		if (c->state != CM_ADDR_RESOLVED && c->state != CM_ROUTE_RESOLVED)
			return cm_fail(EINVAL, c, "rdma_set_option", "IB_PATH needs a resolved "
				       "address");
		/* The path is this host's own; a path given is accepted and the
		 * id's route resolved, as the kernel does on IB_PATH. */
		pthread_mutex_lock(&cm_mu);
		cm_fill_path(c);
		c->state = CM_ROUTE_RESOLVED;
		pthread_mutex_unlock(&cm_mu);
		return 0;
	}
	return cm_fail(ENOSYS, c, "rdma_set_option", "no option %d at level %d", optname, level);
}

CM_EXPORT int rdma_set_local_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
	if (!id || !ece || !ece->vendor_id || ece->comp_mask)
		return cm_fail(EINVAL, id ? cm_of(id) : NULL, "rdma_set_local_ece",
			       "an ECE needs a vendor id and comp_mask 0");
	cm_of(id)->local_ece = *ece;
	return 0;
}

CM_EXPORT int rdma_get_remote_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
	if (!id || !ece)
		return cm_fail(EINVAL, NULL, "rdma_get_remote_ece", "%s is NULL",
			       id ? "ece" : "id");
	*ece = cm_of(id)->remote_ece;
	return 0;
}
