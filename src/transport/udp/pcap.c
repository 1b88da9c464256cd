/* SPDX-License-Identifier: MIT */
/*
 * SOFTVERBS_PCAP=PATH: every RoCEv2 packet sent or received, as a classic
 * pcap file (LINKTYPE_ETHERNET) that Wireshark decodes as InfiniBand on
 * UDP port 4791.
 *
 * A UDP socket never shows us the Ethernet, IP or UDP headers, so each
 * frame gets made-up ones: locally administered MACs 02:00 followed by
 * the last 4 bytes of the IP address (the IPv4 address itself), a valid
 * IP header (IPv4 with identification 0, DF and its checksum, as the
 * kernel sends ours; IPv6 with the flow label received, or 0 for a packet
 * sent, whose label the kernel picks after us), and a UDP header with its
 * checksum computed.  The
 * checksum costs a pass over the payload, but capture is a debugging aid,
 * and a frame that looks exactly like the wire one is worth it.
 *
 * Each record is one writev(2) on an O_APPEND descriptor under a mutex:
 * threads never interleave, and a fork child still writing the parent's
 * file (a PATH without %p) interleaves only whole records.  A fork child
 * of a PATH with %p opens its own file on its first frame.  Unrelated
 * processes given one PATH without %p each truncate it: %p is for them.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../sv.h"
#include "tap.h"

#define PCAP_MAGIC	0xa1b2c3d4u	/* microsecond timestamps, our byte order */
#define PCAP_SNAPLEN	262144u		/* Wireshark's largest */
#define LINKTYPE_ETHERNET 1
#define ETH_HDR		14
#define IPV4_HDR	20
#define IPV6_HDR	40
#define UDP_HDR		8
#define DEFAULT_TTL	64		/* when the flow leaves ttl 0 */
#define MAX_IOV		64		/* more pieces than this are gathered */

struct pcap_global {
	uint32_t magic;
	uint16_t major, minor;
	int32_t thiszone;
	uint32_t sigfigs, snaplen, linktype;
};

struct pcap_record {
	uint32_t sec, usec, incl_len, orig_len;
};

_Static_assert(sizeof(struct pcap_global) == 24, "pcap global header");
_Static_assert(sizeof(struct pcap_record) == 16, "pcap record header");

static pthread_once_t pcap_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t pcap_lock = PTHREAD_MUTEX_INITIALIZER;
/* -1 when capture is off, for good or after a failed write. */
static _Atomic int pcap_fd = -1;
static char pcap_template[PATH_MAX];	/* SOFTVERBS_PCAP as given */
static bool pcap_per_pid;		/* the template has %p */
static int32_t pcap_pid;		/* whose file pcap_fd is */

/* The template with %p as pid and %% as %; false when it does not fit. */
static bool expand(char *out, size_t size, int32_t pid)
{
	size_t o = 0;

	for (const char *t = pcap_template; *t; t++) {
		char num[16];
		const char *s = num;

		if (t[0] == '%' && t[1] == 'p') {
			snprintf(num, sizeof(num), "%d", (int)pid);
			t++;
		} else if (t[0] == '%' && t[1] == '%') {
			num[0] = '%', num[1] = 0;
			t++;
		} else {
			num[0] = *t, num[1] = 0;
		}
		for (; *s; s++) {
			if (o + 1 >= size)
				return false;
			out[o++] = *s;
		}
	}
	out[o] = 0;
	return true;
}

/* Opens this process's file and writes the global header; the fd, or -1
 * (said once: capture then stays off). */
static int open_file(int32_t pid)
{
	const struct pcap_global g = {
		.magic = PCAP_MAGIC, .major = 2, .minor = 4,
		.snaplen = PCAP_SNAPLEN, .linktype = LINKTYPE_ETHERNET,
	};
	char path[PATH_MAX];
	int fd;

	if (!expand(path, sizeof(path), pid)) {
		sv_warn("SOFTVERBS_PCAP=%s: path too long; no capture", pcap_template);
		return -1;
	}
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
	if (fd < 0) {
		sv_warn("SOFTVERBS_PCAP=%s: %s; no capture", path, strerror(errno));
		return -1;
	}
	if (write(fd, &g, sizeof(g)) != (ssize_t)sizeof(g)) {
		sv_warn("SOFTVERBS_PCAP=%s: cannot write; no capture", path);
		close(fd);
		return -1;
	}
	return fd;
}

