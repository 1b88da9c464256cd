/* SPDX-License-Identifier: MIT */
/*
 * The host's devices: softverbs0.. (count and name configurable), each
 * with port 1 ACTIVE.  The link layer is InfiniBand by default, with a LID
 * from the host registry so that perftest and the pingpongs run with no
 * flags.  In RoCE mode it is Ethernet: the GID table holds RoCEv2 GIDs,
 * the link-local one, an IPv4-mapped one per IPv4 address of the host
 * (its network namespace) and one per IPv6 address, and a GRH is required, as on real RoCE (IBA
 * A16/A17, RoCEv2 annex).  The table and the port's MTU are the host's,
 * read from its interfaces once: the verbs report them and the engine
 * routes by them.
 *
 * In IB mode a LID names a port on one subnet, and a subnet manager
 * numbers the ports.  With SOFTVERBS_LID=addr the numbering is the IPv4
 * one: the first device's LID is the host part of the host's address on
 * its subnet, and a LID on that subnet is the address with that host part,
 * so that programs that address by LID alone (qperf, the pingpongs
 * without -g) reach other hosts; the packets are RoCEv2 as in RoCE mode.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <endian.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "../sv.h"
#include "rawsock.h"

struct gid_slot {
	union ibv_gid gid;
	enum ibv_gid_type type;
	uint32_t ifindex;
};

static struct sv_device devices[SV_MAX_DEVICES];
/* RoCE: the largest IB MTU every interface of the host carries. */
static enum ibv_mtu link_mtu = IBV_MTU_4096;
static struct gid_slot gids[SV_MAX_DEVICES][SV_GID_TBL_LEN];
/* SOFTVERBS_LID=addr: the port's IPv4 subnet (host byte order). */
static struct {
	bool on;
	uint32_t addr, mask;
	enum ibv_mtu mtu;
} subnet;
static int ndevices;
static pthread_once_t dev_once = PTHREAD_ONCE_INIT;

/* A RoCEv2 packet is the IB MTU plus the IP header (20 bytes for IPv4,
 * 40 for IPv6), UDP, BTH, the largest extension headers and the ICRC:
 * rxe derives the port's MTU from its netdev's the same way.  The port's
 * is the largest every interface with an address carries. */
static enum ibv_mtu if_mtu(const char *ifname, int ip_hdr)
{
	struct ifreq ifr = { 0 };
	int fd = sv_socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	enum ibv_mtu m = IBV_MTU_4096;

	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", ifname);
	if (fd >= 0 && !ioctl(fd, SIOCGIFMTU, &ifr)) {
		int room = ifr.ifr_mtu - ip_hdr - 8 - 12 - 28 - 4 - 4;
		m = IBV_MTU_256;
		while (m < IBV_MTU_4096 && (128 << (m + 1)) <= room)
			m++;
	}
	if (fd >= 0)
		close(fd);
	return m;
}

static void clamp_mtu(const char *ifname, int ip_hdr)
{
	enum ibv_mtu m = if_mtu(ifname, ip_hdr);

	if (m < link_mtu)
		link_mtu = m;
}

/* Whether host part `host` of a subnet of netmask `mask` is a unicast LID
 * (1..0xbfff) and not the subnet's broadcast address. */
static bool lid_host(uint32_t host, uint32_t mask)
{
	return host && host <= SV_LID_MAX_UNICAST && host < ~mask;
}

/*
 * The subnet of SOFTVERBS_LID=addr: the first IPv4 address of an
 * interface other than loopback whose host part is a unicast LID
 * (1..0xbfff) and not its subnet's broadcast address.  A /31 or /32 has
 * no host part to number by.
 */
