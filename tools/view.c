/* SPDX-License-Identifier: MIT */
/*
 * The environment RDMA stacks look for before they call verbs: a
 * character device per device in /dev/infiniband (UCX requires
 * /dev/infiniband/uverbsN to be one, readable and writable), and the
 * device's attributes under /sys/class/infiniband and
 * /sys/class/infiniband_verbs, as the kernel's ib_core and ib_uverbs
 * publish them.  softverbs has no kernel part, so it shows them in one of
 * two ways:
 *
 *   - `softverbs run`: a view for the command alone.  It enters a mount
 *     namespace of its own (with a user namespace mapping only this user,
 *     when unprivileged), lays a tmpfs over /dev and over /sys/class that
 *     holds every original entry bound back in place plus softverbs'
 *     ones, and then runs the command.  Nothing outside changes; /dev/shm
 *     and the IPC namespace stay the host's, so processes in different
 *     views still map each other's memory, and since they keep their user
 *     id the kernel still lets them copy by CMA.
 *   - `softverbs setup` (root): the same entries made host-wide, for
 *     every process; `softverbs setup --remove` takes them away.
 *
 * Unprivileged, the device nodes are /dev/null bound onto a file (a user
 * namespace may not mknod); as root they are real nodes with ib_uverbs'
 * numbers (231:192+N), mode 0666 as rdma-core's udev rules make them.
 * Nothing ever opens them: softverbs' libibverbs does not need them.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <net/if.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "sv.h"
#include "view.h"

#define UVERBS_MAJOR	231
#define UVERBS_MINOR	192

static char why[256];

static int fail(int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	int n = vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	if (n >= 0 && (size_t)n < sizeof(why))
		snprintf(why + n, sizeof(why) - (size_t)n, ": %s", strerror(err));
	return err;
}

const char *sv_view_why(void)
{
	return why;
}

static int put(const char *dir, const char *name, const char *fmt, ...)
{
	char path[PATH_MAX];
	va_list ap;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "we");
	if (!f)
		return fail(errno, "creating %s", path);
	va_start(ap, fmt);
	vfprintf(f, fmt, ap);
	va_end(ap);
	fputc('\n', f);
	return fclose(f) ? fail(errno, "writing %s", path) : 0;
}

static int mkdirf(const char *fmt, ...)
{
	char path[PATH_MAX];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(path, sizeof(path), fmt, ap);
	va_end(ap);
	if (mkdir(path, 0755) && errno != EEXIST)
		return fail(errno, "mkdir %s", path);
	return 0;
}

static void gid_str(const union ibv_gid *g, char *out, size_t len)
{
	const uint8_t *r = g->raw;

	snprintf(out, len, "%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x",
		 r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11], r[12],
		 r[13], r[14], r[15]);
}

/* One port's directory: what ib_core's sysfs.c shows for it. */
static int port_dir(struct ibv_context *ctx, const char *dev)
{
	struct ibv_port_attr pa;
	char p[PATH_MAX + 16], g[64], ifname[IF_NAMESIZE];
	int err;

	if (ibv_query_port(ctx, SV_PORT, &pa))
		return fail(errno, "ibv_query_port");
	snprintf(p, sizeof(p), "%s/ports/1", dev);
	if ((err = mkdirf("%s/ports", dev)) || (err = mkdirf("%s", p)) ||
	    (err = mkdirf("%s/gids", p)) || (err = mkdirf("%s/gid_attrs", p)) ||
	    (err = mkdirf("%s/gid_attrs/types", p)) || (err = mkdirf("%s/gid_attrs/ndevs", p)) ||
	    (err = mkdirf("%s/pkeys", p)))
		return err;
	bool eth = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
	err = put(p, "state", "%d: %s", pa.state, pa.state == IBV_PORT_ACTIVE ? "ACTIVE" : "DOWN") ||
	      put(p, "phys_state", "%u: %s", pa.phys_state, pa.phys_state == 5 ? "LinkUp" :
		  "Disabled") ||
	      put(p, "lid", "0x%x", pa.lid) || put(p, "lid_mask_count", "%u", pa.lmc) ||
	      put(p, "sm_lid", "0x%x", pa.sm_lid) || put(p, "sm_sl", "%u", pa.sm_sl) ||
	      put(p, "cap_mask", "0x%08x", pa.port_cap_flags) ||
	      /* sv_port_attr()'s 4x width at EDR speed, as ib_core words it. */
	      put(p, "rate", "100 Gb/sec (4X EDR)") ||
	      put(p, "link_layer", "%s", eth ? "Ethernet" : "InfiniBand");
	if (err)
		return EIO;
	for (int i = 0; i < SV_GID_TBL_LEN; i++) {
		struct ibv_gid_entry e;
		char name[32];
		bool have = !ibv_query_gid_ex(ctx, SV_PORT, (uint32_t)i, &e, 0);

		if (!have)
			memset(&e, 0, sizeof(e));
		gid_str(&e.gid, g, sizeof(g));
		snprintf(name, sizeof(name), "gids/%d", i);
		if (put(p, name, "%s", g))
			return EIO;
		snprintf(name, sizeof(name), "gid_attrs/types/%d", i);
		if (have && put(p, name, "%s", e.gid_type == IBV_GID_TYPE_ROCE_V2 ? "RoCE v2" :
				"IB/RoCE v1"))
			return EIO;
		snprintf(name, sizeof(name), "gid_attrs/ndevs/%d", i);
		if (have && e.ndev_ifindex && if_indextoname(e.ndev_ifindex, ifname) &&
		    put(p, name, "%s", ifname))
			return EIO;
	}
	for (int i = 0; i < SV_PKEY_TBL_LEN; i++) {
		char name[32];
		__be16 k = 0;

		ibv_query_pkey(ctx, SV_PORT, i, &k);
		snprintf(name, sizeof(name), "pkeys/%d", i);
		if (put(p, name, "0x%04x", be16toh(k)))
			return EIO;
	}
	return 0;
}