static void pcap_init(void)
{
	const char *p = getenv("SOFTVERBS_PCAP");

	if (!p || !*p)
		return;
	if (strlen(p) >= sizeof(pcap_template)) {
		sv_warn("SOFTVERBS_PCAP: path too long; no capture");
		return;
	}
	strcpy(pcap_template, p);
	pcap_per_pid = strstr(p, "%p") != NULL;
	pcap_pid = sv_pid();
	atomic_store_explicit(&pcap_fd, open_file(pcap_pid), memory_order_release);
}

bool sv_pcap_on(void)
{
	pthread_once(&pcap_once, pcap_init);
	return atomic_load_explicit(&pcap_fd, memory_order_acquire) >= 0;
}

/* RFC 1071 ones' complement sum, continued over a byte stream whose
 * pieces may have odd lengths (*odd: the stream so far has). */
static uint32_t csum_add(uint32_t sum, const uint8_t *p, size_t len, bool *odd)
{
	for (size_t i = 0; i < len; i++) {
		sum += *odd ? p[i] : (uint32_t)p[i] << 8;
		*odd = !*odd;
	}
	return sum;
}

static uint16_t csum_fold(uint32_t sum)
{
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return (uint16_t)~sum;
}

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

/* Ethernet, IP and UDP headers for pkt into h; returns their length. */
static size_t frame_headers(const struct sv_flow *f, const struct iovec *pkt, int n, size_t len,
			    uint8_t *h)
{
	size_t udp_len = UDP_HDR + len;
	uint8_t *ip = h + ETH_HDR, *udp;
	uint8_t ttl = f->ttl ? f->ttl : DEFAULT_TTL;
	uint32_t sum = 0;
	bool odd = false;

	h[0] = 0x02, h[1] = 0x00;
	memcpy(h + 2, &f->dst.s6_addr[12], 4);
	h[6] = 0x02, h[7] = 0x00;
	memcpy(h + 8, &f->src.s6_addr[12], 4);
	if (f->v4) {
		put16(h + 12, 0x0800);
		ip[0] = 0x45;
		ip[1] = f->tclass;
		put16(ip + 2, (uint16_t)(IPV4_HDR + udp_len));
		put16(ip + 4, f->ipid);
		put16(ip + 6, 0x4000);			/* DF */
		ip[8] = ttl;
		ip[9] = 17;
		put16(ip + 10, 0);
		memcpy(ip + 12, &f->src.s6_addr[12], 4);
		memcpy(ip + 16, &f->dst.s6_addr[12], 4);
		put16(ip + 10, csum_fold(csum_add(0, ip, IPV4_HDR, &odd)));
		/* The UDP pseudo-header (RFC 768): addresses, protocol, length. */
		sum = csum_add(0, ip + 12, 8, &odd);
		udp = ip + IPV4_HDR;
	} else {
		put16(h + 12, 0x86dd);
		ip[0] = (uint8_t)(0x60 | f->tclass >> 4);
		ip[1] = (uint8_t)(f->tclass << 4 | (f->flow >> 16 & 0xf));
		ip[2] = (uint8_t)(f->flow >> 8);	/* flow label: as received, */
		ip[3] = (uint8_t)f->flow;		/* 0 when sent (the kernel's) */
		put16(ip + 4, (uint16_t)udp_len);
		ip[6] = 17;
		ip[7] = ttl;
		memcpy(ip + 8, f->src.s6_addr, 16);
		memcpy(ip + 24, f->dst.s6_addr, 16);
		/* RFC 8200 8.1: addresses, then the length and next header. */
		sum = csum_add(0, ip + 8, 32, &odd);
		udp = ip + IPV6_HDR;
	}
	sum += 17 + (uint32_t)udp_len;
	put16(udp, f->sport);
	put16(udp + 2, f->dport);
	put16(udp + 4, (uint16_t)udp_len);
	put16(udp + 6, 0);
	sum = csum_add(sum, udp, UDP_HDR, &odd);
	for (int i = 0; i < n && len; i++) {
		size_t l = pkt[i].iov_len < len ? pkt[i].iov_len : len;

		sum = csum_add(sum, pkt[i].iov_base, l, &odd);
		len -= l;
	}
	/* A computed 0 goes out as ones: 0 means "no checksum" (RFC 768). */
	uint16_t c = csum_fold(sum);
	put16(udp + 6, c ? c : 0xffff);
	return (size_t)(udp + UDP_HDR - h);
}

/* sendmsg(2) of the whole datagram, again after a signal: 0 or errno. */
static int send_datagram(int sock, const struct msghdr *m)
{
	while (sv_sendmsg(sock, m, 0) < 0)
		if (errno != EINTR)
			return errno;
	return 0;
}

