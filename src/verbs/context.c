/* SPDX-License-Identifier: MIT */
/*
 * Device contexts and their asynchronous events.
 *
 * A context is a full struct verbs_context (rdma-core 44: 648 bytes, `sz`
 * set, abi_compat = __VERBS_ABI_IS_EXTENDED) so that every inline helper
 * in verbs.h reaches softverbs; reference/abi.md §2.2.  Ops left NULL make
 * those inlines answer EOPNOTSUPP, which is the truth for them.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../sv.h"
#include "../engine/engine.h"
#include "../transport/shm/shm.h"
#include "../transport/udp/udp.h"

static void set_ops(struct sv_context *c)
{
	struct verbs_context *v = &c->vctx;
	struct ibv_context_ops *o = &v->context.ops;

	o->poll_cq = sv_poll_cq;
	o->req_notify_cq = sv_req_notify_cq;
	o->post_send = sv_post_send;
	o->post_recv = sv_post_recv;
	o->post_srq_recv = sv_post_srq_recv;
	o->alloc_mw = sv_alloc_mw;
	o->dealloc_mw = sv_dealloc_mw;
	o->bind_mw = sv_bind_mw;

	v->query_port = sv_query_port_op;
	v->query_device_ex = sv_query_device_ex;
	v->create_cq_ex = sv_create_cq_ex;
	v->create_qp_ex = sv_create_qp_ex;
	v->create_srq_ex = sv_create_srq_ex;
	v->open_xrcd = sv_open_xrcd;
	v->close_xrcd = sv_close_xrcd;
	v->get_srq_num = sv_get_srq_num;
	v->post_srq_ops = sv_post_srq_ops;
	v->ibv_create_flow = sv_create_flow;
	v->ibv_destroy_flow = sv_destroy_flow;
	v->create_wq = sv_create_wq;
	v->modify_wq = sv_modify_wq;
	v->destroy_wq = sv_destroy_wq;
	v->create_rwq_ind_table = sv_create_rwq_ind_table;
	v->destroy_rwq_ind_table = sv_destroy_rwq_ind_table;
	v->open_qp = sv_open_qp;
	v->advise_mr = sv_advise_mr;
	v->alloc_td = sv_alloc_td;
	v->dealloc_td = sv_dealloc_td;
	v->alloc_parent_domain = sv_alloc_parent_domain;
	v->alloc_dm = sv_alloc_dm;
	v->free_dm = sv_free_dm;
	v->reg_dm_mr = sv_reg_dm_mr;
}

bool sv_context_live(struct ibv_context *ctx, const char *verb)
{
	if (sv_obj_live(ctx, SV_OBJ_CONTEXT))
		return true;
	sv_fail(EINVAL, verb, "context %p is not an open softverbs context "
		"(closed already, or from another library)", (void *)ctx);
	return false;
}

/*
 * A context with its own segment, endpoint and progress thread.  `home`:
 * the segment of another process's context it is imported from, whose
 * keys and PDs it shares (written into the segment's header before any
 * QP is published, so initiators that find a QP see it).
 */
