/* SPDX-License-Identifier: MIT */
/*
 * Settings: defaults, then the config file, then SOFTVERBS_* variables.
 *
 * They are read once per process, on the first verb that needs them; a
 * program's device model cannot change under it.  A bad value is reported
 * on stderr, naming the setting and the accepted values, and the default
 * stays in force: the program still runs, and the user sees why.
 */
#define _GNU_SOURCE
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "../sv.h"

static struct sv_config cfg;
static pthread_once_t cfg_once = PTHREAD_ONCE_INIT;

static void bad_value(const char *where, const char *val, const char *accepted)
{
	fprintf(stderr, "softverbs: %s=\"%s\" is not valid (%s); using the default\n",
		where, val, accepted);
}

static bool parse_uint(const char *s, unsigned long max, unsigned long *out)
{
	char *end;

	if (!*s)
		return false;
	errno = 0;
	unsigned long v = strtoul(s, &end, 0);
	if (errno || *end || v > max || s[0] == '-')
		return false;
	*out = v;
	return true;
}

static bool parse_bool(const char *s, int *out)
{
	static const char *const yes[] = { "1", "yes", "true", "on" };
	static const char *const no[] = { "0", "no", "false", "off" };

	for (size_t i = 0; i < SV_ARRAY_SIZE(yes); i++) {
		if (!strcasecmp(s, yes[i]))
			return *out = 1, true;
		if (!strcasecmp(s, no[i]))
			return *out = 0, true;
	}
	return false;
}

/* One setting: its key in the file, and how it is parsed into cfg. */
struct setting {
	const char *key;	/* file key; the variable is SOFTVERBS_<KEY> */
	bool (*apply)(const char *val);
	const char *accepted;
};

static bool set_devices(const char *v)
{
	unsigned long n;

	if (!parse_uint(v, SV_MAX_DEVICES, &n))
		return false;
	cfg.num_devices = (int)n;
	return true;
}

static bool set_device_name(const char *v)
{
	size_t n = strlen(v);

	if (n == 0 || n >= sizeof(cfg.dev_prefix) - 2)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!isalnum((unsigned char)v[i]) && v[i] != '_' && v[i] != '-')
			return false;
	memcpy(cfg.dev_prefix, v, n + 1);
	return true;
}

static bool set_link(const char *v)
{
	if (!strcasecmp(v, "ib") || !strcasecmp(v, "infiniband"))
		cfg.link = SV_LINK_IB;
	else if (!strcasecmp(v, "roce") || !strcasecmp(v, "ethernet") || !strcasecmp(v, "eth"))
		cfg.link = SV_LINK_ROCE;
	else
		return false;
	return true;
}

static bool set_mtu(const char *v)
{
	static const struct { unsigned bytes; enum ibv_mtu mtu; } mtus[] = {
		{ 256, IBV_MTU_256 }, { 512, IBV_MTU_512 }, { 1024, IBV_MTU_1024 },
		{ 2048, IBV_MTU_2048 }, { 4096, IBV_MTU_4096 },
	};
	unsigned long n;

	if (!parse_uint(v, 4096, &n))
		return false;
	for (size_t i = 0; i < SV_ARRAY_SIZE(mtus); i++)
		if (mtus[i].bytes == n)
			return cfg.active_mtu = mtus[i].mtu, true;
	return false;
}

static bool set_part_id(const char *v)
{
	unsigned long n;

	if (!parse_uint(v, UINT32_MAX, &n))
		return false;
	cfg.vendor_part_id = (uint32_t)n;
	return true;
}

static bool set_lid(const char *v)
{
	unsigned long n;

	if (!strcmp(v, "addr")) {
		cfg.lid = 0;
		cfg.lid_addr = true;
		return true;
	}
	if (!parse_uint(v, SV_LID_MAX_UNICAST, &n) || n == 0)
		return false;
	cfg.lid = (uint16_t)n;
	cfg.lid_addr = false;
	return true;
}

static bool set_cm_timeout(const char *v)
{
	unsigned long n;

	if (!parse_uint(v, 31, &n) || n == 0)
		return false;
	cfg.cm_timeout = (uint8_t)n;
	return true;
}

static bool set_transport(const char *v)
{
	if (!strcasecmp(v, "auto"))
		cfg.transport = SV_TRANSPORT_AUTO;
	else if (!strcasecmp(v, "udp"))
		cfg.transport = SV_TRANSPORT_UDP;
	else
		return false;
	return true;
}

