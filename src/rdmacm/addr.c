/* SPDX-License-Identifier: MIT */
/*
 * Addresses, ports and routes.
 *
 * The host is the network namespace: an address is local when one of its
 * interfaces has it (127.0.0.0/8 is always local, as Linux routes it to
 * lo), and every local address maps to softverbs0 port 1 with the GID of
 * that address in RoCE mode (IPv4-mapped), or the port GID in IB mode.
 *
 * The port space is the abstract AF_UNIX names "softverbs-rdmacm:PS:PORT"
 * of this network namespace (cm.h): one port per port space, whatever the
 * address, which is stricter than the kernel's per-address check but never
 * lets two listeners take one port.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "../core/rawsock.h"
#include "cm.h"

/* Linux's default ip_local_port_range, for ephemeral ports. */
enum { EPHEMERAL_LO = 32768, EPHEMERAL_HI = 60999 };

socklen_t cm_addr_len(const struct sockaddr *a)
{
	return a->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

uint16_t cm_addr_port(const struct sockaddr *a)
{
	if (a->sa_family == AF_INET)
		return ntohs(((const struct sockaddr_in *)a)->sin_port);
	if (a->sa_family == AF_INET6)
		return ntohs(((const struct sockaddr_in6 *)a)->sin6_port);
	return 0;
}

void cm_addr_set_port(struct sockaddr *a, uint16_t port)
{
	if (a->sa_family == AF_INET)
		((struct sockaddr_in *)a)->sin_port = htons(port);
	else if (a->sa_family == AF_INET6)
		((struct sockaddr_in6 *)a)->sin6_port = htons(port);
}

const char *cm_addr_str(const struct sockaddr *a, char *buf, size_t len)
{
	char ip[INET6_ADDRSTRLEN];

	if (a->sa_family == AF_INET)
		inet_ntop(AF_INET, &((const struct sockaddr_in *)a)->sin_addr, ip, sizeof(ip));
	else if (a->sa_family == AF_INET6)
		inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)a)->sin6_addr, ip, sizeof(ip));
	else {
		snprintf(buf, len, "-");
		return buf;
	}
	snprintf(buf, len, a->sa_family == AF_INET6 ? "[%s]:%u" : "%s:%u", ip, cm_addr_port(a));
	return buf;
}

static bool v4_of(const struct sockaddr *a, struct in_addr *out)
{
	if (a->sa_family == AF_INET) {
		*out = ((const struct sockaddr_in *)a)->sin_addr;
		return true;
	}
	const struct in6_addr *s6 = &((const struct sockaddr_in6 *)a)->sin6_addr;
	if (a->sa_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(s6)) {
		memcpy(out, &s6->s6_addr[12], 4);
		return true;
	}
	return false;
}

static bool addr_any(const struct sockaddr *a)
{
	struct in_addr v4;

	if (v4_of(a, &v4))
		return v4.s_addr == htonl(INADDR_ANY);
	return a->sa_family == AF_INET6 &&
	       IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)a)->sin6_addr);
}

bool cm_addr_local(const struct sockaddr *a)
{
	struct ifaddrs *ifa, *i;
	struct in_addr v4;
	bool v4ok = v4_of(a, &v4), found = false;

	if (v4ok && (ntohl(v4.s_addr) >> 24) == 127)
		return true;
	if (a->sa_family == AF_INET6 &&
	    IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)a)->sin6_addr))
		return true;
	if (getifaddrs(&ifa))
		return false;
	for (i = ifa; i && !found; i = i->ifa_next) {
		if (!i->ifa_addr)
			continue;
		if (v4ok && i->ifa_addr->sa_family == AF_INET)
			found = ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == v4.s_addr;
		else if (!v4ok && a->sa_family == AF_INET6 && i->ifa_addr->sa_family == AF_INET6)
			found = !memcmp(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr,
					&((const struct sockaddr_in6 *)a)->sin6_addr, 16);
	}
	freeifaddrs(ifa);
	return found;
}