/* The device's parent: a NUMA node and CPUs for those who place by them
 * (UCX), and, on RoCE, the network interfaces its GIDs belong to
 * (device/net/IFNAME, which rdma_cm consumers follow). */
static int parent_dir(struct ibv_context *ctx, const char *dev)
{
	char d[PATH_MAX + 16], link[2 * PATH_MAX], ifname[IF_NAMESIZE];
	long ncpu = sysconf(_SC_NPROCESSORS_CONF);
	int err;

	snprintf(d, sizeof(d), "%s/device", dev);
	if ((err = mkdirf("%s", d)))
		return err;
	if (put(d, "numa_node", "%d", -1) || put(d, "local_cpulist", "0-%ld", ncpu - 1))
		return EIO;
	for (int i = 0; i < SV_GID_TBL_LEN; i++) {
		struct ibv_gid_entry e;

		if (ibv_query_gid_ex(ctx, SV_PORT, (uint32_t)i, &e, 0) || !e.ndev_ifindex ||
		    !if_indextoname(e.ndev_ifindex, ifname))
			continue;
		/* Only a device with interfaces has device/net, as an IB HCA
		 * without IPoIB has none: consumers take an empty one for an
		 * interface without a name. */
		if ((err = mkdirf("%s/net", d)))
			return err;
		snprintf(link, sizeof(link), "%s/net/%s", d, ifname);
		char target[PATH_MAX];
		snprintf(target, sizeof(target), "/sys/class/net/%s", ifname);
		if (symlink(target, link) && errno != EEXIST)
			return fail(errno, "symlink %s", link);
	}
	return 0;
}

/* /sys/class/infiniband/DEV and /sys/class/infiniband_verbs/uverbsN under
 * root (a directory standing for /sys/class). */
