// A test host for Envoy dynamic modules, written from the ABI ("v0.1.0",
// Envoy 1.38) and sharing no code with the module it judges. It dlopens a
// module with RTLD_NOW, provides the callbacks a module may reference
// (exported from this executable, linked with -rdynamic), and runs a script
// read from stdin: one command per line (see run_script and stream_cmd).
// The script's thread plays Envoy's main thread (program init, config new
// and destroy); each simulated Envoy worker is a thread of its own running
// its dispatcher loop, as Envoy's worker does: a stream's hooks, the
// scheduler events committed to it (from any thread) and its callouts'
// completions all run there, and so do the script's commands about the
// worker's streams.
//
// Build: cc -O2 -pthread -rdynamic -o host host.c -ldl
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

// ---- ABI types (layouts from Envoy's abi.h) ----
typedef struct { const char* ptr; size_t length; } buffer_t;
typedef struct { const char* key_ptr; size_t key_length; const char* value_ptr; size_t value_length; } header_t;

enum { HDR_REQ = 0, HDR_REQ_TRAILER = 1, HDR_RESP = 2, HDR_RESP_TRAILER = 3 };
enum { ATTR_SOURCE_ADDRESS = 24 };

// ---- hooks ----
typedef const char* (*program_init_fn)(void);
typedef const void* (*config_new_fn)(void* cfg_envoy, buffer_t name, buffer_t config);
typedef void (*config_destroy_fn)(const void* cfg);
typedef const void* (*filter_new_fn)(const void* cfg, void* filter_envoy);
typedef uint32_t (*headers_fn)(void* f, const void* m, bool end);
typedef uint32_t (*trailers_fn)(void* f, const void* m);
typedef void (*stream_fn)(void* f, const void* m);
typedef void (*destroy_fn)(const void* m);
typedef void (*scheduled_fn)(void* f, const void* m, uint64_t event);
typedef void (*callout_done_fn)(void* f, const void* m, uint64_t id, uint32_t result, header_t* headers, size_t n,
                                buffer_t* chunks, size_t nchunks);
typedef uint64_t (*allocs_fn)(void);

static struct {
	program_init_fn program_init;
	config_new_fn config_new;
	config_destroy_fn config_destroy;
	filter_new_fn filter_new;
	headers_fn request_headers, request_body, response_headers, response_body;
	trailers_fn request_trailers, response_trailers;
	stream_fn stream_complete;
	destroy_fn destroy;
	scheduled_fn scheduled;
	callout_done_fn callout_done;
	allocs_fn go_allocs;
} H;

static const char* required_hooks[] = {
    "envoy_dynamic_module_on_program_init",
    "envoy_dynamic_module_on_http_filter_config_new",
    "envoy_dynamic_module_on_http_filter_config_destroy",
    "envoy_dynamic_module_on_http_filter_new",
    "envoy_dynamic_module_on_http_filter_request_headers",
    "envoy_dynamic_module_on_http_filter_request_body",
    "envoy_dynamic_module_on_http_filter_request_trailers",
    "envoy_dynamic_module_on_http_filter_response_headers",
    "envoy_dynamic_module_on_http_filter_response_body",
    "envoy_dynamic_module_on_http_filter_response_trailers",
    "envoy_dynamic_module_on_http_filter_stream_complete",
    "envoy_dynamic_module_on_http_filter_destroy",
    "envoy_dynamic_module_on_http_filter_http_callout_done",
    "envoy_dynamic_module_on_http_filter_http_stream_headers",
    "envoy_dynamic_module_on_http_filter_http_stream_data",
    "envoy_dynamic_module_on_http_filter_http_stream_trailers",
    "envoy_dynamic_module_on_http_filter_http_stream_complete",
    "envoy_dynamic_module_on_http_filter_http_stream_reset",
    "envoy_dynamic_module_on_http_filter_scheduled",
    "envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark",
    "envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark",
};

// ---- streams and workers ----
// A header map keeps its bytes inline (no malloc per header), so that the
// host's own cost per request stays small beside the module's.
#define MAXH 48
#define HBYTES 4096
typedef struct {
	int n;
	size_t used;
	size_t koff[MAXH], klen[MAXH], voff[MAXH], vlen[MAXH];
	char buf[HBYTES];
} hmap_t;

#define HK(m, i) ((m)->buf + (m)->koff[i])
#define HV(m, i) ((m)->buf + (m)->voff[i])

struct worker;

typedef struct stream {
	char id[32];
	struct worker* w;
	const void* module;
	hmap_t req, resp;
	char src[64];
	int local_status; // a local reply's status, 0 for none
	hmap_t local_hdrs;
	char local_body[512];
	int continued;
	double started; // monotonic seconds when its request headers were sent
	int destroyed;
	int in_use;
} stream_t;

typedef struct event {
	struct event* next;
	int kind; // 1: scheduled, 2: callout done, 3: a command to run on the worker
	void (*fn)(void*);
	void* arg;
	int* done;
	stream_t* s;
	uint64_t id;
	// callout answer
	int result;
	hmap_t hdrs;
	char* body;
	size_t body_len;
} event_t;

typedef struct worker {
	uint32_t idx;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	event_t *head, *tail;
	pthread_t thread;
	int started;
} worker_t;

typedef struct {
	worker_t* w;
	stream_t* s;
} sched_t;