/* Another host rdma_cm can reach (RoCE mode): an IPv4 address on a
 * subnet one of this host's interfaces is on, as a neighbour the kernel
 * would resolve without a gateway.  src gets that interface's address.
 * Routed destinations are not resolved: softverbs sends nothing past the
 * hosts it is attached to unless a QP is pointed there. */
bool cm_addr_onlink(const struct sockaddr *dst, struct sockaddr_storage *src)
{
	struct ifaddrs *ifa, *i;
	struct in_addr v4;
	bool found = false;

	if (!v4_of(dst, &v4) || getifaddrs(&ifa))
		return false;
	for (i = ifa; i && !found; i = i->ifa_next) {
		if (!i->ifa_addr || !i->ifa_netmask || i->ifa_addr->sa_family != AF_INET ||
		    (i->ifa_flags & IFF_LOOPBACK) || !(i->ifa_flags & IFF_UP))
			continue;
		uint32_t a = ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr;
		uint32_t m = ((struct sockaddr_in *)i->ifa_netmask)->sin_addr.s_addr;
		if ((a & m) == (v4.s_addr & m) && m != 0xffffffffu) {
			found = true;
			memset(src, 0, sizeof(*src));
			memcpy(src, i->ifa_addr, sizeof(struct sockaddr_in));
		}
	}
	freeifaddrs(ifa);
	return found;
}

/* The source for a multicast group: the host's first address of the
 * family that is not loopback, else loopback. */
static void local_source(int family, struct sockaddr_storage *out)
{
	struct ifaddrs *ifa, *i;

	memset(out, 0, sizeof(*out));
	out->ss_family = (sa_family_t)family;
	if (family == AF_INET)
		((struct sockaddr_in *)out)->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	else
		((struct sockaddr_in6 *)out)->sin6_addr = in6addr_loopback;
	if (getifaddrs(&ifa))
		return;
	for (i = ifa; i; i = i->ifa_next)
		if (i->ifa_addr && i->ifa_addr->sa_family == family && !(i->ifa_flags & IFF_LOOPBACK)) {
			memcpy(out, i->ifa_addr, cm_addr_len(i->ifa_addr));
			break;
		}
	freeifaddrs(ifa);
}

bool cm_roce(struct ibv_context *ctx)
{
	struct ibv_port_attr pa;

	return !ibv_query_port(ctx, 1, &pa) && pa.link_layer == IBV_LINK_LAYER_ETHERNET;
}

/* The GID of a local address and its index in the GID table. */
void cm_addr_gid(struct ibv_context *ctx, const struct sockaddr *a, union ibv_gid *gid,
		 uint8_t *index)
{
	struct ibv_port_attr pa;
	struct in_addr v4;

	*index = 0;
	memset(gid, 0, sizeof(*gid));
	if (!cm_roce(ctx) || ibv_query_port(ctx, 1, &pa)) {
		ibv_query_gid(ctx, 1, 0, gid);
		return;
	}
	if (v4_of(a, &v4)) {
		/* 127.0.0.0/8 is lo's, whose one address is 127.0.0.1. */
		if ((ntohl(v4.s_addr) >> 24) == 127)
			v4.s_addr = htonl(INADDR_LOOPBACK);
		gid->raw[10] = gid->raw[11] = 0xff;
		memcpy(&gid->raw[12], &v4, 4);
	} else {
		memcpy(gid->raw, &((const struct sockaddr_in6 *)a)->sin6_addr, 16);
	}
	for (int i = 0; i < pa.gid_tbl_len && i < 256; i++) {
		union ibv_gid g;

		if (!ibv_query_gid(ctx, 1, i, &g) && !memcmp(&g, gid, sizeof(g))) {
			*index = (uint8_t)i;
			return;
		}
	}
}