static void find_subnet(void)
{
	struct ifaddrs *ifa;

	if (!sv_config()->lid_addr || getifaddrs(&ifa))
		return;
	for (struct ifaddrs *i = ifa; i && !subnet.on; i = i->ifa_next) {
		if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !i->ifa_netmask ||
		    (i->ifa_flags & IFF_LOOPBACK))
			continue;
		uint32_t a = ntohl(((const struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr);
		uint32_t m = ntohl(((const struct sockaddr_in *)i->ifa_netmask)->sin_addr.s_addr);
		if ((a >> 24) == 127 || m >= 0xfffffffeu || !lid_host(a & ~m, m))
			continue;
		subnet.on = true;
		subnet.addr = a;
		subnet.mask = m;
		subnet.mtu = if_mtu(i->ifa_name, 20);
	}
	freeifaddrs(ifa);
}

/*
 * The GID table.  GID[0] is the link-local GID built from the port GUID
 * (IBA 4.1.1); in RoCE mode RoCEv2 GIDs follow, one per address of the
 * host: first every IPv4 address as an IPv4-mapped GID, ::ffff:a.b.c.d
 * (so GID[1] and the indices of IPv4 addresses are what they were before
 * IPv6 was listed), then every IPv6 address as itself.  As the kernel's
 * GID cache does for a RoCE netdev (roce_gid_mgmt.c: each IPv6 address
 * of the netdev, link-local ones included), link-local addresses are
 * listed too, each with its interface (ndev_ifindex): a packet to a
 * link-local GID leaves by the interface of the source GID's entry.
 * softverbs lists RoCE v2 GIDs only (a v1 GID is an Ethernet frame
 * without IP, which a UDP socket cannot send).  The table holds
 * SV_GID_TBL_LEN entries; addresses beyond it are not listed.
 */
static void fill_gids(struct sv_device *d)
{
	struct gid_slot *g = gids[d->index];
	struct ifaddrs *ifa, *i;
	unsigned n = 0;

	g[n].gid.global.subnet_prefix = htobe64(SV_GID_PREFIX);
	g[n].gid.global.interface_id = htobe64(d->guid);
	g[n].type = sv_config()->link == SV_LINK_IB ? IBV_GID_TYPE_IB : IBV_GID_TYPE_ROCE_V2;
	n++;
	if (sv_config()->link != SV_LINK_ROCE || getifaddrs(&ifa))
		return;
	for (int family = AF_INET; family; family = family == AF_INET ? AF_INET6 : 0) {
		for (i = ifa; i && n < SV_GID_TBL_LEN; i = i->ifa_next) {
			if (!i->ifa_addr || i->ifa_addr->sa_family != family)
				continue;
			memset(&g[n].gid, 0, sizeof(g[n].gid));
			if (family == AF_INET) {
				const struct sockaddr_in *sin = (const struct sockaddr_in *)i->ifa_addr;
				g[n].gid.raw[10] = 0xff;
				g[n].gid.raw[11] = 0xff;
				memcpy(&g[n].gid.raw[12], &sin->sin_addr, 4);
			} else {
				const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)i->ifa_addr;
				memcpy(g[n].gid.raw, &s6->sin6_addr, 16);
			}
			g[n].type = IBV_GID_TYPE_ROCE_V2;
			g[n].ifindex = if_nametoindex(i->ifa_name);
			n++;
			clamp_mtu(i->ifa_name, family == AF_INET ? 20 : 40);
		}
	}
	freeifaddrs(ifa);
}

static void init_devices(void)
{
	const struct sv_config *c = sv_config();
	uint64_t h = sv_host_hash();

	ndevices = c->num_devices;
	find_subnet();
	for (int i = 0; i < ndevices; i++) {
		struct sv_device *d = &devices[i];
		struct ibv_device *ib = &d->ibdev;

		d->index = (unsigned)i;
		/* A locally administered EUI-64 ("SV" in the top bytes), stable
		 * for the host so that every process agrees on it. */
		d->guid = 0x5356000000000000ull | ((h & 0xffffffffffull) << 8) | (uint64_t)i;
		ib->node_type = IBV_NODE_CA;
		ib->transport_type = IBV_TRANSPORT_IB;
		char name[sizeof(ib->name)];

		snprintf(name, sizeof(name), "%s%d", c->dev_prefix, i);
		memcpy(ib->name, name, sizeof(name));
		snprintf(ib->dev_name, sizeof(ib->dev_name), "uverbs%d", i);
		snprintf(ib->dev_path, sizeof(ib->dev_path), "/dev/infiniband/uverbs%d", i);
		snprintf(ib->ibdev_path, sizeof(ib->ibdev_path), "/sys/class/infiniband/%s", name);
		fill_gids(d);
	}
}