static struct ibv_context *context_open(struct sv_device *dev, struct shm_hdr *home,
					const char *verb)
{
	struct sv_context *c;
	int ret;

	c = calloc(1, sizeof(*c));
	if (!c)
		return sv_fail_null(ENOMEM, verb, "out of memory");
	c->dev = dev;
	c->home = home;
	c->home_fd = -1;
	c->vctx.sz = sizeof(c->vctx);
	c->vctx.context.abi_compat = __VERBS_ABI_IS_EXTENDED;
	c->vctx.context.device = &dev->ibdev;
	c->vctx.context.cmd_fd = -1;
	c->vctx.context.num_comp_vectors = SV_NUM_COMP_VECTORS;
	pthread_mutex_init(&c->vctx.context.mutex, NULL);
	pthread_mutex_init(&c->lock, NULL);
	set_ops(c);
	c->owner_serve = sv_qp_serve;
	c->tp_mem = &sv_transport_shm;
	c->tp_link = &sv_transport_udp;

	ret = sv_evq_init(&c->async);
	if (ret)
		goto out_free;
	c->vctx.context.async_fd = c->async.fd;
	ret = sv_keytab_init(&c->mrs, SV_MAX_MR);
	if (ret)
		goto out_evq;
	ret = sv_reg_ep_attach(dev->index, &c->ep);
	if (ret) {
		sv_fail(ret, verb, "cannot join the host registry %s: %s",
			sv_reg_path(), strerror(ret));
		goto out_keys;
	}
	/* Peers move bytes into this process with process_vm_writev, which
	 * Yama's ptrace_scope=1 allows only to processes the target names.
	 * Same-user peers are trusted already (docs/architecture.md §7), so
	 * name them all; a stricter scope still refuses, and is explained. */
	prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
	ret = sv_seg_create(&c->seg, c->ep, dev->index);
	if (ret) {
		sv_fail(ret, verb, "cannot create the shared segment in /dev/shm: %s",
			strerror(ret));
		goto out_ep;
	}
	if (home) {
		c->seg.h->home_pid = home->pid;
		c->seg.h->home_ep = home->ep;
		c->seg.h->home_start = home->start_time;
	}
	sv_seg_register_local(c->seg.h, true, sv_defer_solo);
	/* The context's "command fd" names its segment, as the uverbs fd
	 * names a kernel context (and is what ibv_import_device() takes). */
	c->vctx.context.cmd_fd = c->seg.fd;
	/* The port's events are its changes from now on: as with rxe's user
	 * contexts, opening delivers none. */
	c->port_seen = sv_reg_port(dev->index);
	ret = sv_progress_start(c);
	if (ret)
		goto out_seg;
	ret = sv_obj_add(&c->vctx.context, SV_OBJ_CONTEXT, &c->vctx.context);
	if (ret)
		goto out_progress;
	sv_dbg("%s: context %p open, registry endpoint %u", dev->ibdev.name, (void *)c, c->ep);
	return &c->vctx.context;

out_progress:
	sv_progress_stop(c);
out_seg:
	sv_seg_register_local(c->seg.h, false, sv_defer_solo);
	sv_seg_destroy(&c->seg);
out_ep:
	sv_reg_ep_detach(c->ep);
out_keys:
	sv_keytab_destroy(&c->mrs);
out_evq:
	sv_evq_destroy(&c->async);
out_free:
	free(c);
	errno = ret;
	return NULL;
}

SV_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	struct sv_device *dev = sv_device_get(device);

	if (!dev)
		return sv_fail_null(EINVAL, "ibv_open_device", "device %p is not a softverbs device",
				    (void *)device);
	return context_open(dev, NULL, "ibv_open_device");
}

static void release_qp(void *o, void *a) { (void)a; sv_qp_release(o); }
static void release_ah(void *o, void *a) { (void)a; sv_ah_release(o); }
static void release_srq(void *o, void *a) { (void)a; sv_srq_release(o); }
static void release_cq(void *o, void *a) { (void)a; sv_cq_release(o); }
static void release_channel(void *o, void *a) { (void)a; sv_channel_release(o); }

/* As the kernel does for a closed uverbs file: whatever the program did
 * not destroy is destroyed now, users before what they use. */