/* The abstract name that holds a port; sun is a struct sockaddr_un. */
socklen_t cm_port_addr(enum rdma_port_space ps, uint16_t port, void *sun)
{
	struct sockaddr_un *u = sun;
	int n;

	memset(u, 0, sizeof(*u));
	u->sun_family = AF_UNIX;
	n = snprintf(u->sun_path + 1, sizeof(u->sun_path) - 1, "softverbs-rdmacm:%04x:%u",
		     (unsigned)ps, port);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static int take_port(struct cm_id *c, int fd, uint16_t want, uint16_t *got)
{
	struct sockaddr_un u;
	uint32_t r = 0;
	unsigned span = EPHEMERAL_HI - EPHEMERAL_LO + 1;

	if (want) {
		if (bind(fd, (struct sockaddr *)&u, cm_port_addr(c->id.ps, want, &u)))
			return -1;
		*got = want;
		return 0;
	}
	if (getrandom(&r, sizeof(r), 0) != sizeof(r))
		r = (uint32_t)getpid();
	for (unsigned i = 0; i < span; i++) {
		uint16_t p = (uint16_t)(EPHEMERAL_LO + (r + i) % span);

		if (!bind(fd, (struct sockaddr *)&u, cm_port_addr(c->id.ps, p, &u))) {
			*got = p;
			return 0;
		}
		if (errno != EADDRINUSE)
			return -1;
	}
	errno = EADDRINUSE;
	return -1;
}

int cm_bind_locked(struct cm_id *c, const struct sockaddr *addr)
{
	struct sockaddr_storage any = { .ss_family = AF_INET };
	uint16_t port = 0;
	int fd;

	if (!addr)
		addr = (struct sockaddr *)&any;
	if (c->state != CM_IDLE)
		return cm_fail(EINVAL, c, "rdma_bind_addr", "the id is bound already");
	if (addr->sa_family != AF_INET && addr->sa_family != AF_INET6)
		return cm_fail(EAFNOSUPPORT, c, "rdma_bind_addr", "address family %d: softverbs "
			       "binds IPv4 and IPv6 addresses (AF_IB is not supported)",
			       addr->sa_family);
	char s[64];
	if (!addr_any(addr) && !cm_addr_local(addr))
		return cm_fail(EADDRNOTAVAIL, c, "rdma_bind_addr", "%s is not an address of this "
			       "host (its network namespace)", cm_addr_str(addr, s, sizeof(s)));
	fd = sv_socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return cm_fail(errno, c, "rdma_bind_addr", "socket: %s", strerror(errno));
	if (take_port(c, fd, cm_addr_port(addr), &port)) {
		int err = errno;

		close(fd);
		if (err == EADDRINUSE)
			return cm_fail(EADDRINUSE, c, "rdma_bind_addr", "port %u of this host's %s "
				       "port space is taken", cm_addr_port(addr),
				       c->id.ps == RDMA_PS_UDP ? "UDP" : "TCP");
		return cm_fail(err, c, "rdma_bind_addr", "bind: %s", strerror(err));
	}
	c->fd = fd;
	c->port = port;
	memset(&c->id.route.addr.src_storage, 0, sizeof(c->id.route.addr.src_storage));
	memcpy(&c->id.route.addr.src_storage, addr, cm_addr_len(addr));
	cm_addr_set_port(&c->id.route.addr.src_addr, port);
	if (!addr_any(addr)) {
		cm_use_device(c);
		cm_addr_gid(c->id.verbs, addr, &c->id.route.addr.addr.ibaddr.sgid, &c->sgid_index);
	}
	c->id.route.addr.addr.ibaddr.pkey = htobe16(0xffff);
	c->state = CM_BOUND;
	return 0;
}

CM_EXPORT int rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *addr)
{
	int ret;

	if (!id || !addr)
		return cm_fail(EINVAL, NULL, "rdma_bind_addr", "%s is NULL", id ? "addr" : "id");
	pthread_mutex_lock(&cm_mu);
	ret = cm_bind_locked(cm_of(id), addr);
	/* Other hosts' REQs for the port wait on its service ID's socket
	 * from now on, so that a server that tells its client the port
	 * before it listens (qperf does) does not reject the client's REQ:
	 * they are read once it listens. */
	if (!ret)
		cm_mad_bind(cm_of(id));
	pthread_mutex_unlock(&cm_mu);
	return ret;
}