/* Writes all of iov[0..n), short writes continued; 0 or an errno. */
static int write_all(int fd, struct iovec *iov, int n)
{
	while (n > 0) {
		ssize_t w = sv_writev(fd, iov, n);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			return errno;
		}
		while (n > 0 && (size_t)w >= iov->iov_len) {
			w -= (ssize_t)iov->iov_len;
			iov++, n--;
		}
		if (n > 0) {
			iov->iov_base = (uint8_t *)iov->iov_base + w;
			iov->iov_len -= (size_t)w;
		}
	}
	return 0;
}

/* One frame of f's packet, written under pcap_lock; with m, the packet is
 * sent on sock first, under the same lock, and captured only if it left.
 * The lock held across the send orders the file as the wire is: a
 * packet's answer, which another thread may capture as soon as the send
 * returns, cannot be written before it.  The timestamp is taken under the
 * lock too, so that time never goes backwards in the file.  Returns 0 or
 * the send's errno. */
static int capture(const struct sv_flow *f, const struct iovec *pkt, int n, size_t len, int sock,
		   const struct msghdr *m)
{
	uint8_t hdr[sizeof(struct pcap_record) + ETH_HDR + IPV6_HDR + UDP_HDR];
	struct pcap_record *rec = (struct pcap_record *)hdr;
	struct iovec iov[MAX_IOV + 1];
	uint8_t *gathered = NULL;
	struct timespec ts;
	size_t hlen, frame, left;
	int niov = 1, fd, err, sent = 0;

	/* Never more than the pieces hold, whatever len says. */
	left = 0;
	for (int i = 0; i < n; i++)
		left += pkt[i].iov_len;
	if (len > left)
		len = left;
	hlen = frame_headers(f, pkt, n, len, hdr + sizeof(*rec));
	frame = hlen + len;
	*rec = (struct pcap_record){
		.incl_len = (uint32_t)(frame < PCAP_SNAPLEN ? frame : PCAP_SNAPLEN),
		.orig_len = (uint32_t)frame,
	};
	iov[0] = (struct iovec){ .iov_base = hdr, .iov_len = sizeof(*rec) + hlen };
	left = rec->incl_len - hlen;
	if (n > MAX_IOV) {
		/* Nothing we send has this many pieces; stay correct anyway. */
		gathered = malloc(left);
		for (size_t off = 0, i = 0; gathered && off < left && i < (size_t)n; i++) {
			size_t l = pkt[i].iov_len < left - off ? pkt[i].iov_len : left - off;

			memcpy(gathered + off, pkt[i].iov_base, l);
			off += l;
		}
		iov[niov++] = (struct iovec){ .iov_base = gathered, .iov_len = left };
	} else {
		for (int i = 0; i < n && left; i++) {
			size_t l = pkt[i].iov_len < left ? pkt[i].iov_len : left;

			iov[niov++] = (struct iovec){ .iov_base = pkt[i].iov_base, .iov_len = l };
			left -= l;
		}
	}

	pthread_mutex_lock(&pcap_lock);
	if (m)
		sent = send_datagram(sock, m);
	fd = atomic_load_explicit(&pcap_fd, memory_order_relaxed);
	if (fd >= 0 && pcap_per_pid && pcap_pid != sv_pid()) {
		/* A fork child: its frames go to its own file; the parent's
		 * descriptor is the parent's to close. */
		pcap_pid = sv_pid();
		fd = open_file(pcap_pid);
		atomic_store_explicit(&pcap_fd, fd, memory_order_release);
	}
	if (fd >= 0 && !sent && (n <= MAX_IOV || gathered)) {
		clock_gettime(CLOCK_REALTIME, &ts);
		rec->sec = (uint32_t)ts.tv_sec;
		rec->usec = (uint32_t)(ts.tv_nsec / 1000);
		err = write_all(fd, iov, niov);
		if (err) {
			sv_warn("SOFTVERBS_PCAP: %s; capture stops", strerror(err));
			atomic_store_explicit(&pcap_fd, -1, memory_order_release);
			close(fd);
		}
	}
	pthread_mutex_unlock(&pcap_lock);
	free(gathered);
	return sent;
}

void sv_pcap_write(const struct sv_flow *f, const struct iovec *pkt, int n, size_t len)
{
	if (sv_pcap_on())
		capture(f, pkt, n, len, -1, NULL);
}

int sv_pcap_send(int sock, const struct msghdr *m, const struct sv_flow *f, const struct iovec *pkt,
		 int n, size_t len)
{
	if (sv_pcap_on())
		return capture(f, pkt, n, len, sock, m);
	return send_datagram(sock, m);
}