#define MAXW 64
static worker_t workers[MAXW];
static uint32_t concurrency = 1;
static const void* config_module;
static atomic_uint_fast64_t callout_seq;

// clusters: name → port on 127.0.0.1
static struct {
	char name[64];
	int port;
} clusters[8];
static int nclusters;

// counters
#define MAXC 512
static char* counter_names[MAXC];
static atomic_uint_fast64_t counter_values[MAXC];
static int ncounters;
static int frozen;

static int quiet_logs;
static atomic_uint_fast64_t commits; // scheduler events committed, ever

static char* dupn(const char* p, size_t n) {
	char* s = malloc(n + 1);
	if (n) memcpy(s, p, n);
	s[n] = 0;
	return s;
}

static void hmap_clear(hmap_t* m) {
	m->n = 0;
	m->used = 0;
}

static void hmap_add(hmap_t* m, const char* k, size_t kl, const char* v, size_t vl) {
	if (m->n >= MAXH || m->used + kl + vl + 2 > HBYTES) {
		fprintf(stderr, "header map full\n");
		exit(2);
	}
	m->koff[m->n] = m->used;
	m->klen[m->n] = kl;
	if (kl) memcpy(m->buf + m->used, k, kl);
	m->buf[m->used + kl] = 0;
	m->used += kl + 1;
	m->voff[m->n] = m->used;
	m->vlen[m->n] = vl;
	if (vl) memcpy(m->buf + m->used, v, vl);
	m->buf[m->used + vl] = 0;
	m->used += vl + 1;
	m->n++;
}

// hmap_remove drops every line named k (their bytes stay until clear).
static void hmap_remove(hmap_t* m, const char* k, size_t kl) {
	int j = 0;
	for (int i = 0; i < m->n; i++) {
		if (m->klen[i] == kl && strncasecmp(HK(m, i), k, kl) == 0) continue;
		m->koff[j] = m->koff[i], m->klen[j] = m->klen[i], m->voff[j] = m->voff[i], m->vlen[j] = m->vlen[i];
		j++;
	}
	m->n = j;
}

static hmap_t* map_of(stream_t* s, uint32_t type) {
	switch (type) {
	case HDR_REQ:
		return &s->req;
	case HDR_RESP:
		return &s->resp;
	default:
		return NULL;
	}
}

// first_req is the monotonic time of the run's first request headers.
static _Atomic double first_req;

static double now_s(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

// Commands the script thread hands to a worker thread signal their end
// through these.
static pthread_mutex_t cmd_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cmd_cv = PTHREAD_COND_INITIALIZER;

static void push(worker_t* w, event_t* e) {
	e->next = NULL;
	pthread_mutex_lock(&w->mu);
	if (w->tail)
		w->tail->next = e;
	else
		w->head = e;
	w->tail = e;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
}

// dispatch runs the worker's queued events, waiting up to wait_s for the
// first; it returns the number run. Events are taken off the queue one at
// a time, never as a batch: a command that runs the loop itself (wait,
// pump, a load's request) dispatches from inside this one, and must see
// the events queued behind it. Had this call detached them, a callout's
// completion that arrived just after a "wait" command, before the worker
// took either, would sit in this call's batch until the wait timed out
// (the stream's continue then came too late for it).
static int dispatch(worker_t* w, double wait_s) {
	pthread_mutex_lock(&w->mu);
	if (!w->head && wait_s > 0) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		long ns = ts.tv_nsec + (long)(wait_s * 1e9);
		ts.tv_sec += ns / 1000000000L;
		ts.tv_nsec = ns % 1000000000L;
		pthread_cond_timedwait(&w->cv, &w->mu, &ts);
	}
	// At most the events queued now: those pushed while they run wait for
	// the next call.
	int queued = 0;
	for (event_t* q = w->head; q; q = q->next) queued++;
	pthread_mutex_unlock(&w->mu);
	int n = 0;
	while (n < queued) {
		pthread_mutex_lock(&w->mu);
		event_t* e = w->head;
		if (e) {
			w->head = e->next;
			if (!w->head) w->tail = NULL;
		}
		pthread_mutex_unlock(&w->mu);
		if (!e) break; // a nested dispatch ran the rest
		if (e->kind == 3) {
			e->fn(e->arg);
			pthread_mutex_lock(&cmd_mu);
			*e->done = 1;
			pthread_cond_broadcast(&cmd_cv);
			pthread_mutex_unlock(&cmd_mu);
		} else if (!e->s->destroyed) {
			if (e->kind == 1) {
				H.scheduled(e->s, e->s->module, e->id);
			} else {
				header_t hs[MAXH];
				for (int i = 0; i < e->hdrs.n; i++) {
					hs[i].key_ptr = HK(&e->hdrs, i);
					hs[i].key_length = e->hdrs.klen[i];
					hs[i].value_ptr = HV(&e->hdrs, i);
					hs[i].value_length = e->hdrs.vlen[i];
				}
				buffer_t chunk = {e->body, e->body_len};
				if (!quiet_logs) fprintf(stderr, "host: callout %llu done on stream %s\n", (unsigned long long)e->id, e->s->id);
				H.callout_done(e->s, e->s->module, e->id, (uint32_t)e->result, e->hdrs.n ? hs : NULL, e->hdrs.n,
				               e->body_len ? &chunk : NULL, e->body_len ? 1 : 0);
			}
		}
		hmap_clear(&e->hdrs);
		free(e->body);
		free(e);
		n++;
	}
	return n;
}