CM_EXPORT int rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *src_addr,
				struct sockaddr *dst_addr, int timeout_ms)
{
	struct cm_id *c = cm_of(id);
	struct sockaddr_storage dst, src;
	char d[64];
	int ret;

	if (!id || !dst_addr)
		return cm_fail(EINVAL, NULL, "rdma_resolve_addr", "%s is NULL",
			       id ? "dst_addr" : "id");
	if (dst_addr->sa_family != AF_INET && dst_addr->sa_family != AF_INET6)
		return cm_fail(EAFNOSUPPORT, c, "rdma_resolve_addr", "address family %d",
			       dst_addr->sa_family);
	memset(&dst, 0, sizeof(dst));
	memcpy(&dst, dst_addr, cm_addr_len(dst_addr));
	pthread_mutex_lock(&cm_mu);
	if (c->state == CM_IDLE) {
		memset(&src, 0, sizeof(src));
		if (src_addr)
			memcpy(&src, src_addr, cm_addr_len(src_addr));
		else
			src.ss_family = dst.ss_family;
		if (cm_bind_locked(c, (struct sockaddr *)&src)) {
			pthread_mutex_unlock(&cm_mu);
			return -1;
		}
	} else if (c->state != CM_BOUND && c->state != CM_ADDR_RESOLVED) {
		pthread_mutex_unlock(&cm_mu);
		return cm_fail(EINVAL, c, "rdma_resolve_addr", "the id is %s",
			       cm_state_name(c->state));
	}
	/* The kernel resolves the unspecified address as loopback. */
	if (addr_any((struct sockaddr *)&dst)) {
		uint16_t p = cm_addr_port((struct sockaddr *)&dst);

		if (dst.ss_family == AF_INET)
			((struct sockaddr_in *)&dst)->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		else
			((struct sockaddr_in6 *)&dst)->sin6_addr = in6addr_loopback;
		cm_addr_set_port((struct sockaddr *)&dst, p);
	}
	memcpy(&c->id.route.addr.dst_storage, &dst, sizeof(dst));
	bool group = cm_addr_multicast((struct sockaddr *)&dst);
	struct sockaddr_storage via;
	bool here = group || cm_addr_local((struct sockaddr *)&dst);
	if (!here && !(cm_roce(cm_device()) && cm_addr_onlink((struct sockaddr *)&dst, &via))) {
		struct cm_event *e = cm_event_queue(c, RDMA_CM_EVENT_ADDR_ERROR, -EHOSTUNREACH);

		if (e)
			cm_explain_event(c, &e->ev, cm_roce(cm_device()) ?
					 "no host answers for that address: it is neither this "
					 "host's (network namespace's) nor on a subnet this host "
					 "is attached to" :
					 "no host answers for that address: it is not one of this "
					 "host's (network namespace's), and across hosts softverbs "
					 "speaks RoCEv2 (SOFTVERBS_LINK_LAYER=roce)");
		(void)timeout_ms;
		ret = cm_sync_wait(c);
		pthread_mutex_unlock(&cm_mu);
		return ret;
	}
	/* A wildcard source takes the destination's address, as a route to a
	 * local address does. */
	if (addr_any(&c->id.route.addr.src_addr)) {
		uint16_t p = c->port;

		if (group)
			local_source(dst.ss_family, &c->id.route.addr.src_storage);
		else if (!here)
			memcpy(&c->id.route.addr.src_storage, &via, sizeof(via));
		else
			memcpy(&c->id.route.addr.src_storage, &dst, sizeof(dst));
		cm_addr_set_port(&c->id.route.addr.src_addr, p);
	}
	cm_use_device(c);
	cm_addr_gid(c->id.verbs, &c->id.route.addr.src_addr, &c->id.route.addr.addr.ibaddr.sgid,
		    &c->sgid_index);
	uint8_t di;
	cm_addr_gid(c->id.verbs, (struct sockaddr *)&dst, &c->id.route.addr.addr.ibaddr.dgid, &di);
	c->state = CM_ADDR_RESOLVED;
	if (!cm_event_queue(c, RDMA_CM_EVENT_ADDR_RESOLVED, 0)) {
		pthread_mutex_unlock(&cm_mu);
		return cm_fail(ENOMEM, c, "rdma_resolve_addr", "out of memory for the event of %s",
			       cm_addr_str((struct sockaddr *)&dst, d, sizeof(d)));
	}
	ret = cm_sync_wait(c);
	pthread_mutex_unlock(&cm_mu);
	return ret;
}

