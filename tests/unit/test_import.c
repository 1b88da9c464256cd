/* SPDX-License-Identifier: MIT */
/*
 * Imports (rdma-core 44): a second context on a context's command fd, and
 * its PD, MR and DM by handle, used together with the original's objects;
 * and the lifetime rule that the shared state lives until the original
 * and every import are closed.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <sys/socket.h>

#include "helpers.h"
#include "pair.h"

static void test_import_objects(void **state)
{
	(void)state;
	struct end a, peer;

	end_open(&a, &rc_default);
	end_open(&peer, &rc_default);
	errno = 0;
	assert_null(ibv_import_device(-1));
	assert_int_equal(errno, EBADF);
	int other = open("/dev/null", O_RDWR);
	errno = 0;
	assert_null(ibv_import_device(other));
	assert_int_equal(errno, EINVAL);	/* not a softverbs command fd */
	close(other);

	struct ibv_context *b = ibv_import_device(dup(a.ctx->cmd_fd));
	assert_non_null(b);
	assert_ptr_not_equal(b, a.ctx);
	assert_ptr_equal(b->device, a.ctx->device);
	/* The PD and MR are the original objects, found by handle (so their
	 * context field names the original context). */
	struct ibv_pd *pd = ibv_import_pd(b, a.pd->handle);
	assert_ptr_equal(pd, a.pd);
	struct ibv_mr *mr = ibv_import_mr(pd, a.mr->handle);
	assert_ptr_equal(mr, a.mr);
	assert_int_equal(mr->rkey, a.mr->rkey);
	errno = 0;
	assert_null(ibv_import_pd(b, a.pd->handle + 1000));
	assert_int_equal(errno, EINVAL);
	errno = 0;
	assert_null(ibv_import_mr(pd, a.mr->handle + 0x100));
	assert_int_equal(errno, EINVAL);
	/* A PD of another context is not this context's to import. */
	errno = 0;
	assert_null(ibv_import_pd(b, peer.pd->handle));
	assert_int_equal(errno, EINVAL);

	/* Objects of the import work with the imported PD and MR: a QP and
	 * CQ of b, WRITE from peer into the imported MR, READ back by b. */
	struct ibv_cq *cq = ibv_create_cq(b, 16, NULL, NULL, 0);
	assert_non_null(cq);
	struct ibv_qp_init_attr_ex ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
					  .cap = { 8, 8, 1, 1, 0 }, .pd = pd,
					  /* With only PD set, verbs.h routes to ibv_create_qp(pd). */
					  .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
					  .send_ops_flags = IBV_QP_EX_WITH_RDMA_READ };
	struct ibv_qp *qp = ibv_create_qp_ex(b, &ia);
	assert_non_null(qp);
	assert_ptr_equal(qp->context, b);
	struct end bend = a;	/* b's side, with a's port and gid */
	bend.qp = qp;
	bend.cq = cq;
	connect_qp(qp, &peer, peer.qp->qp_num, &rc_default);
	connect_qp(peer.qp, &bend, qp->qp_num, &rc_default);
	strcpy(peer.buf, "into an imported MR");
	assert_int_equal(post(&peer, IBV_WR_RDMA_WRITE, peer.buf, 32, peer.mr->lkey,
			      (uintptr_t)a.buf + 64, mr->rkey, 1, IBV_SEND_SIGNALED), 0);
	assert_int_equal(poll_one(peer.cq).status, IBV_WC_SUCCESS);
	assert_string_equal(a.buf + 64, "into an imported MR");
	assert_int_equal(post(&bend, IBV_WR_RDMA_READ, a.buf + 256, 32, mr->lkey,
			      (uintptr_t)peer.buf, peer.mr->rkey, 2, IBV_SEND_SIGNALED), 0);
	assert_int_equal(poll_one(cq).status, IBV_WC_SUCCESS);
	assert_string_equal(a.buf + 256, "into an imported MR");

	/* Device memory by handle, through the import. */
	struct ibv_alloc_dm_attr da = { .length = 64 };
	struct ibv_dm *dm = ibv_alloc_dm(a.ctx, &da);
	struct ibv_dm *idm = ibv_import_dm(b, dm->handle);
	assert_non_null(idm);
	uint32_t v = 7, w = 0;
	assert_int_equal(ibv_memcpy_to_dm(dm, 0, &v, 4), 0);
	assert_int_equal(ibv_memcpy_from_dm(&w, idm, 0, 4), 0);
	assert_int_equal(w, 7);
	ibv_unimport_dm(idm);
	assert_int_equal(ibv_free_dm(dm), 0);

	/* Closing the original first: the import still works (the kernel
	 * keeps a context while an imported fd holds it). */
	ibv_unimport_mr(mr);
	ibv_unimport_pd(pd);
	assert_int_equal(ibv_destroy_qp(peer.qp), 0);
	peer.qp = NULL;
	a.qp = NULL;
	assert_int_equal(ibv_destroy_qp(qp), 0);
	assert_int_equal(ibv_close_device(a.ctx), 0);
	struct ibv_wc wc;
	assert_int_equal(ibv_poll_cq(cq, 1, &wc), 0);
	struct ibv_pd *pd2 = ibv_alloc_pd(b);
	assert_non_null(pd2);
	assert_int_equal(ibv_close_device(b), 0);	/* frees pd2, cq and the original's state */
	free(a.buf);
	end_close(&peer);
}