static void release_objects(struct ibv_context *ctx)
{
	sv_obj_release_all(ctx, SV_OBJ_FLOW, sv_flow_free);
	sv_obj_foreach(ctx, SV_OBJ_QP, release_qp, NULL);
	sv_obj_release_all(ctx, SV_OBJ_RWQ_IND, sv_rwq_ind_free);
	sv_obj_release_all(ctx, SV_OBJ_WQ, sv_wq_free);
	sv_obj_foreach(ctx, SV_OBJ_AH, release_ah, NULL);
	sv_mw_release_all(ctx);
	sv_mr_release_all(ctx);
	sv_dm_release_all(ctx);
	sv_obj_foreach(ctx, SV_OBJ_SRQ, release_srq, NULL);
	sv_xrcd_release_all(ctx);
	sv_obj_foreach(ctx, SV_OBJ_CQ, release_cq, NULL);
	sv_obj_foreach(ctx, SV_OBJ_CHANNEL, release_channel, NULL);
	sv_obj_release_all(ctx, SV_OBJ_PD, sv_pd_release);
	sv_obj_release_all(ctx, SV_OBJ_TD, free);
}

static void context_free(struct sv_context *c)
{
	struct ibv_context *ctx = &c->vctx.context;

	sv_progress_stop(c);
	sv_gpu_forget(c->seg.h);	/* peers' GPU memory it opened */
	release_objects(ctx);
	sv_pkt_ctx_close(c);	/* after its QPs left it */
	sv_reg_ep_detach(c->ep);
	sv_seg_register_local(c->seg.h, false, sv_defer_solo);
	sv_seg_destroy(&c->seg);
	if (c->home_unmap)
		sv_seg_unmap(c->home);
	if (c->home_fd >= 0)
		close(c->home_fd);
	sv_keytab_destroy(&c->mrs);
	sv_evq_destroy(&c->async);
	pthread_mutex_destroy(&c->lock);
	pthread_mutex_destroy(&ctx->mutex);
	free(c);
}

/* Guards imports and closed of every context. */
static pthread_mutex_t import_lock = PTHREAD_MUTEX_INITIALIZER;

SV_EXPORT int ibv_close_device(struct ibv_context *ctx)
{
	if (!sv_obj_del(ctx, SV_OBJ_CONTEXT))
		return sv_fail(EINVAL, "ibv_close_device", "context %p is not open", (void *)ctx), -1;

	struct sv_context *c = sv_ctx(ctx), *self = sv_ctx_self(ctx);
	bool last = true;

	if (self->origin) {
		/* An import: its own objects go; the origin's state stays for
		 * the origin, unless that was closed and this was its last
		 * import. */
		release_objects(ctx);
		close(ctx->cmd_fd);
		pthread_mutex_destroy(&ctx->mutex);
		free(self);
		pthread_mutex_lock(&import_lock);
		last = atomic_fetch_sub(&c->imports, 1) == 1 && c->closed;
		pthread_mutex_unlock(&import_lock);
		if (last)
			context_free(c);
		return 0;
	}
	pthread_mutex_lock(&import_lock);
	c->closed = true;
	last = !atomic_load(&c->imports);
	pthread_mutex_unlock(&import_lock);
	/* The kernel keeps a context alive while an imported fd holds it. */
	if (last)
		context_free(c);
	return 0;
}

static bool same_segment(const void *obj, const void *arg)
{
	const struct sv_context *c = sv_ctx_self((struct ibv_context *)obj);
	const struct stat *want = arg;
	struct stat st;

	return !c->origin && !c->closed && !fstat(c->seg.fd, &st) && st.st_dev == want->st_dev &&
	       st.st_ino == want->st_ino;
}

/*
 * The command fd of another process's context (passed with SCM_RIGHTS or
 * pidfd_getfd): a context of this process whose keys and PDs are the
 * home's (ibv_import_pd, ibv_import_mr by handle, ibv_alloc_pd), and
 * whose queues are its own.  The memory of an imported MR stays the home
 * process's: this process moves bytes in and out of it as it would for
 * any peer (docs/architecture.md §4).  An import of an import is an
 * import of its home.
 */
static struct ibv_context *import_foreign(int cmd_fd)
{
	const char *verb = "ibv_import_device";
	struct shm_hdr *h = sv_seg_map_fd(cmd_fd), *home = h;