void cm_fill_path(struct cm_id *c)
{
	struct ibv_sa_path_rec *p = c->id.route.path_rec;
	struct ibv_port_attr pa = { 0 };

	if (!p) {
		p = calloc(1, sizeof(*p));
		if (!p)
			return;
		c->id.route.path_rec = p;
	}
	ibv_query_port(c->id.verbs, 1, &pa);
	memset(p, 0, sizeof(*p));
	p->sgid = c->id.route.addr.addr.ibaddr.sgid;
	p->dgid = c->id.route.addr.addr.ibaddr.dgid;
	p->slid = p->dlid = htobe16(pa.lid);
	p->pkey = htobe16(0xffff);
	p->hop_limit = pa.link_layer == IBV_LINK_LAYER_ETHERNET ? 64 : 0;
	p->traffic_class = c->tos;
	p->reversible = 1;
	p->numb_path = 1;
	p->mtu_selector = 2;	/* exactly */
	p->mtu = (uint8_t)pa.active_mtu;
	p->rate_selector = 2;
	p->rate = 3;		/* IB_RATE_10_GBPS, the kernel's RoCE default */
	p->packet_life_time_selector = 2;
	p->packet_life_time = 16;	/* the kernel's CMA_IBOE_PACKET_LIFETIME */
	c->id.route.num_paths = 1;
}

