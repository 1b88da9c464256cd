/* SPDX-License-Identifier: MIT */
/*
 * The set of live verbs objects: an open-addressing hash keyed by pointer.
 *
 * It turns the classic verbs crash -- destroying an object twice, or
 * passing a CQ of one context to a QP of another -- into EINVAL.  A freed
 * address that malloc hands out again is indistinguishable from the new
 * object; that limit is inherent to pointer handles and documented.
 * Control-plane verbs only: the data path never takes this lock.
 */
#include <errno.h>
#include <stdlib.h>

#include "../sv.h"

struct slot {
	const void *obj;		/* NULL: empty; TOMB: deleted */
	struct ibv_context *ctx;
	enum sv_obj_type type;
};

#define TOMB ((const void *)1)

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct slot *tab;
static size_t cap, used;	/* used counts live + tombstones */

static size_t hash(const void *p)
{
	uint64_t x = (uint64_t)(uintptr_t)p;

	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	return (size_t)x;
}

static struct slot *find(const void *obj)
{
	if (!cap)
		return NULL;
	for (size_t i = hash(obj) & (cap - 1);; i = (i + 1) & (cap - 1)) {
		if (tab[i].obj == obj)
			return &tab[i];
		if (!tab[i].obj)
			return NULL;
	}
}

static int grow(void)
{
	size_t ncap = cap ? cap * 2 : 256;
	struct slot *old = tab, *n = calloc(ncap, sizeof(*n));
	size_t ocap = cap;

	if (!n)
		return ENOMEM;
	tab = n;
	cap = ncap;
	used = 0;
	for (size_t i = 0; i < ocap; i++) {
		if (!old[i].obj || old[i].obj == TOMB)
			continue;
		size_t j = hash(old[i].obj) & (cap - 1);
		while (tab[j].obj)
			j = (j + 1) & (cap - 1);
		tab[j] = old[i];
		used++;
	}
	free(old);
	return 0;
}

int sv_obj_add(void *obj, enum sv_obj_type type, struct ibv_context *ctx)
{
	int ret = 0;

	pthread_mutex_lock(&lock);
	if ((used + 1) * 2 > cap)
		ret = grow();
	if (!ret) {
		size_t i = hash(obj) & (cap - 1);
		while (tab[i].obj && tab[i].obj != TOMB)
			i = (i + 1) & (cap - 1);
		if (!tab[i].obj)
			used++;
		tab[i] = (struct slot){ obj, ctx, type };
	}
	pthread_mutex_unlock(&lock);
	return ret;
}

bool sv_obj_live(const void *obj, enum sv_obj_type type)
{
	bool live;

	if (!obj)
		return false;
	pthread_mutex_lock(&lock);
	struct slot *s = find(obj);
	live = s && s->type == type;
	pthread_mutex_unlock(&lock);
	return live;
}

bool sv_obj_del(const void *obj, enum sv_obj_type type)
{
	bool was;

	if (!obj)
		return false;
	pthread_mutex_lock(&lock);
	struct slot *s = find(obj);
	was = s && s->type == type;
	if (was)
		s->obj = TOMB;
	pthread_mutex_unlock(&lock);
	return was;
}

void sv_obj_foreach(struct ibv_context *ctx, enum sv_obj_type type,
		    void (*fn)(void *obj, void *arg), void *arg)
{
	/* Collect first: fn destroys objects and so edits the table. */
	void **objs = NULL;
	size_t n = 0;

	pthread_mutex_lock(&lock);
	if (cap)
		objs = malloc(cap * sizeof(*objs));
	for (size_t i = 0; objs && i < cap; i++)
		if (tab[i].obj && tab[i].obj != TOMB && tab[i].ctx == ctx && tab[i].type == type)
			objs[n++] = (void *)tab[i].obj;
	pthread_mutex_unlock(&lock);
	for (size_t i = 0; i < n; i++)
		fn(objs[i], arg);
	free(objs);
}

void *sv_obj_find(enum sv_obj_type type, bool (*match)(const void *obj, const void *arg),
		  const void *arg)
{
	const void *found = NULL;

	pthread_mutex_lock(&lock);
	for (size_t i = 0; i < cap && !found; i++)
		if (tab[i].obj && tab[i].obj != TOMB && tab[i].type == type && match(tab[i].obj, arg))
			found = tab[i].obj;
	pthread_mutex_unlock(&lock);
	return (void *)found;
}

struct release {
	enum sv_obj_type type;
	void (*free_fn)(void *obj);
};

static void release_one(void *obj, void *arg)
{
	const struct release *r = arg;

	if (sv_obj_del(obj, r->type))
		r->free_fn(obj);
}

void sv_obj_release_all(struct ibv_context *ctx, enum sv_obj_type type, void (*free_fn)(void *obj))
{
	struct release r = { type, free_fn };

	sv_obj_foreach(ctx, type, release_one, &r);
}