	if (!h)
		return sv_fail_null(EINVAL, verb, "fd %d %s", cmd_fd, errno == ESHUTDOWN ?
				    "names a softverbs context that has been closed" :
				    "is not the command fd of a softverbs context");
	if (h->pid == sv_pid()) {
		sv_seg_unmap(h);
		return sv_fail_null(EINVAL, verb, "fd %d names a context of this process that is "
				    "closed", cmd_fd);
	}
	if (h->home_pid)
		home = sv_seg_peer(h->home_ep, h->home_pid, h->home_start);
	struct sv_device *dev = (int)h->dev_index < sv_device_count() ?
				sv_device_at((int)h->dev_index) : NULL;
	if (!home || !sv_proc_alive(home->pid, home->start_time) || !dev) {
		sv_seg_unmap(h);
		return sv_fail_null(EINVAL, verb, "fd %d: %s", cmd_fd, dev ?
				    "the process of the context it names has exited" :
				    "the context is of a device this process does not have");
	}
	struct ibv_context *ctx = context_open(dev, home, verb);
	if (!ctx) {
		sv_seg_unmap(h);
		return NULL;
	}
	struct sv_context *c = sv_ctx_self(ctx);
	/* The import owns cmd_fd; and the mapping, unless the home's is the
	 * peers' cache's. */
	c->home_fd = cmd_fd;
	c->home_unmap = home == h;
	if (home != h)
		sv_seg_unmap(h);
	ctx->cmd_fd = cmd_fd;
	sv_dbg("context %p imported from pid %d", (void *)c, (int)home->pid);
	return ctx;
}

/*
 * rdma-core 44: a second ibv_context on the kernel context behind cmd_fd,
 * sharing its objects by handle (ibv_import_pd, ibv_import_mr,
 * ibv_import_dm); the new context owns cmd_fd.  The fd of a softverbs
 * context is its shared segment, so the context is found by the file.
 */
SV_EXPORT struct ibv_context *ibv_import_device(int cmd_fd)
{
	const char *verb = "ibv_import_device";
	struct stat st;

	if (fstat(cmd_fd, &st))
		return sv_fail_null(EBADF, verb, "fd %d is not open", cmd_fd);
	pthread_mutex_lock(&import_lock);
	struct ibv_context *octx = sv_obj_find(SV_OBJ_CONTEXT, same_segment, &st);
	struct sv_context *o = octx ? sv_ctx(octx) : NULL;
	if (o)
		atomic_fetch_add(&o->imports, 1);
	pthread_mutex_unlock(&import_lock);
	if (!o)
		return import_foreign(cmd_fd);
	struct sv_context *c = calloc(1, sizeof(*c));
	if (!c) {
		atomic_fetch_sub(&o->imports, 1);
		return sv_fail_null(ENOMEM, verb, "out of memory");
	}
	c->origin = o;
	c->dev = o->dev;
	c->tp_mem = o->tp_mem;
	c->tp_link = o->tp_link;
	c->vctx.sz = sizeof(c->vctx);
	c->vctx.context.abi_compat = __VERBS_ABI_IS_EXTENDED;
	c->vctx.context.device = octx->device;
	c->vctx.context.cmd_fd = cmd_fd;
	c->vctx.context.async_fd = octx->async_fd;	/* one event queue, as one kernel context */
	c->vctx.context.num_comp_vectors = octx->num_comp_vectors;
	pthread_mutex_init(&c->vctx.context.mutex, NULL);
	set_ops(c);
	if (sv_obj_add(&c->vctx.context, SV_OBJ_CONTEXT, &c->vctx.context)) {
		pthread_mutex_destroy(&c->vctx.context.mutex);
		free(c);
		atomic_fetch_sub(&o->imports, 1);
		return sv_fail_null(ENOMEM, verb, "out of memory");
	}
	return &c->vctx.context;
}

/* ---- asynchronous events ---- */