// worker_main is a simulated Envoy worker: its thread runs its dispatcher
// loop for good (scheduler events, callout completions, and the script's
// commands for streams of this worker).
static void* worker_main(void* arg) {
	worker_t* w = arg;
	for (;;) dispatch(w, 0.01);
	return NULL;
}

// post hands fn(arg) to worker w's thread; *done becomes 1 once it ran.
static void post(worker_t* w, void (*fn)(void*), void* arg, int* done) {
	pthread_mutex_lock(&cmd_mu);
	if (!w->started) {
		w->started = 1;
		pthread_create(&w->thread, NULL, worker_main, w);
	}
	pthread_mutex_unlock(&cmd_mu);
	event_t* e = calloc(1, sizeof *e);
	e->kind = 3;
	e->fn = fn;
	e->arg = arg;
	e->done = done;
	*done = 0;
	push(w, e);
}

static void await_done(int* done) {
	pthread_mutex_lock(&cmd_mu);
	while (!*done) pthread_cond_wait(&cmd_cv, &cmd_mu);
	pthread_mutex_unlock(&cmd_mu);
}

// run_on runs fn(arg) on worker w's thread and waits for it.
static void run_on(worker_t* w, void (*fn)(void*), void* arg) {
	int done;
	post(w, fn, arg, &done);
	await_done(&done);
}

// ---- the callbacks Envoy provides ----
uint32_t envoy_dynamic_module_callback_get_concurrency(void) { return concurrency; }

uint32_t envoy_dynamic_module_callback_http_filter_get_worker_index(void* f) { return ((stream_t*)f)->w->idx; }

void envoy_dynamic_module_callback_log(uint32_t level, buffer_t msg) {
	if (!quiet_logs) fprintf(stderr, "module log %u: %.*s\n", level, (int)msg.length, msg.ptr);
}

bool envoy_dynamic_module_callback_log_enabled(uint32_t level) { return true; }

uint32_t envoy_dynamic_module_callback_http_filter_config_define_counter(void* cfg, buffer_t name, buffer_t* labels,
                                                                         size_t nlabels, size_t* id) {
	if (frozen) return 3; // Frozen
	if (ncounters >= MAXC) return 2;
	counter_names[ncounters] = dupn(name.ptr, name.length);
	*id = (size_t)ncounters++;
	return 0;
}

uint32_t envoy_dynamic_module_callback_http_filter_config_define_gauge(void* cfg, buffer_t name, buffer_t* labels,
                                                                       size_t nlabels, size_t* id) {
	return 3;
}

uint32_t envoy_dynamic_module_callback_http_filter_increment_counter(void* f, size_t id, buffer_t* labels, size_t n,
                                                                     uint64_t v) {
	if (id >= (size_t)ncounters) return 1;
	atomic_fetch_add(&counter_values[id], v);
	return 0;
}

uint32_t envoy_dynamic_module_callback_http_filter_set_gauge(void* f, size_t id, buffer_t* labels, size_t n,
                                                             uint64_t v) {
	return 1;
}

bool envoy_dynamic_module_callback_http_get_header(void* f, uint32_t type, buffer_t key, buffer_t* result,
                                                   size_t index, size_t* count) {
	hmap_t* m = map_of((stream_t*)f, type);
	size_t seen = 0;
	bool found = false;
	result->ptr = NULL;
	result->length = 0;
	if (m) {
		for (int i = 0; i < m->n; i++) {
			if (m->klen[i] != key.length || strncasecmp(HK(m, i), key.ptr, key.length) != 0) continue;
			if (seen == index) {
				result->ptr = HV(m, i);
				result->length = m->vlen[i];
				found = true;
			}
			seen++;
		}
	}
	if (count) *count = seen;
	return found;
}

size_t envoy_dynamic_module_callback_http_get_headers_size(void* f, uint32_t type) {
	hmap_t* m = map_of((stream_t*)f, type);
	return m ? (size_t)m->n : 0;
}

bool envoy_dynamic_module_callback_http_get_headers(void* f, uint32_t type, header_t* out) {
	hmap_t* m = map_of((stream_t*)f, type);
	if (!m) return false;
	for (int i = 0; i < m->n; i++) {
		out[i].key_ptr = HK(m, i);
		out[i].key_length = m->klen[i];
		out[i].value_ptr = HV(m, i);
		out[i].value_length = m->vlen[i];
	}
	return true;
}

bool envoy_dynamic_module_callback_http_set_header(void* f, uint32_t type, buffer_t key, buffer_t value) {
	hmap_t* m = map_of((stream_t*)f, type);
	if (!m) return false;
	hmap_remove(m, key.ptr, key.length);
	if (value.ptr != NULL && value.length > 0) hmap_add(m, key.ptr, key.length, value.ptr, value.length);
	return true;
}

bool envoy_dynamic_module_callback_http_add_header(void* f, uint32_t type, buffer_t key, buffer_t value) {
	hmap_t* m = map_of((stream_t*)f, type);
	if (!m || value.ptr == NULL || value.length == 0) return false;
	hmap_add(m, key.ptr, key.length, value.ptr, value.length);
	return true;
}