static int class_dirs(const char *root)
{
	int n, err = 0;
	struct ibv_device **list = ibv_get_device_list(&n);

	if (!list)
		return fail(errno, "ibv_get_device_list");
	if ((err = mkdirf("%s/infiniband", root)) || (err = mkdirf("%s/infiniband_verbs", root)))
		goto out;
	char v[PATH_MAX];
	snprintf(v, sizeof(v), "%.1000s/infiniband_verbs", root);
	if ((err = put(v, "abi_version", "%d", 6)))
		goto out;
	for (int i = 0; i < n && !err; i++) {
		const char *name = ibv_get_device_name(list[i]);
		struct ibv_context *ctx = ibv_open_device(list[i]);
		const struct sv_device *sd = sv_device_get(list[i]);
		char dev[PATH_MAX], uv[PATH_MAX + 32], link[2 * PATH_MAX], val[128];

		if (!ctx) {
			err = fail(errno, "ibv_open_device %s", name);
			break;
		}
		snprintf(dev, sizeof(dev), "%.1000s/infiniband/%s", root, name);
		err = mkdirf("%s", dev);
		/* The same answers ibv_read_sysfs_file() gives outside a view. */
		for (int k = 0; !err && sv_device_attr_files[k]; k++)
			if (sv_device_attr_file(sd, sv_device_attr_files[k], val, sizeof(val)) < 0 ||
			    put(dev, sv_device_attr_files[k], "%s", val))
				err = EIO;
		if (err || (err = port_dir(ctx, dev)) || (err = parent_dir(ctx, dev))) {
			err = err ? err : EIO;
			ibv_close_device(ctx);
			break;
		}
		ibv_close_device(ctx);
		snprintf(uv, sizeof(uv), "%s/uverbs%d", v, i);
		snprintf(link, sizeof(link), "%s/device", uv);
		char target[PATH_MAX];
		snprintf(target, sizeof(target), "/sys/class/infiniband/%s/device", name);
		if ((err = mkdirf("%s", uv)) || put(uv, "ibdev", "%s", name) ||
		    put(uv, "abi_version", "1") ||
		    put(uv, "dev", "%d:%d", UVERBS_MAJOR, UVERBS_MINOR + i) ||
		    (symlink(target, link) && errno != EEXIST)) {
			err = err ? err : fail(errno ? errno : EIO, "%s", uv);
			break;
		}
	}
out:
	ibv_free_device_list(list);
	return err;
}

/* /dev/infiniband/uverbsN under dir. */
static int dev_nodes(const char *dir, bool root)
{
	int n = sv_device_count(), err;

	if ((err = mkdirf("%s", dir)))
		return err;
	for (int i = 0; i < n; i++) {
		char p[PATH_MAX];
		snprintf(p, sizeof(p), "%s/uverbs%d", dir, i);
		if (root) {
			if (mknod(p, S_IFCHR | 0666, makedev(UVERBS_MAJOR, UVERBS_MINOR + i)) &&
			    errno != EEXIST)
				return fail(errno, "mknod %s", p);
			chmod(p, 0666);	/* past the umask */
			continue;
		}
		int fd = open(p, O_CREAT | O_WRONLY | O_CLOEXEC, 0666);
		if (fd < 0)
			return fail(errno, "creating %s", p);
		close(fd);
		if (mount("/dev/null", p, NULL, MS_BIND, NULL))
			return fail(errno, "binding /dev/null onto %s", p);
	}
	return 0;
}

/*
 * Lays a tmpfs over `target` that shows everything target held -- each
 * entry bound back from the original (directories with their submounts),
 * symlinks recreated -- except `skip`, so that entries can be added
 * beside them.  The original stays reachable through a bind of it made
 * first, aside, and detached once every entry is bound.
 */