void sv_events_settle(struct ibv_context *ctx, struct sv_evq *chq, const void *obj,
		      pthread_mutex_t *m, pthread_cond_t *c,
		      const uint32_t *acked, const uint32_t *reported)
{
	if (chq)
		sv_evq_forget(chq, obj);
	sv_evq_forget(&sv_ctx(ctx)->async, obj);
	pthread_mutex_lock(m);
	while (*acked != *reported)
		pthread_cond_wait(c, m);
	pthread_mutex_unlock(m);
}

/* Which object an event is about (IBA 11.6.3): it decides the union
 * member filled in and which counter the destroy verb waits on. */
enum element { EL_PORT, EL_CQ, EL_QP, EL_SRQ };

static enum element element_of(enum ibv_event_type t)
{
	switch (t) {
	case IBV_EVENT_CQ_ERR:
		return EL_CQ;
	case IBV_EVENT_QP_FATAL: case IBV_EVENT_QP_REQ_ERR: case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST: case IBV_EVENT_SQ_DRAINED: case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR: case IBV_EVENT_QP_LAST_WQE_REACHED:
		return EL_QP;
	case IBV_EVENT_SRQ_ERR: case IBV_EVENT_SRQ_LIMIT_REACHED:
		return EL_SRQ;
	default:
		return EL_PORT;
	}
}

SV_EXPORT int ibv_get_async_event(struct ibv_context *ctx, struct ibv_async_event *event)
{
	struct sv_event e;
	int ret;

	if (!sv_context_live(ctx, "ibv_get_async_event"))
		return -1;
	if (!event)
		return sv_fail(EINVAL, "ibv_get_async_event", "event is NULL"), -1;
	ret = sv_evq_pop(&sv_ctx(ctx)->async, &e);
	if (ret) {
		errno = ret;
		return -1;
	}
	memset(event, 0, sizeof(*event));
	event->event_type = (enum ibv_event_type)e.type;
	/* Counted under the object's mutex: its destroy verb compares the
	 * count with the acknowledgements. */
	switch (element_of(event->event_type)) {
	case EL_CQ:
		event->element.cq = e.obj;
		pthread_mutex_lock(&event->element.cq->mutex);
		sv_cq(e.obj)->async_events_reported++;
		pthread_mutex_unlock(&event->element.cq->mutex);
		break;
	case EL_QP:
		event->element.qp = e.obj;
		pthread_mutex_lock(&event->element.qp->mutex);
		sv_qp(e.obj)->events_reported++;
		pthread_mutex_unlock(&event->element.qp->mutex);
		break;
	case EL_SRQ:
		event->element.srq = e.obj;
		pthread_mutex_lock(&event->element.srq->mutex);
		sv_srq(e.obj)->events_reported++;
		pthread_mutex_unlock(&event->element.srq->mutex);
		break;
	case EL_PORT:
		event->element.port_num = e.port;
		break;
	}
	return 0;
}

static void ack_one(pthread_mutex_t *m, pthread_cond_t *c, uint32_t *completed)
{
	pthread_mutex_lock(m);
	(*completed)++;
	pthread_cond_signal(c);
	pthread_mutex_unlock(m);
}

SV_EXPORT void ibv_ack_async_event(struct ibv_async_event *event)
{
	/* Destroy verbs wait for these counts (rdma-core verbs.c), so a
	 * program can never free an object an event still points at. */
	switch (element_of(event->event_type)) {
	case EL_CQ: {
		struct ibv_cq *cq = event->element.cq;
		ack_one(&cq->mutex, &cq->cond, &cq->async_events_completed);
		break;
	}
	case EL_QP: {
		struct ibv_qp *qp = event->element.qp;
		ack_one(&qp->mutex, &qp->cond, &qp->events_completed);
		break;
	}
	case EL_SRQ: {
		struct ibv_srq *srq = event->element.srq;
		ack_one(&srq->mutex, &srq->cond, &srq->events_completed);
		break;
	}
	case EL_PORT:
		break;
	}
}