/* ---- across processes: the command fd passed with SCM_RIGHTS ---- */

struct home_info {
	uint32_t pd, mr, other_mr, dm;
	uint64_t addr;
	uint32_t importer_pd;	/* back to the home: a PD the importer allocated */
};

static void send_fd(int sock, int fd, const struct home_info *h)
{
	char cbuf[CMSG_SPACE(sizeof(int))] = { 0 };
	struct iovec iov = { (void *)h, sizeof(*h) };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
			    .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *c = CMSG_FIRSTHDR(&m);

	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(int));
	assert_int_equal(sendmsg(sock, &m, 0), sizeof(*h));
}

static int recv_fd(int sock, struct home_info *h)
{
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { h, sizeof(*h) };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
			    .msg_controllen = sizeof(cbuf) };
	int fd = -1;

	if (recvmsg(sock, &m, 0) != sizeof(*h) || !CMSG_FIRSTHDR(&m))
		return -1;
	memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof(int));
	return fd;
}

/* In the importing process: a QP of the import on the imported PD,
 * connected to a peer context of the importer's own. */
static bool import_pair(struct ibv_context *b, struct ibv_pd *pd, struct ibv_mr *mr, struct end *p,
			struct end *bend)
{
	*bend = (struct end){ .ctx = b, .pd = pd, .mr = mr };
	end_open(p, &rc_default);
	bend->cq = ibv_create_cq(b, 64, NULL, NULL, 0);
	struct ibv_qp_init_attr ia = { .send_cq = bend->cq, .recv_cq = bend->cq,
				       .qp_type = IBV_QPT_RC, .cap = { 16, 16, 2, 2, 0 } };
	bend->qp = bend->cq ? ibv_create_qp(pd, &ia) : NULL;
	if (!bend->qp)
		return false;
	bend->port = p->port;
	bend->gid = p->gid;
	connect_qp(bend->qp, p, p->qp->qp_num, &rc_default);
	connect_qp(p->qp, bend, bend->qp->qp_num, &rc_default);
	return true;
}

/* Forks the importing process running fn on its end of a socket pair;
 * *sock is the home's end. */
static pid_t fork_importer(int (*fn)(int), int *sock)
{
	int sv[2];

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	pid_t pid = fix_fork();
	assert_true(pid >= 0);
	if (!pid) {
		close(sv[0]);
		_exit(fn(sv[1]));
	}
	close(sv[1]);
	*sock = sv[0];
	return pid;
}

/*
 * The importing process: its context on the home's command fd, the home's
 * PD and MR by handle, a QP of its own on that PD, and a peer context of
 * its own.  Every byte of the imported MR is in the home process.  Returns
 * 0 or the step that failed.
 */