static int mirror(const char *target, const char *skip)
{
	char stage[] = "/tmp/softverbs-view-XXXXXX";
	int err = 0;

	if (!mkdtemp(stage))
		return fail(errno, "mkdtemp %s", stage);
	if (mount(target, stage, NULL, MS_BIND | MS_REC, NULL)) {
		err = fail(errno, "binding %s aside", target);
		rmdir(stage);
		return err;
	}
	DIR *d = opendir(stage);
	if (!d)
		err = fail(errno, "opendir %s", target);
	else if (mount("softverbs", target, "tmpfs", MS_NOSUID, "mode=755"))
		err = fail(errno, "mounting a tmpfs on %s", target);
	struct dirent *e;
	while (d && !err && (e = readdir(d))) {
		char src[PATH_MAX], dst[PATH_MAX];
		struct stat st;

		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") ||
		    (skip && !strcmp(e->d_name, skip)))
			continue;
		snprintf(src, sizeof(src), "%s/%s", stage, e->d_name);
		snprintf(dst, sizeof(dst), "%s/%s", target, e->d_name);
		if (lstat(src, &st))
			continue;	/* gone meanwhile */
		if (S_ISLNK(st.st_mode)) {
			char t[PATH_MAX];
			ssize_t n = readlink(src, t, sizeof(t) - 1);
			if (n < 0)
				continue;
			t[n] = 0;
			if (symlink(t, dst))
				err = fail(errno, "symlink %s", dst);
			continue;
		}
		if (S_ISDIR(st.st_mode)) {
			if (mkdir(dst, st.st_mode & 07777))
				err = fail(errno, "mkdir %s", dst);
		} else {
			int fd = open(dst, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
			if (fd < 0)
				err = fail(errno, "creating %s", dst);
			else
				close(fd);
		}
		if (!err && mount(src, dst, NULL, MS_BIND | MS_REC, NULL))
			err = fail(errno, "binding %s back", dst);
	}
	if (d)
		closedir(d);
	umount2(stage, MNT_DETACH);
	rmdir(stage);
	return err;
}

static int write_file(const char *path, const char *s)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	ssize_t n = fd < 0 ? -1 : write(fd, s, strlen(s));

	if (fd >= 0)
		close(fd);
	return n == (ssize_t)strlen(s) ? 0 : fail(errno ? errno : EIO, "writing %s", path);
}

/* Already there: a host set up with `softverbs setup`, or a view we run in. */
static bool present(void)
{
	struct stat st;
	struct ibv_device **l = ibv_get_device_list(NULL);
	char p[PATH_MAX] = "";

	if (l && l[0])
		snprintf(p, sizeof(p), "%s", l[0]->ibdev_path);
	if (l)
		ibv_free_device_list(l);
	return !stat("/dev/infiniband/uverbs0", &st) && S_ISCHR(st.st_mode) && p[0] &&
	       !stat(p, &st);
}

/*
 * One view per user: the kernel lets a process copy another's memory
 * (CMA) only within one user namespace (or from the namespace's parent),
 * so every `softverbs run` of this user joins the view a live process
 * already made, found through /dev/shm/softverbs-UID.view (pid and start
 * time, under flock), and only the first makes one.  A process joins the
 * user namespace (its owner may) and then its mount namespace.
 */
static int join(int32_t pid)
{
	char p[64], cwd[PATH_MAX];
	int err = 0;

	snprintf(p, sizeof(p), "/proc/%d/ns/user", (int)pid);
	int ufd = open(p, O_RDONLY | O_CLOEXEC);
	snprintf(p, sizeof(p), "/proc/%d/ns/mnt", (int)pid);
	int mfd = open(p, O_RDONLY | O_CLOEXEC);
	if (ufd < 0 || mfd < 0)
		err = fail(errno, "opening the namespaces of view holder %d", (int)pid);
	else if (!getcwd(cwd, sizeof(cwd)))
		err = fail(errno, "getcwd");
	else if (setns(ufd, CLONE_NEWUSER) || setns(mfd, CLONE_NEWNS))
		err = fail(errno, "joining the view of process %d", (int)pid);
	else if (chdir(cwd))	/* joining a mount namespace moves to its root */
		err = fail(errno, "chdir %s", cwd);
	if (ufd >= 0)
		close(ufd);
	if (mfd >= 0)
		close(mfd);
	return err;
}