void envoy_dynamic_module_callback_http_send_response(void* f, uint32_t status, header_t* hs, size_t n, buffer_t body,
                                                      buffer_t details) {
	stream_t* s = f;
	s->local_status = (int)status;
	hmap_clear(&s->local_hdrs);
	for (size_t i = 0; i < n; i++) hmap_add(&s->local_hdrs, hs[i].key_ptr, hs[i].key_length, hs[i].value_ptr, hs[i].value_length);
	size_t bl = body.length < sizeof(s->local_body) - 1 ? body.length : sizeof(s->local_body) - 1;
	if (bl) memcpy(s->local_body, body.ptr, bl);
	s->local_body[bl] = 0;
}

void envoy_dynamic_module_callback_http_filter_continue_decoding(void* f) { ((stream_t*)f)->continued = 1; }

void envoy_dynamic_module_callback_http_filter_continue_encoding(void* f) {}

bool envoy_dynamic_module_callback_http_filter_get_attribute_string(void* f, uint32_t id, buffer_t* out) {
	stream_t* s = f;
	if (id != ATTR_SOURCE_ADDRESS || !s->src[0]) return false;
	out->ptr = s->src;
	out->length = strlen(s->src);
	return true;
}

bool envoy_dynamic_module_callback_http_filter_get_attribute_int(void* f, uint32_t id, uint64_t* out) { return false; }

bool envoy_dynamic_module_callback_http_get_metadata_string(void* f, uint32_t src, buffer_t ns, buffer_t key, buffer_t* out) {
	return false;
}

bool envoy_dynamic_module_callback_http_get_metadata_number(void* f, uint32_t src, buffer_t ns, buffer_t key, double* out) {
	return false;
}

bool envoy_dynamic_module_callback_http_get_metadata_bool(void* f, uint32_t src, buffer_t ns, buffer_t key, bool* out) {
	return false;
}

void* envoy_dynamic_module_callback_http_filter_scheduler_new(void* f) {
	sched_t* sc = malloc(sizeof *sc);
	sc->s = f;
	sc->w = ((stream_t*)f)->w;
	return sc;
}

void envoy_dynamic_module_callback_http_filter_scheduler_commit(void* p, uint64_t event) {
	sched_t* sc = p;
	atomic_fetch_add(&commits, 1);
	event_t* e = calloc(1, sizeof *e);
	e->kind = 1;
	e->s = sc->s;
	e->id = event;
	push(sc->w, e);
}

void envoy_dynamic_module_callback_http_filter_scheduler_delete(void* p) { free(p); }

void* envoy_dynamic_module_callback_http_filter_config_scheduler_new(void* cfg) { return NULL; }
void envoy_dynamic_module_callback_http_filter_config_scheduler_commit(void* p, uint64_t event) {}
void envoy_dynamic_module_callback_http_filter_config_scheduler_delete(void* p) {}

// ---- callouts: sent for real, over HTTP/1.1 to 127.0.0.1 ----
typedef struct {
	event_t* e;
	worker_t* w;
	int port;
	char* req;
	size_t req_len;
} callout_t;

static void* callout_thread(void* arg) {
	callout_t* c = arg;
	event_t* e = c->e;
	e->result = 1; // Reset, unless an answer is read
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = {0};
	sa.sin_family = AF_INET;
	sa.sin_port = htons((uint16_t)c->port);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd >= 0 && connect(fd, (struct sockaddr*)&sa, sizeof sa) == 0) {
		size_t off = 0;
		while (off < c->req_len) {
			ssize_t k = write(fd, c->req + off, c->req_len - off);
			if (k <= 0) break;
			off += (size_t)k;
		}
		size_t cap = 4096, len = 0;
		char* resp = malloc(cap);
		for (;;) {
			if (len + 1024 > cap) resp = realloc(resp, cap *= 2);
			ssize_t k = read(fd, resp + len, cap - len - 1);
			if (k <= 0) break;
			len += (size_t)k;
		}
		resp[len] = 0;
		char* end = strstr(resp, "\r\n\r\n");
		if (end && strncmp(resp, "HTTP/1.", 7) == 0) {
			*end = 0;
			char* line = resp;
			char* nl = strstr(line, "\r\n");
			int status = atoi(line + 9);
			char st[8];
			snprintf(st, sizeof st, "%d", status);
			hmap_add(&e->hdrs, ":status", 7, st, strlen(st));
			while (nl) {
				line = nl + 2;
				nl = strstr(line, "\r\n");
				if (nl) *nl = 0;
				char* colon = strchr(line, ':');
				if (!colon) continue;
				char* v = colon + 1;
				while (*v == ' ') v++;
				for (char* p = line; p < colon; p++)
					if (*p >= 'A' && *p <= 'Z') *p += 32;
				hmap_add(&e->hdrs, line, (size_t)(colon - line), v, strlen(v));
			}
			char* body = end + 4;
			e->body_len = len - (size_t)(body - resp);
			e->body = dupn(body, e->body_len);
			e->result = 0;
		}
		free(resp);
	}
	if (fd >= 0) close(fd);
	if (!quiet_logs) fprintf(stderr, "host: callout %llu to port %d: %s\n", (unsigned long long)e->id, c->port, e->result == 0 ? "answered" : "failed");
	free(c->req);
	worker_t* w = c->w;
	free(c);
	push(w, e);
	return NULL;
}