static int importer(int sock)
{
	struct home_info h;
	int fd = recv_fd(sock, &h);
	char *home = (char *)(uintptr_t)h.addr;	/* an address in the home process */
	char ok;

	struct ibv_context *b = fd >= 0 ? ibv_import_device(fd) : NULL;
	if (!b || b->cmd_fd != fd)
		return 1;
	errno = 0;
	if (ibv_import_pd(b, h.pd ^ 0x10000) || errno != EINVAL)
		return 2;
	struct ibv_pd *pd = ibv_import_pd(b, h.pd);
	if (!pd || pd->handle != h.pd || ibv_import_pd(b, h.pd) != pd)
		return 3;
	errno = 0;
	if (ibv_import_mr(pd, h.other_mr) || errno != EINVAL)	/* another PD's */
		return 4;
	struct ibv_mr *mr = ibv_import_mr(pd, h.mr);
	if (!mr || mr->lkey != h.mr || mr->rkey != h.mr || mr->length != BUF || mr->addr)
		return 5;
	/* The key table is the home's: registering is the home's to do. */
	static char mine[64];
	errno = 0;
	if (ibv_reg_mr(pd, mine, sizeof(mine), IBV_ACCESS_LOCAL_WRITE) || errno != EOPNOTSUPP)
		return 6;
	/* Device memory of the home, by handle. */
	struct ibv_dm *dm = ibv_import_dm(b, h.dm);
	uint64_t v = 0;
	if (!dm || ibv_memcpy_from_dm(&v, dm, 0, 8) || v != 0x5eed)
		return 7;
	v = 0xfeed;
	if (ibv_memcpy_to_dm(dm, 8, &v, 8))
		return 8;
	ibv_unimport_dm(dm);

	struct end p, bend;
	if (!import_pair(b, pd, mr, &p, &bend))
		return 9;

	/* SEND from the home's memory, through the import's QP. */
	post_recv(&p, p.buf, 64, 0x10);
	if (post(&bend, IBV_WR_SEND, home, 32, mr->lkey, 0, 0, 0x11, IBV_SEND_SIGNALED) ||
	    !wc_ok(bend.cq, 0x11) || !wc_ok(p.cq, 0x10) || strcmp(p.buf, "in the home's memory"))
		return 10;
	/* WRITE, READ and atomic from the peer, with the home's rkey, through
	 * the import's QP. */
	strcpy(p.buf + 256, "written through the import");
	if (post(&p, IBV_WR_RDMA_WRITE, p.buf + 256, 32, p.mr->lkey, h.addr + 1024, mr->rkey,
		 0x20, IBV_SEND_SIGNALED) || !wc_ok(p.cq, 0x20))
		return 11;
	if (post(&p, IBV_WR_RDMA_READ, p.buf + 512, 32, p.mr->lkey, h.addr, mr->rkey, 0x21,
		 IBV_SEND_SIGNALED) || !wc_ok(p.cq, 0x21) || strcmp(p.buf + 512, "in the home's memory"))
		return 12;
	if (post(&p, IBV_WR_ATOMIC_FETCH_AND_ADD, p.buf + 768, 8, p.mr->lkey, h.addr + 4096,
		 mr->rkey, 0x22, IBV_SEND_SIGNALED) || !wc_ok(p.cq, 0x22) ||
	    *(uint64_t *)(p.buf + 768) != 40)
		return 13;
	/* READ by the import's QP into the home's memory, and a SEND received
	 * into it. */
	strcpy(p.buf + 1024, "read into the home");
	if (post(&bend, IBV_WR_RDMA_READ, home + 2048, 32, mr->lkey, (uintptr_t)p.buf + 1024,
		 p.mr->rkey, 0x30, IBV_SEND_SIGNALED) || !wc_ok(bend.cq, 0x30))
		return 14;
	post_recv(&bend, home + 3072, 64, 0x31);
	strcpy(p.buf + 1280, "received in the home");
	if (post(&p, IBV_WR_SEND, p.buf + 1280, 32, p.mr->lkey, 0, 0, 0x32, IBV_SEND_SIGNALED) ||
	    !wc_ok(p.cq, 0x32) || !wc_ok(bend.cq, 0x31))
		return 15;
	/* A PD allocated here is one of the home's too. */
	struct ibv_pd *mine_pd = ibv_alloc_pd(b);
	if (!mine_pd)
		return 16;
	h.importer_pd = mine_pd->handle;
	if (write(sock, &h, sizeof(h)) != sizeof(h) || read(sock, &ok, 1) != 1 || ok != 'y')
		return 16;	/* the home found the bytes, and the PD */
	if (ibv_dealloc_pd(mine_pd))
		return 16;

	/* The PD has the home's MR and this process's QP: busy everywhere. */
	errno = 0;
	if (ibv_dealloc_pd(pd) != EBUSY)
		return 17;
	/* Deregistering through the import destroys the MR for every
	 * process: its rkey fails from here, as a deregistered one. */
	if (ibv_dereg_mr(mr))
		return 18;
	if (post(&p, IBV_WR_RDMA_WRITE, p.buf + 256, 8, p.mr->lkey, h.addr + 1024, h.mr, 0x40,
		 IBV_SEND_SIGNALED) || poll_one(p.cq).status != IBV_WC_REM_ACCESS_ERR)
		return 19;
	ibv_destroy_qp(bend.qp);
	ibv_destroy_cq(bend.cq);
	ibv_unimport_pd(pd);
	if (ibv_close_device(b))
		return 20;
	end_close(&p);
	return write(sock, "d", 1) == 1 ? 0 : 21;
}