static int make_view(bool root)
{
	uid_t uid = geteuid();
	gid_t gid = getegid();
	char map[64];
	int err;

	if (unshare(root ? CLONE_NEWNS : CLONE_NEWUSER | CLONE_NEWNS))
		return fail(errno, "unshare(%s)", root ? "CLONE_NEWNS" :
			    "CLONE_NEWUSER|CLONE_NEWNS");
	if (!root) {
		snprintf(map, sizeof(map), "%u %u 1", (unsigned)uid, (unsigned)uid);
		if ((err = write_file("/proc/self/setgroups", "deny")) ||
		    (err = write_file("/proc/self/uid_map", map)))
			return err;
		snprintf(map, sizeof(map), "%u %u 1", (unsigned)gid, (unsigned)gid);
		if ((err = write_file("/proc/self/gid_map", map)))
			return err;
	}
	/* Nothing done here may reach the host's mounts. */
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL))
		return fail(errno, "making mounts private");
	if ((err = mirror("/dev", "infiniband")) || (err = dev_nodes("/dev/infiniband", root)) ||
	    (err = mirror("/sys/class", "infiniband")))
		return err;
	return class_dirs("/sys/class");
}

#define VIEW_HOLDERS 16

int sv_view_enter(void)
{
	bool root = geteuid() == 0;
	char path[64], buf[VIEW_HOLDERS * 40 + 1];
	struct { long long pid; unsigned long long start; } h[VIEW_HOLDERS + 1];
	int nh = 0, err = -1;

	if (present())
		return 0;
	/* Root needs no user namespace, and so no shared one: CMA works
	 * across its mount namespaces. */
	if (root)
		return make_view(true);
	snprintf(path, sizeof(path), "/dev/shm/softverbs-%u.view", (unsigned)geteuid());
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0 || flock(fd, LOCK_EX))
		return fail(errno, "%s", path);
	/* The live processes of the view, any of which can be joined. */
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
	buf[n > 0 ? n : 0] = 0;
	for (char *line = strtok(buf, "\n"); line && nh < VIEW_HOLDERS; line = strtok(NULL, "\n"))
		if (sscanf(line, "%lld %llu", &h[nh].pid, &h[nh].start) == 2 && h[nh].pid > 0 &&
		    sv_proc_alive((int32_t)h[nh].pid, h[nh].start))
			nh++;
	for (int i = 0; i < nh && err; i++)
		err = join((int32_t)h[i].pid);
	if (err) {
		/* None could be joined: this process makes the view. */
		nh = 0;
		err = make_view(false);
	}
	if (!err) {
		/* This process holds the view too while it runs (it execs
		 * the command); the oldest holder makes room. */
		if (nh == VIEW_HOLDERS)
			memmove(h, h + 1, --nh * sizeof(h[0]));
		h[nh].pid = getpid();
		h[nh++].start = sv_proc_start_time(getpid());
		int k = 0;
		for (int i = 0; i < nh; i++)
			k += snprintf(buf + k, sizeof(buf) - (size_t)k, "%lld %llu\n", h[i].pid,
				      h[i].start);
		if (ftruncate(fd, 0) || pwrite(fd, buf, (size_t)k, 0) != k)
			sv_log(SV_LOG_WARN, "%s: cannot record this view's process", path);
	}
	close(fd);	/* releases the lock */
	return err;
}

int sv_view_setup_host(bool remove)
{
	int n = sv_device_count(), err;
	struct stat st;

	if (geteuid())
		return fail(EPERM, "softverbs setup makes device nodes and mounts for the whole "
			    "host: run it as root");
	if (remove) {
		for (int i = 0; i < n; i++) {
			char p[64];
			snprintf(p, sizeof(p), "/dev/infiniband/uverbs%d", i);
			unlink(p);
		}
		rmdir("/dev/infiniband");
		/* Only a /sys/class that is softverbs' tmpfs. */
		if (!stat("/sys/class/infiniband/", &st) && umount2("/sys/class", MNT_DETACH) &&
		    errno != EINVAL)
			return fail(errno, "unmounting the view of /sys/class");
		return 0;
	}
	if (present())
		return 0;
	if (!stat("/sys/class/infiniband", &st))
		return fail(EEXIST, "/sys/class/infiniband exists (a kernel RDMA stack?); "
			    "leaving it alone");
	if ((err = dev_nodes("/dev/infiniband", true)) || (err = mirror("/sys/class", NULL)))
		return err;
	return class_dirs("/sys/class");
}