uint32_t envoy_dynamic_module_callback_http_filter_http_callout(void* f, uint64_t* id_out, buffer_t cluster, header_t* hs,
                                                                size_t n, buffer_t body, uint64_t timeout_ms) {
	stream_t* s = f;
	int port = -1;
	for (int i = 0; i < nclusters; i++)
		if (strlen(clusters[i].name) == cluster.length && strncmp(clusters[i].name, cluster.ptr, cluster.length) == 0)
			port = clusters[i].port;
	if (port < 0) return 2; // ClusterNotFound
	const char *method = NULL, *path = NULL, *host = NULL;
	size_t ml = 0, pl = 0, hl = 0;
	for (size_t i = 0; i < n; i++) {
		if (hs[i].key_length == 7 && !strncmp(hs[i].key_ptr, ":method", 7)) method = hs[i].value_ptr, ml = hs[i].value_length;
		if (hs[i].key_length == 5 && !strncmp(hs[i].key_ptr, ":path", 5)) path = hs[i].value_ptr, pl = hs[i].value_length;
		if ((hs[i].key_length == 10 && !strncmp(hs[i].key_ptr, ":authority", 10)) ||
		    (hs[i].key_length == 4 && !strncmp(hs[i].key_ptr, "host", 4)))
			host = hs[i].value_ptr, hl = hs[i].value_length;
	}
	if (!method || !path || !host) return 1; // MissingRequiredHeaders
	size_t cap = 1024 + body.length;
	for (size_t i = 0; i < n; i++) cap += hs[i].key_length + hs[i].value_length + 4;
	char* req = malloc(cap);
	size_t len = (size_t)snprintf(req, cap, "%.*s %.*s HTTP/1.1\r\nHost: %.*s\r\n", (int)ml, method, (int)pl, path, (int)hl, host);
	for (size_t i = 0; i < n; i++) {
		if (hs[i].key_length > 0 && hs[i].key_ptr[0] == ':') continue;
		len += (size_t)snprintf(req + len, cap - len, "%.*s: %.*s\r\n", (int)hs[i].key_length, hs[i].key_ptr,
		                        (int)hs[i].value_length, hs[i].value_ptr);
	}
	len += (size_t)snprintf(req + len, cap - len, "Content-Length: %zu\r\nConnection: close\r\n\r\n", body.length);
	if (body.length) memcpy(req + len, body.ptr, body.length);
	len += body.length;
	uint64_t id = atomic_fetch_add(&callout_seq, 1) + 1;
	*id_out = id;
	event_t* e = calloc(1, sizeof *e);
	e->kind = 2;
	e->s = s;
	e->id = id;
	callout_t* c = calloc(1, sizeof *c);
	c->e = e;
	c->w = s->w;
	c->port = port;
	c->req = req;
	c->req_len = len;
	pthread_t t;
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_create(&t, &attr, callout_thread, c);
	pthread_attr_destroy(&attr);
	return 0;
}

// ---- script ----
#define MAXS 1024
static stream_t streams[MAXS];
static worker_t* cur_worker = &workers[0];

static stream_t* find_stream(const char* id) {
	for (int i = 0; i < MAXS; i++)
		if (streams[i].in_use && !strcmp(streams[i].id, id)) return &streams[i];
	return NULL;
}

static stream_t* new_stream(const char* id) {
	for (int i = 0; i < MAXS; i++) {
		if (!streams[i].in_use) {
			stream_t* s = &streams[i];
			memset(s, 0, sizeof *s);
			s->in_use = 1;
			snprintf(s->id, sizeof s->id, "%s", id);
			return s;
		}
	}
	fprintf(stderr, "too many streams\n");
	exit(2);
}

static void print_map(const char* tag, hmap_t* m) {
	for (int i = 0; i < m->n; i++) printf("  %s %s: %s\n", tag, HK(m, i), HV(m, i));
}

// add_headers parses "name:value" arguments (and src=ADDR) into s.
static void add_headers(stream_t* s, hmap_t* m, char** argv, int argc) {
	for (int i = 0; i < argc; i++) {
		if (!strncmp(argv[i], "src=", 4)) {
			snprintf(s->src, sizeof s->src, "%s", argv[i] + 4);
			continue;
		}
		char* colon = strchr(argv[i][0] == ':' ? argv[i] + 1 : argv[i], ':');
		if (!colon) continue;
		hmap_add(m, argv[i], (size_t)(colon - argv[i]), colon + 1, strlen(colon + 1));
	}
}

static void finish_stream(stream_t* s) {
	H.stream_complete(s, s->module);
	s->destroyed = 1;
	H.destroy(s->module);
}

static void print_req(const char* tag, stream_t* s, uint32_t st) {
	if (s->local_status) {
		printf("%s %s local %d\n", tag, s->id, s->local_status);
		print_map("hdr", &s->local_hdrs);
		printf("  body %s\n", s->local_body);
	} else if (st == 0) {
		printf("%s %s continue\n", tag, s->id);
	} else {
		printf("%s %s paused\n", tag, s->id);
	}
}

// ---- load from several threads ----
typedef struct {
	worker_t* w;
	int n;            // requests, or 0: until deadline
	double deadline;  // monotonic seconds
	char** hdrs;
	int nhdrs;
	long admitted, rejected, other;
	// first0/first1: the start and end of the thread's first request;
	// last0/last1: of its last one.
	double first0, first1, last0, last1;
} load_t;