static bool set_cm_retries(const char *v)
{
	unsigned long n;

	if (!parse_uint(v, 15, &n))
		return false;
	cfg.cm_retries = (uint8_t)n;
	return true;
}

static bool set_explain(const char *v)
{
	return parse_bool(v, &cfg.explain);
}

static bool set_log(const char *v)
{
	int l = sv_parse_log_level(v);

	if (l < 0)
		return false;
	cfg.log_level = l;
	return true;
}

static bool set_registry(const char *v)
{
	size_t n = strlen(v);

	if (n == 0 || n >= sizeof(cfg.registry) || strchr(v, '/'))
		return false;
	memcpy(cfg.registry, v, n + 1);
	return true;
}

/* v as one of names (case-insensitive): its index in *out. */
static bool keyword(const char *v, const char *const *names, int n, int *out)
{
	for (int i = 0; i < n; i++)
		if (!strcasecmp(v, names[i])) {
			*out = i;
			return true;
		}
	return false;
}

static bool set_copy(const char *v)
{
	static const char *const names[] = { [SV_COPY_AUTO] = "auto", [SV_COPY_CMA] = "cma",
					     [SV_COPY_BOUNCE] = "bounce" };
	int m;

	if (!keyword(v, names, (int)SV_ARRAY_SIZE(names), &m))
		return false;
	cfg.copy = (enum sv_copy_mode)m;
	return true;
}

static bool set_assist(const char *v)
{
	static const char *const names[] = { [SV_ASSIST_AUTO] = "auto", [SV_ASSIST_OFF] = "off",
					     [SV_ASSIST_FORCE] = "force" };
	int m;

	if (!keyword(v, names, (int)SV_ARRAY_SIZE(names), &m))
		return false;
	cfg.assist = (enum sv_assist_mode)m;
	return true;
}

static bool set_ipv4_id(const char *v)
{
	static const char *const names[] = { [SV_IPV4_ID_GSO] = "gso", [SV_IPV4_ID_ANY] = "any" };
	int m;

	if (!keyword(v, names, (int)SV_ARRAY_SIZE(names), &m))
		return false;
	cfg.ipv4_id = (enum sv_ipv4_id)m;
	return true;
}

static const struct setting settings[] = {
	{ "devices", set_devices, "0..8" },
	{ "device_name", set_device_name, "letters, digits, '_' or '-', under 30 characters" },
	{ "link_layer", set_link, "ib or roce" },
	{ "mtu", set_mtu, "256, 512, 1024, 2048 or 4096" },
	{ "vendor_part_id", set_part_id, "a 32-bit number" },
	{ "lid", set_lid, "1..0xbfff, or addr" },
	{ "explain", set_explain, "0/1, yes/no, true/false, on/off" },
	{ "log", set_log, "none, error, warn, info, debug or 0..4" },
	{ "registry", set_registry, "a /dev/shm file name without '/'" },
	{ "copy", set_copy, "auto, cma or bounce" },
	{ "assist", set_assist, "auto, off or force" },
	{ "cm_timeout", set_cm_timeout, "1..31, the CM response timeout's exponent" },
	{ "cm_retries", set_cm_retries, "0..15" },
	{ "transport", set_transport, "auto or udp" },
	{ "ipv4_id", set_ipv4_id, "gso or any" },
};

/* `where` names the source for messages: a variable, or "file:line key". */
static void apply(const char *where, const char *key, const char *val)
{
	for (size_t i = 0; i < SV_ARRAY_SIZE(settings); i++) {
		if (strcasecmp(settings[i].key, key))
			continue;
		if (!settings[i].apply(val))
			bad_value(where, val, settings[i].accepted);
		return;
	}
	fprintf(stderr, "softverbs: %s: unknown setting, ignored\n", where);
}

static char *trim(char *s)
{
	while (isspace((unsigned char)*s))
		s++;
	char *e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = 0;
	return s;
}

static void read_file(const char *path, bool must_exist)
{
	FILE *f = fopen(path, "re");
	char line[512];
	int lineno = 0;

	if (!f) {
		if (must_exist)
			fprintf(stderr, "softverbs: SOFTVERBS_CONFIG=%s: %s\n", path, strerror(errno));
		return;
	}
	snprintf(cfg.source, sizeof(cfg.source), "%s", path);
	while (fgets(line, sizeof(line), f)) {
		char where[300], *s = trim(line), *eq;

		lineno++;
		if (!*s || *s == '#')
			continue;
		eq = strchr(s, '=');
		if (!eq) {
			fprintf(stderr, "softverbs: %s:%d: expected \"key = value\"\n", path, lineno);
			continue;
		}
		*eq = 0;
		snprintf(where, sizeof(where), "%s:%d: %s", path, lineno, trim(s));
		apply(where, trim(s), trim(eq + 1));
	}
	fclose(f);
}