CM_EXPORT int rdma_resolve_route(struct rdma_cm_id *id, int timeout_ms)
{
	struct cm_id *c = cm_of(id);
	int ret;

	(void)timeout_ms;
	if (!id)
		return cm_fail(EINVAL, NULL, "rdma_resolve_route", "id is NULL");
	pthread_mutex_lock(&cm_mu);
	if (c->state != CM_ADDR_RESOLVED && c->state != CM_ROUTE_RESOLVED) {
		pthread_mutex_unlock(&cm_mu);
		return cm_fail(EINVAL, c, "rdma_resolve_route", "the address is not resolved "
			       "(call rdma_resolve_addr and wait for ADDR_RESOLVED)");
	}
	cm_fill_path(c);
	if (!c->id.route.path_rec) {
		pthread_mutex_unlock(&cm_mu);
		return cm_fail(ENOMEM, c, "rdma_resolve_route", "out of memory");
	}
	c->state = CM_ROUTE_RESOLVED;
	cm_event_queue(c, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
	ret = cm_sync_wait(c);
	pthread_mutex_unlock(&cm_mu);
	return ret;
}

CM_EXPORT __be16 rdma_get_src_port(struct rdma_cm_id *id)
{
	return id ? htons(cm_addr_port(&id->route.addr.src_addr)) : 0;
}

CM_EXPORT __be16 rdma_get_dst_port(struct rdma_cm_id *id)
{
	return id ? htons(cm_addr_port(&id->route.addr.dst_addr)) : 0;
}

/* ---- rdma_getaddrinfo: getaddrinfo(3) with the port space and QP type ---- */
static struct sockaddr *dup_addr(const struct sockaddr *a, socklen_t len)
{
	struct sockaddr *d = malloc(len);

	if (d)
		memcpy(d, a, len);
	return d;
}

CM_EXPORT int rdma_getaddrinfo(const char *node, const char *service,
			       const struct rdma_addrinfo *hints, struct rdma_addrinfo **res)
{
	struct rdma_addrinfo *r;
	struct addrinfo h = { 0 }, *ai = NULL;
	int ret;

	if (!res || (!node && !service && !hints))
		return cm_fail(EINVAL, NULL, "rdma_getaddrinfo", "nothing to resolve");
	r = calloc(1, sizeof(*r));
	if (!r)
		return cm_fail(ENOMEM, NULL, "rdma_getaddrinfo", "out of memory");
	if (hints) {
		r->ai_flags = hints->ai_flags;
		r->ai_family = hints->ai_family;
		r->ai_qp_type = hints->ai_qp_type;
		r->ai_port_space = hints->ai_port_space;
	}
	if (!r->ai_port_space)
		r->ai_port_space = r->ai_qp_type == IBV_QPT_UD ? RDMA_PS_UDP : RDMA_PS_TCP;
	if (!r->ai_qp_type)
		r->ai_qp_type = r->ai_port_space == RDMA_PS_UDP ? IBV_QPT_UD : IBV_QPT_RC;
	if (node || service) {
		h.ai_family = r->ai_family == AF_IB ? AF_UNSPEC : r->ai_family;
		h.ai_socktype = r->ai_port_space == RDMA_PS_UDP ? SOCK_DGRAM : SOCK_STREAM;
		if (r->ai_flags & RAI_PASSIVE)
			h.ai_flags |= AI_PASSIVE;
		if (r->ai_flags & RAI_NUMERICHOST)
			h.ai_flags |= AI_NUMERICHOST;
		ret = getaddrinfo(node, service, &h, &ai);
		if (ret) {
			free(r);
			softverbs_cm_explain("rdma_getaddrinfo", "failed: %s %s: %s",
					     node ? node : "-", service ? service : "-",
					     gai_strerror(ret));
			return ret;
		}
		r->ai_family = ai->ai_family;
		if (r->ai_flags & RAI_PASSIVE) {
			r->ai_src_addr = dup_addr(ai->ai_addr, ai->ai_addrlen);
			r->ai_src_len = ai->ai_addrlen;
		} else {
			r->ai_dst_addr = dup_addr(ai->ai_addr, ai->ai_addrlen);
			r->ai_dst_len = ai->ai_addrlen;
		}
		if (ai->ai_canonname)
			r->ai_dst_canonname = strdup(ai->ai_canonname);
		freeaddrinfo(ai);
	}
	if (hints && hints->ai_src_addr && !r->ai_src_addr) {
		r->ai_src_addr = dup_addr(hints->ai_src_addr, hints->ai_src_len);
		r->ai_src_len = hints->ai_src_len;
	}
	if (hints && hints->ai_dst_addr && !r->ai_dst_addr) {
		r->ai_dst_addr = dup_addr(hints->ai_dst_addr, hints->ai_dst_len);
		r->ai_dst_len = hints->ai_dst_len;
	}
	if (!r->ai_family && (r->ai_src_addr || r->ai_dst_addr))
		r->ai_family = (r->ai_src_addr ? r->ai_src_addr : r->ai_dst_addr)->sa_family;
	*res = r;
	return 0;
}

CM_EXPORT void rdma_freeaddrinfo(struct rdma_addrinfo *res)
{
	while (res) {
		struct rdma_addrinfo *n = res->ai_next;

		free(res->ai_src_addr);
		free(res->ai_dst_addr);
		free(res->ai_src_canonname);
		free(res->ai_dst_canonname);
		free(res->ai_route);
		free(res->ai_connect);
		free(res);
		res = n;
	}
}