// one_request runs a whole request through the module on this thread's
// worker: admitted requests get a 200 response.
static int one_request(worker_t* w, stream_t* s, char** hdrs, int nhdrs) {
	memset(s, 0, sizeof *s);
	s->w = w;
	snprintf(s->src, sizeof s->src, "10.0.0.1:4000");
	add_headers(s, &s->req, hdrs, nhdrs);
	s->module = H.filter_new(config_module, s);
	uint32_t st = H.request_headers(s, s->module, true);
	int rc;
	if (s->local_status) {
		rc = s->local_status;
	} else if (st != 0) {
		while (!s->continued && !s->local_status) dispatch(w, 0.05);
		rc = s->local_status ? s->local_status : 200;
	} else {
		rc = 200;
	}
	if (rc == 200) {
		hmap_add(&s->resp, ":status", 7, "200", 3);
		H.response_headers(s, s->module, true);
	}
	finish_stream(s);
	hmap_clear(&s->req);
	hmap_clear(&s->resp);
	hmap_clear(&s->local_hdrs);
	dispatch(w, 0);
	return rc;
}

static void load_cmd(void* arg);

static void* load_thread(void* arg) {
	load_t* l = arg;
	stream_t* s = calloc(1, sizeof *s);
	for (int i = 0;; i++) {
		double t = now_s();
		if (l->n ? i >= l->n : t >= l->deadline) break;
		int rc = one_request(l->w, s, l->hdrs, l->nhdrs);
		double e = now_s();
		if (i == 0) l->first0 = t, l->first1 = e;
		l->last0 = t, l->last1 = e;
		if (rc == 200)
			l->admitted++;
		else if (rc == 429)
			l->rejected++;
		else
			l->other++;
	}
	free(s);
	return NULL;
}

static void load_cmd(void* arg) { load_thread(arg); }

// run_load runs the load on the first `threads` workers, each on its own
// thread (threads beyond the workers are cut to their number).
static void run_load(int threads, int n, double seconds, char** hdrs, int nhdrs) {
	load_t ls[MAXW];
	int done[MAXW];
	if (threads > (int)concurrency) threads = (int)concurrency;
	double start = now_s();
	for (int i = 0; i < threads; i++) {
		memset(&ls[i], 0, sizeof ls[i]);
		ls[i].w = &workers[i];
		ls[i].n = n;
		ls[i].deadline = start + seconds;
		ls[i].hdrs = hdrs;
		ls[i].nhdrs = nhdrs;
		post(&workers[i], load_cmd, &ls[i], &done[i]);
	}
	long a = 0, r = 0, o = 0;
	double first0 = 1e18, first1 = 1e18, last0 = 0, last1 = 0;
	for (int i = 0; i < threads; i++) {
		await_done(&done[i]);
		a += ls[i].admitted;
		r += ls[i].rejected;
		o += ls[i].other;
		if (ls[i].first0 < first0) first0 = ls[i].first0;
		if (ls[i].first1 < first1) first1 = ls[i].first1;
		if (ls[i].last0 > last0) last0 = ls[i].last0;
		if (ls[i].last1 > last1) last1 = ls[i].last1;
	}
	// The module read its clock inside the first request and inside the
	// last: the time between them lies in [lo, hi].
	printf("load admitted %ld rejected %ld other %ld elapsed %.6f %.6f\n", a, r, o, last0 - first1, last1 - first0);
}