static void test_import_across_processes(void **state)
{
	(void)state;
	int sock;
	char c;
	pid_t pid = fork_importer(importer, &sock);

	/* The home: private memory, an MR in one PD and another in a
	 * second PD, device memory. */
	struct end a;
	end_open(&a, &rc_default);
	strcpy(a.buf, "in the home's memory");
	*(uint64_t *)(a.buf + 4096) = 40;
	struct ibv_pd *pd2 = ibv_alloc_pd(a.ctx);
	struct ibv_mr *other = ibv_reg_mr(pd2, a.buf, 64, IBV_ACCESS_LOCAL_WRITE);
	assert_non_null(other);
	struct ibv_alloc_dm_attr da = { .length = 64 };
	struct ibv_dm *dm = ibv_alloc_dm(a.ctx, &da);
	assert_non_null(dm);
	uint64_t v = 0x5eed;
	assert_int_equal(ibv_memcpy_to_dm(dm, 0, &v, 8), 0);
	struct home_info h = { a.pd->handle, a.mr->handle, other->handle, dm->handle,
			       (uintptr_t)a.buf, 0 };
	send_fd(sock, a.ctx->cmd_fd, &h);

	/* A failed importer closes its end: its exit status names the step. */
	if (read(sock, &h, sizeof(h)) != sizeof(h))
		assert_child_ok(pid, "importer");
	assert_string_equal(a.buf + 1024, "written through the import");
	assert_string_equal(a.buf + 2048, "read into the home");
	assert_string_equal(a.buf + 3072, "received in the home");
	assert_int_equal(*(uint64_t *)(a.buf + 4096), 41);
	assert_int_equal(ibv_memcpy_from_dm(&v, dm, 8, 8), 0);
	assert_int_equal(v, 0xfeed);
	struct ibv_pd *ipd = ibv_import_pd(a.ctx, h.importer_pd);
	assert_non_null(ipd);
	assert_int_equal(ipd->handle, h.importer_pd);
	ibv_unimport_pd(ipd);
	assert_int_equal(write(sock, "y", 1), 1);
	if (read(sock, &c, 1) != 1)
		assert_child_ok(pid, "importer");
	assert_child_ok(pid, "importer");
	assert_int_equal(ibv_dereg_mr(other), 0);
	assert_int_equal(ibv_free_dm(dm), 0);
	assert_int_equal(ibv_dealloc_pd(pd2), 0);
	end_close(&a);
	close(sock);
}

/* The importer of a home that closes: the home's MRs went with it (their
 * keys revoked), so the importer's use of them fails as with a
 * deregistered MR; its own objects still work and close. */
static int orphan(int sock)
{
	struct home_info h;
	int fd = recv_fd(sock, &h);
	char *home = (char *)(uintptr_t)h.addr, c;
	struct ibv_context *b = fd >= 0 ? ibv_import_device(fd) : NULL;
	struct ibv_pd *pd = b ? ibv_import_pd(b, h.pd) : NULL;
	struct ibv_mr *mr = pd ? ibv_import_mr(pd, h.mr) : NULL;

	if (!mr)
		return 1;
	struct end p, bend;
	if (!import_pair(b, pd, mr, &p, &bend))
		return 2;
	if (write(sock, "i", 1) != 1 || read(sock, &c, 1) != 1)
		return 3;
	/* The home has closed its context. */
	errno = 0;
	if (ibv_import_mr(pd, h.mr) || errno != EINVAL)
		return 4;
	post_recv(&p, p.buf, 64, 0x10);
	if (post(&bend, IBV_WR_SEND, home, 32, mr->lkey, 0, 0, 0x11, IBV_SEND_SIGNALED) ||
	    poll_one(bend.cq).status != IBV_WC_LOC_PROT_ERR)
		return 5;
	errno = 0;
	if (ibv_import_device(dup(fd)) || errno != EINVAL)
		return 6;
	ibv_destroy_qp(bend.qp);
	ibv_destroy_cq(bend.cq);
	ibv_unimport_mr(mr);
	ibv_unimport_pd(pd);
	if (ibv_close_device(b))
		return 7;
	end_close(&p);
	return 0;
}

static void test_home_closes(void **state)
{
	(void)state;
	int sock;
	char c;
	pid_t pid = fork_importer(orphan, &sock);
	struct end a;
	end_open(&a, &rc_default);
	struct home_info h = { a.pd->handle, a.mr->handle, 0, 0, (uintptr_t)a.buf, 0 };
	send_fd(sock, a.ctx->cmd_fd, &h);
	if (read(sock, &c, 1) != 1)
		assert_child_ok(pid, "importer");
	/* Closing with everything still in place: the kernel would keep the
	 * objects for the importer's fd; softverbs' are this process's. */
	ibv_destroy_qp(a.qp);
	assert_int_equal(ibv_close_device(a.ctx), 0);
	assert_int_equal(write(sock, "x", 1), 1);
	assert_child_ok(pid, "importer");
	free(a.buf);
	close(sock);
}

int main(void)
{
	devs = ibv_get_device_list(NULL);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_import_objects),
		cmocka_unit_test(test_import_across_processes),
		cmocka_unit_test(test_home_closes),
	};
	int r = cmocka_run_group_tests(tests, NULL, NULL);
	ibv_free_device_list(devs);
	return r;
}
