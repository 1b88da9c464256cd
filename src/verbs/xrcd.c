/* SPDX-License-Identifier: MIT */
/*
 * XRC domains.  A domain only has to be an identity that XRC target QPs
 * and XRC SRQs are compared by when a message arrives (engine/resp.c):
 * a private domain gets an id no other domain has, and a domain opened on
 * a file gets the file's, so every process that opens that file -- as
 * ibv_xsrq_pingpong's server and clients do -- is in the same domain.
 *
 * O_EXCL refuses a second open of the same file in this process.  Without
 * O_CREAT the kernel refuses a file no process has opened a domain on;
 * softverbs cannot see other processes' domains, so it accepts any file.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "../sv.h"

#define PRIVATE_ID (1ull << 63)

/* The file-backed domains open in this process, for O_EXCL. */
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sv_xrcd *open_list[64];

static bool id_open(uint64_t id)
{
	bool found = false;

	for (size_t i = 0; i < SV_ARRAY_SIZE(open_list) && !found; i++)
		found = open_list[i] && open_list[i]->id == id;
	return found;
}

static void track(struct sv_xrcd *x, bool add)
{
	for (size_t i = 0; i < SV_ARRAY_SIZE(open_list); i++) {
		if (open_list[i] == (add ? NULL : x)) {
			open_list[i] = add ? x : NULL;
			return;
		}
	}
}

struct ibv_xrcd *sv_open_xrcd(struct ibv_context *ctx, struct ibv_xrcd_init_attr *attr)
{
	const char *verb = "ibv_open_xrcd";
	static atomic_uint next_private;
	uint64_t id;

	if (!sv_context_live(ctx, verb))
		return NULL;
	if (!attr || (attr->comp_mask & ~(uint32_t)(IBV_XRCD_INIT_ATTR_FD |
						     IBV_XRCD_INIT_ATTR_OFLAGS)))
		return sv_fail_null(EINVAL, verb, "comp_mask 0x%x: FD and OFLAGS are the fields",
				    attr ? attr->comp_mask : 0);
	int fd = attr->comp_mask & IBV_XRCD_INIT_ATTR_FD ? attr->fd : -1;
	int oflags = attr->comp_mask & IBV_XRCD_INIT_ATTR_OFLAGS ? attr->oflags : 0;
	if (oflags & ~(O_CREAT | O_EXCL))
		return sv_fail_null(EINVAL, verb, "oflags 0x%x: only O_CREAT and O_EXCL apply",
				    (unsigned)oflags);
	if (fd >= 0) {
		struct stat st;
		if (fstat(fd, &st))
			return sv_fail_null(EBADF, verb, "fd %d is not an open file", fd);
		id = ((uint64_t)st.st_dev << 40 ^ (uint64_t)st.st_ino) & ~PRIVATE_ID;
	} else {
		id = PRIVATE_ID | (uint64_t)sv_pid() << 24 | (atomic_fetch_add(&next_private, 1) & 0xffffff);
	}
	struct sv_xrcd *x = calloc(1, sizeof(*x));
	if (!x)
		return sv_fail_null(ENOMEM, verb, "out of memory");
	x->ibxrcd.context = ctx;
	x->id = id;
	pthread_mutex_lock(&open_lock);
	int err = fd >= 0 && (oflags & O_EXCL) && id_open(id) ? EEXIST :
		  sv_obj_add(x, SV_OBJ_XRCD, ctx) ? ENOMEM : 0;
	if (!err && fd >= 0)
		track(x, true);
	pthread_mutex_unlock(&open_lock);
	if (err) {
		free(x);
		return sv_fail_null(err, verb, "%s", err == EEXIST ? "O_EXCL: a domain is open on "
				    "this file already" : "out of memory");
	}
	return &x->ibxrcd;
}

static void xrcd_free(void *obj)
{
	pthread_mutex_lock(&open_lock);
	track(obj, false);
	pthread_mutex_unlock(&open_lock);
	free(obj);
}

int sv_close_xrcd(struct ibv_xrcd *ib)
{
	struct sv_xrcd *x = sv_xrcd(ib);

	if (!sv_obj_live(ib, SV_OBJ_XRCD))
		return sv_fail(EINVAL, "ibv_close_xrcd", "XRCD %p is not open", (void *)ib);
	if (atomic_load(&x->users))
		return sv_fail(EBUSY, "ibv_close_xrcd", "the domain still has %u XRC SRQs or "
			       "XRC_RECV QPs; destroy them first", atomic_load(&x->users));
	sv_obj_del(ib, SV_OBJ_XRCD);
	xrcd_free(x);
	return 0;
}

/* A closing context's domains: their users went first. */
void sv_xrcd_release_all(struct ibv_context *ctx)
{
	sv_obj_release_all(ctx, SV_OBJ_XRCD, xrcd_free);
}

bool sv_xrcd_of(struct ibv_xrcd *ib, struct ibv_context *ctx, const char *verb)
{
	if (ib && sv_obj_live(ib, SV_OBJ_XRCD) && sv_same_ctx(ib->context, ctx))
		return true;
	sv_fail(EINVAL, verb, "xrcd %p is not an open XRC domain of this context", (void *)ib);
	return false;
}