// ---- CPU cost per request, with and without the module ----
static double thread_cpu(void) {
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

// baseline_request is one_request's host work without the module: the
// same header maps built and torn down, the same response.
static void baseline_request(worker_t* w, stream_t* s, char** hdrs, int nhdrs) {
	memset(s, 0, sizeof *s);
	s->w = w;
	snprintf(s->src, sizeof s->src, "10.0.0.1:4000");
	add_headers(s, &s->req, hdrs, nhdrs);
	hmap_add(&s->resp, ":status", 7, "200", 3);
	hmap_clear(&s->req);
	hmap_clear(&s->resp);
	dispatch(w, 0);
}

static int cmp_double(const void* a, const void* b) {
	double x = *(const double*)a, y = *(const double*)b;
	return x < y ? -1 : x > y;
}

static void run_bench(int rounds, int n, char** hdrs, int nhdrs) {
	worker_t* w = cur_worker;
	stream_t* s = calloc(1, sizeof *s);
	double with[256], without[256];
	if (rounds > 256) rounds = 256;
	for (int i = 0; i < n; i++) one_request(w, s, hdrs, nhdrs); // warm up
	for (int r = 0; r < rounds; r++) {
		double t0 = thread_cpu();
		for (int i = 0; i < n; i++) baseline_request(w, s, hdrs, nhdrs);
		double t1 = thread_cpu();
		for (int i = 0; i < n; i++) one_request(w, s, hdrs, nhdrs);
		double t2 = thread_cpu();
		without[r] = (t1 - t0) / n * 1e9;
		with[r] = (t2 - t1) / n * 1e9;
	}
	qsort(with, (size_t)rounds, sizeof(double), cmp_double);
	qsort(without, (size_t)rounds, sizeof(double), cmp_double);
	printf("bench rounds %d requests %d filter_ns %.1f base_ns %.1f added_ns %.1f\n", rounds, n, with[rounds / 2],
	       without[rounds / 2], with[rounds / 2] - without[rounds / 2]);
	free(s);
}

static void run_allocs(int n, char** hdrs, int nhdrs) {
	worker_t* w = cur_worker;
	stream_t* s = calloc(1, sizeof *s);
	if (!H.go_allocs) {
		printf("allocs unavailable\n");
		return;
	}
	for (int i = 0; i < 2000; i++) one_request(w, s, hdrs, nhdrs);
	uint64_t a0 = H.go_allocs();
	for (int i = 0; i < n; i++) one_request(w, s, hdrs, nhdrs);
	uint64_t a1 = H.go_allocs();
	printf("allocs requests %d objects %llu\n", n, (unsigned long long)(a1 - a0));
	free(s);
}

// A script command about streams, run on the current worker's thread.
typedef struct {
	char** argv;
	int argc;
} cmd_t;

static void stream_cmd(void* arg) {
	cmd_t* c = arg;
	char** argv = c->argv;
	int argc = c->argc;
	const char* cmd = argv[0];
	if (!strcmp(cmd, "req")) {
		// req ID [src=ADDR] [name:value]...: a new stream, its request
		// headers (end of stream).
		stream_t* s = new_stream(argv[1]);
		s->w = cur_worker;
		add_headers(s, &s->req, argv + 2, argc - 2);
		s->started = now_s();
		double unset = 0;
		atomic_compare_exchange_strong(&first_req, &unset, s->started);
		s->module = H.filter_new(config_module, s);
		if (!s->module) {
			printf("req %s nofilter\n", s->id);
			return;
		}
		uint32_t st = H.request_headers(s, s->module, true);
		print_req("req", s, st);
	} else if (!strcmp(cmd, "wait")) {
		// wait ID MS: run this worker's loop until the stream goes on
		// (printing the ms since its request headers were sent, then the
		// ms since the run's first request headers were), gets a local
		// reply, or MS pass.
		stream_t* s = find_stream(argv[1]);
		double t0 = now_s(), limit = atof(argv[2]) / 1000;
		while (s && !s->continued && !s->local_status && now_s() - t0 < limit) dispatch(s->w, 0.002);
		if (!s)
			printf("wait %s nostream\n", argv[1]);
		else if (s->local_status)
			print_req("wait", s, 1);
		else if (s->continued)
			printf("wait %s continued %.1f %.1f\n", s->id, (now_s() - s->started) * 1000, (now_s() - first_req) * 1000);
		else
			printf("wait %s timeout\n", s->id);
	} else if (!strcmp(cmd, "resp")) {
		// resp ID STATUS [name:value]...: the upstream's response headers.
		stream_t* s = find_stream(argv[1]);
		hmap_add(&s->resp, ":status", 7, argv[2], strlen(argv[2]));
		add_headers(s, &s->resp, argv + 3, argc - 3);
		H.response_headers(s, s->module, true);
		printf("resp %s\n", s->id);
		print_map("hdr", &s->resp);
	} else if (!strcmp(cmd, "done")) {
		stream_t* s = find_stream(argv[1]);
		finish_stream(s);
		hmap_clear(&s->req);
		hmap_clear(&s->resp);
		s->in_use = 0;
		printf("done %s\n", argv[1]);
	} else if (!strcmp(cmd, "pump")) {
		// pump MS: run this worker's loop for MS.
		double t0 = now_s(), limit = atof(argv[1]) / 1000;
		while (now_s() - t0 < limit) dispatch(cur_worker, 0.002);
	} else if (!strcmp(cmd, "bench")) {
		run_bench(atoi(argv[1]), atoi(argv[2]), argv + 3, argc - 3);
	} else if (!strcmp(cmd, "allocs")) {
		run_allocs(atoi(argv[1]), argv + 2, argc - 2);
	}
	fflush(stdout);
}

// busy_cmd keeps its worker busy for b->ms, as a long hook of another
// stream would, first saying it started.
typedef struct {
	int ms, started, done;
} busy_t;

static void busy_cmd(void* arg) {
	busy_t* b = arg;
	pthread_mutex_lock(&cmd_mu);
	b->started = 1;
	pthread_cond_broadcast(&cmd_cv);
	pthread_mutex_unlock(&cmd_mu);
	usleep((useconds_t)(b->ms * 1000));
}

static int split(char* line, char** argv, int max) {
	int n = 0;
	for (char* tok = strtok(line, " \t\n"); tok && n < max; tok = strtok(NULL, " \t\n")) argv[n++] = tok;
	return n;
}

static void run_script(FILE* in) {
	char line[65536];
	while (fgets(line, sizeof line, in)) {
		if (line[0] == '#' || line[0] == '\n') continue;
		if (!strncmp(line, "config ", 7)) {
			// config JSON: on_http_filter_config_new with the JSON as a
			// StringValue's value (the rest of the line).
			char* json = line + 7;
			json[strcspn(json, "\n")] = 0;
			buffer_t name = {"tokengate", 9};
			buffer_t cfg = {json, strlen(json)};
			frozen = 0;
			config_module = H.config_new((void*)0x1, name, cfg);
			frozen = 1;
			printf("config %s\n", config_module ? "ok" : "rejected");
			fflush(stdout);
			continue;
		}
		char* argv[64];
		int argc = split(line, argv, 64);
		if (argc == 0) continue;
		const char* cmd = argv[0];
		if (!strcmp(cmd, "workers")) {
			concurrency = (uint32_t)atoi(argv[1]);
		} else if (!strcmp(cmd, "quiet")) {
			quiet_logs = 1;
		} else if (!strcmp(cmd, "cluster")) {
			snprintf(clusters[nclusters].name, sizeof clusters[0].name, "%s", argv[1]);
			clusters[nclusters++].port = atoi(argv[2]);
		} else if (!strcmp(cmd, "worker")) {
			cur_worker = &workers[atoi(argv[1])];
		} else if (!strcmp(cmd, "req") || !strcmp(cmd, "wait") || !strcmp(cmd, "resp") || !strcmp(cmd, "done") ||
		           !strcmp(cmd, "pump") || !strcmp(cmd, "bench") || !strcmp(cmd, "allocs")) {
			// Stream commands run on the current worker's thread, as
			// Envoy runs a stream's hooks on the worker that owns it.
			cmd_t c = {argv, argc};
			run_on(cur_worker, stream_cmd, &c);
		} else if (!strcmp(cmd, "busy")) {
			// busy MS: the current worker is busy for MS; the script goes
			// on as soon as the worker started it, so that what reaches the
			// worker meanwhile (the next commands, callout completions)
			// queues up behind it. The record stays allocated: the worker
			// writes its done flag last.
			busy_t* b = calloc(1, sizeof *b);
			b->ms = atoi(argv[1]);
			post(cur_worker, busy_cmd, b, &b->done);
			pthread_mutex_lock(&cmd_mu);
			while (!b->started) pthread_cond_wait(&cmd_cv, &cmd_mu);
			pthread_mutex_unlock(&cmd_mu);
		} else if (!strcmp(cmd, "sleep")) {
			usleep((useconds_t)(atof(argv[1]) * 1000));
		} else if (!strcmp(cmd, "counter")) {
			uint64_t v = 0;
			int found = 0;
			for (int i = 0; i < ncounters; i++)
				if (!strcmp(counter_names[i], argv[1])) v += atomic_load(&counter_values[i]), found = 1;
			printf("counter %s %s%llu\n", argv[1], found ? "" : "undefined ", (unsigned long long)v);
		} else if (!strcmp(cmd, "load")) {
			// load THREADS N [name:value]...
			run_load(atoi(argv[1]), atoi(argv[2]), 0, argv + 3, argc - 3);
		} else if (!strcmp(cmd, "hammer")) {
			// hammer THREADS SECONDS [name:value]...
			run_load(atoi(argv[1]), 0, atof(argv[2]), argv + 3, argc - 3);
		} else if (!strcmp(cmd, "commits")) {
			printf("commits %llu\n", (unsigned long long)atomic_load(&commits));
		} else if (!strcmp(cmd, "destroy")) {
			H.config_destroy(config_module);
			config_module = NULL;
			printf("destroyed\n");
		} else {
			fprintf(stderr, "unknown command %s\n", cmd);
			exit(2);
		}
		fflush(stdout);
	}
}

int main(int argc, char** argv) {
	if (argc < 2) {
		fprintf(stderr, "usage: host libtokengate.so < script\n");
		return 2;
	}
	for (int i = 0; i < MAXW; i++) {
		workers[i].idx = (uint32_t)i;
		pthread_mutex_init(&workers[i].mu, NULL);
		pthread_cond_init(&workers[i].cv, NULL);
	}
	void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
	if (!lib) {
		fprintf(stderr, "dlopen: %s\n", dlerror());
		return 3;
	}
	for (size_t i = 0; i < sizeof required_hooks / sizeof required_hooks[0]; i++) {
		if (!dlsym(lib, required_hooks[i])) {
			fprintf(stderr, "missing hook %s\n", required_hooks[i]);
			return 4;
		}
	}
	H.program_init = (program_init_fn)dlsym(lib, "envoy_dynamic_module_on_program_init");
	H.config_new = (config_new_fn)dlsym(lib, "envoy_dynamic_module_on_http_filter_config_new");
	H.config_destroy = (config_destroy_fn)dlsym(lib, "envoy_dynamic_module_on_http_filter_config_destroy");
	H.filter_new = (filter_new_fn)dlsym(lib, "envoy_dynamic_module_on_http_filter_new");
	H.request_headers = (headers_fn)dlsym(lib, "envoy_dynamic_module_on_http_filter_request_headers");
	H.request_body = (headers_fn)dlsym(lib, "envoy_dynamic_module_on_http_filter_request_body");
	H.request_trailers = (trailers_fn)dlsym(lib, "envoy_dynamic_module_on_http_filter_request_trailers");
	H.response_headers = (headers_fn)dlsym(lib, "envoy_dynamic_module_on_http_filter_response_headers");
	H.response_body = (headers_fn)dlsym(lib, "envoy_dynamic_module_on_http_filter_response_body");
	H.response_trailers = (trailers_fn)dlsym(lib, "envoy_dynamic_module_on_http_filter_response_trailers");
	H.stream_complete = (stream_fn)dlsym(lib, "envoy_dynamic_module_on_http_filter_stream_complete");
	H.destroy = (destroy_fn)dlsym(lib, "envoy_dynamic_module_on_http_filter_destroy");
	H.scheduled = (scheduled_fn)dlsym(lib, "envoy_dynamic_module_on_http_filter_scheduled");
	H.callout_done = (callout_done_fn)dlsym(lib, "envoy_dynamic_module_on_http_filter_http_callout_done");
	H.go_allocs = (allocs_fn)dlsym(lib, "tokengate_dynmod_go_allocs");
	const char* v = H.program_init();
	if (!v) {
		fprintf(stderr, "on_program_init returned NULL\n");
		return 5;
	}
	printf("abi %s\n", v);
	fflush(stdout);
	run_script(stdin);
	return 0;
}
