/* SPDX-License-Identifier: MIT */
/*
 * lkey/rkey tables.  A key is (index << 8) | key byte, as in rxe_pool.c.
 *
 * Freed slots go to the tail of a FIFO and new keys come from its head, so
 * a slot is reused as late as possible; each reuse also bumps the key byte.
 * A stale key therefore misses unless both the slot has been recycled and
 * 256 generations have passed.  Index 0 is never handed out, so key 0 is
 * never valid.  The table grows on demand up to its maximum.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../sv.h"

int sv_keytab_init(struct sv_keytab *t, uint32_t max)
{
	memset(t, 0, sizeof(*t));
	t->max = max;
	return pthread_mutex_init(&t->lock, NULL);
}

void sv_keytab_destroy(struct sv_keytab *t)
{
	free(t->slots);
	pthread_mutex_destroy(&t->lock);
	memset(t, 0, sizeof(*t));
}

static void push_free(struct sv_keytab *t, uint32_t idx)
{
	t->slots[idx].next_free = 0;
	if (t->free_tail)
		t->slots[t->free_tail].next_free = idx;
	else
		t->free_head = idx;
	t->free_tail = idx;
}

static int grow(struct sv_keytab *t)
{
	uint32_t ncap = t->cap ? t->cap * 2 : 64;

	if (ncap > t->max + 1)
		ncap = t->max + 1;
	if (ncap <= t->cap)
		return ENOMEM;
	struct sv_key_slot *n = realloc(t->slots, ncap * sizeof(*n));
	if (!n)
		return ENOMEM;
	memset(n + t->cap, 0, (ncap - t->cap) * sizeof(*n));
	t->slots = n;
	for (uint32_t i = t->cap ? t->cap : 1; i < ncap; i++) {
		/* Seed key bytes differently per slot so that keys of
		 * different slots rarely share a low byte. */
		n[i].key = (uint8_t)(i * 37u + 11u);
		push_free(t, i);
	}
	t->cap = ncap;
	return 0;
}

int sv_keytab_alloc(struct sv_keytab *t, void *obj, uint8_t kind, uint32_t *key)
{
	int ret = 0;

	pthread_mutex_lock(&t->lock);
	if (!t->free_head && t->used < t->max)
		ret = grow(t);
	if (!ret && !t->free_head)
		ret = ENOMEM;
	if (!ret) {
		uint32_t idx = t->free_head;
		struct sv_key_slot *s = &t->slots[idx];

		t->free_head = s->next_free;
		if (!t->free_head)
			t->free_tail = 0;
		s->obj = obj;
		s->kind = kind;
		t->used++;
		*key = idx << 8 | s->key;
	}
	pthread_mutex_unlock(&t->lock);
	return ret;
}

static struct sv_key_slot *slot_of(struct sv_keytab *t, uint32_t key)
{
	uint32_t idx = key >> 8;

	if (!idx || idx >= t->cap)
		return NULL;
	struct sv_key_slot *s = &t->slots[idx];
	return s->obj && s->key == (uint8_t)key ? s : NULL;
}

void sv_keytab_free(struct sv_keytab *t, uint32_t key)
{
	pthread_mutex_lock(&t->lock);
	struct sv_key_slot *s = slot_of(t, key);
	if (s) {
		s->obj = NULL;
		s->key++;
		t->used--;
		push_free(t, key >> 8);
	}
	pthread_mutex_unlock(&t->lock);
}

void *sv_keytab_lookup(struct sv_keytab *t, uint32_t key, uint8_t kind)
{
	pthread_mutex_lock(&t->lock);
	struct sv_key_slot *s = slot_of(t, key);
	void *obj = s && s->kind == kind ? s->obj : NULL;
	pthread_mutex_unlock(&t->lock);
	return obj;
}

int sv_keytab_rekey(struct sv_keytab *t, uint32_t key, uint32_t new_key)
{
	int ret = EINVAL;

	pthread_mutex_lock(&t->lock);
	struct sv_key_slot *s = slot_of(t, key);
	if (s && (new_key >> 8) == (key >> 8)) {
		s->key = (uint8_t)new_key;
		ret = 0;
	}
	pthread_mutex_unlock(&t->lock);
	return ret;
}