static void ensure_devices(void)
{
	pthread_once(&dev_once, init_devices);
}

int sv_device_count(void)
{
	ensure_devices();
	return ndevices;
}

struct sv_device *sv_device_at(int i)
{
	ensure_devices();
	return i >= 0 && i < ndevices ? &devices[i] : NULL;
}

struct sv_device *sv_device_get(struct ibv_device *d)
{
	ensure_devices();
	for (int i = 0; i < ndevices; i++)
		if (d == &devices[i].ibdev)
			return &devices[i];
	return NULL;
}

enum ibv_mtu sv_port_mtu(const struct sv_device *dev)
{
	ensure_devices();
	enum ibv_mtu m = sv_config()->active_mtu;

	if (sv_config()->link == SV_LINK_ROCE && link_mtu < m)
		m = link_mtu;
	if (sv_port_lid_routed(dev) && subnet.mtu < m)
		m = subnet.mtu;
	return m;
}

bool sv_port_lid_routed(const struct sv_device *dev)
{
	ensure_devices();
	return sv_config()->link == SV_LINK_IB && subnet.on && dev->index == 0;
}

uint16_t sv_port_lid(const struct sv_device *dev)
{
	return sv_port_lid_routed(dev) ? (uint16_t)(subnet.addr & ~subnet.mask) :
	       sv_reg_lid(dev->index);
}

bool sv_lid_addr(const struct sv_device *dev, uint16_t lid, uint32_t *dst, uint32_t *src)
{
	if (!sv_port_lid_routed(dev) || !lid_host(lid, subnet.mask))
		return false;
	*dst = htonl((subnet.addr & subnet.mask) | lid);
	*src = htonl(subnet.addr);
	return true;
}

const char *sv_port_subnet(const struct sv_device *dev, char *buf, size_t len)
{
	struct in_addr net = { htonl(subnet.addr & subnet.mask) };
	char a[INET_ADDRSTRLEN];

	if (sv_port_lid_routed(dev) && inet_ntop(AF_INET, &net, a, sizeof(a)))
		snprintf(buf, len, "%s/%d", a, __builtin_popcount(subnet.mask));
	else if (len)
		buf[0] = 0;
	return buf;
}

uint16_t sv_addr_lid(const struct sv_device *dev, uint32_t addr)
{
	uint32_t h = ntohl(addr);

	if (!sv_port_lid_routed(dev) || (h & subnet.mask) != (subnet.addr & subnet.mask))
		return 0;
	h &= ~subnet.mask;
	return lid_host(h, subnet.mask) ? (uint16_t)h : 0;
}

bool sv_port_needs_grh(const struct sv_device *dev)
{
	(void)dev;
	return sv_config()->link == SV_LINK_ROCE;
}

bool sv_gid_entry(const struct sv_device *dev, unsigned index, union ibv_gid *gid,
		  enum ibv_gid_type *type)
{
	if (index >= SV_GID_TBL_LEN)
		return false;
	const struct gid_slot *g = &gids[dev->index][index];
	static const union ibv_gid zero;
	if (!memcmp(&g->gid, &zero, sizeof(zero)))
		return false;
	if (gid)
		*gid = g->gid;
	if (type)
		*type = g->type;
	return true;
}

int sv_gid_find(const struct sv_device *dev, const union ibv_gid *gid)
{
	for (unsigned i = 0; i < SV_GID_TBL_LEN; i++) {
		union ibv_gid g;
		if (sv_gid_entry(dev, i, &g, NULL) && !memcmp(&g, gid, sizeof(g)))
			return (int)i;
	}
	return -1;
}

uint32_t sv_gid_ifindex(const struct sv_device *dev, unsigned index)
{
	return index < SV_GID_TBL_LEN ? gids[dev->index][index].ifindex : 0;
}