static void load(void)
{
	const char *p, *home;
	char path[256];

	cfg = (struct sv_config){
		.num_devices = 1,
		.dev_prefix = "softverbs",
		.link = SV_LINK_IB,
		.active_mtu = IBV_MTU_4096,
		.vendor_part_id = SV_VENDOR_PART_ID,
		.log_level = SV_LOG_WARN,
		/* rdma_cm's CMA_CM_RESPONSE_TIMEOUT and CMA_MAX_CM_RETRIES */
		.cm_timeout = 20,
		.cm_retries = 15,
	};

	p = getenv("SOFTVERBS_CONFIG");
	if (p && *p) {
		read_file(p, true);
	} else {
		home = getenv("HOME");
		if (home && snprintf(path, sizeof(path), "%s/.config/softverbs.conf", home) < (int)sizeof(path))
			read_file(path, false);
		if (!cfg.source[0])
			read_file("/etc/softverbs.conf", false);
	}

	for (size_t i = 0; i < SV_ARRAY_SIZE(settings); i++) {
		char var[64];

		snprintf(var, sizeof(var), "SOFTVERBS_%s", settings[i].key);
		for (char *c = var; *c; c++)
			*c = (char)toupper((unsigned char)*c);
		p = getenv(var);
		if (p)
			apply(var, settings[i].key, p);
	}
}

/*
 * A stable 64-bit identity of this host (FNV-1a of /etc/machine-id, or of
 * the host name without one).  Every process on the host derives the same
 * GUIDs and LIDs from it.
 */
uint64_t sv_host_hash(void)
{
	char id[256] = "";
	uint64_t h = 1469598103934665603ull;
	FILE *f = fopen("/etc/machine-id", "re");

	if (!f || !fgets(id, sizeof(id), f))
		gethostname(id, sizeof(id) - 1);
	if (f)
		fclose(f);
	for (const char *p = id; *p && *p != '\n'; p++)
		h = (h ^ (uint8_t)*p) * 1099511628211ull;
	/* Each network namespace is a host of its own: its own GUID and LID. */
	uint64_t ns = sv_netns_id();
	for (int i = 0; i < 8; i++)
		h = (h ^ (uint8_t)(ns >> (8 * i))) * 1099511628211ull;
	return h;
}

/*
 * This process's pid, without a system call: glibc no longer caches
 * getpid(), and the data path compares pids on every operation (a system
 * call costs about 1 us on the machines this runs on).  A forked child
 * starts with the cache cleared.
 */
static _Atomic int32_t self_pid;

static void forget_pid(void)
{
	atomic_store_explicit(&self_pid, 0, memory_order_relaxed);
}

static void __attribute__((constructor)) watch_fork(void)
{
	pthread_atfork(NULL, NULL, forget_pid);
}

bool sv_prefetchw_ok;

static void __attribute__((constructor)) probe_cpu(void)
{
#if defined(__x86_64__) || defined(__i386__)
	unsigned a, b, c, d;

	sv_prefetchw_ok = __get_cpuid(0x80000001, &a, &b, &c, &d) && (c & bit_PRFCHW);
#endif
}

int32_t sv_pid(void)
{
	int32_t p = atomic_load_explicit(&self_pid, memory_order_relaxed);

	if (!p) {
		p = (int32_t)getpid();
		atomic_store_explicit(&self_pid, p, memory_order_relaxed);
	}
	return p;
}

const struct sv_config *sv_config(void)
{
	pthread_once(&cfg_once, load);
	return &cfg;
}

/* For librdmacm.so.1, which is softverbs' too but links only the public
 * verbs (SOFTVERBS_PRIVATE_1 in libibverbs.map). */
SV_EXPORT int softverbs_cm_setting(const char *key)
{
	const struct sv_config *c = sv_config();

	if (!strcmp(key, "cm_timeout"))
		return c->cm_timeout;
	if (!strcmp(key, "cm_retries"))
		return c->cm_retries;
	return -1;
}
