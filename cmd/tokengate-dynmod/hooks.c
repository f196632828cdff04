// The hooks of Envoy's dynamic-module ABI "v0.1.0", as C functions: Envoy
// resolves them by name. Each stream gets a small C record (the module
// pointer Envoy holds: C memory, never a Go pointer) carrying its config's
// handle and, once its request headers arrived, its Go handle. A hook
// crosses into Go only when the stream has a Go side: filter_new and a
// destroy after a stream that left nothing behind cost no crossing, and a
// stream whose request headers never reached the module costs none at all.
// The common request crosses once: the request-headers hook passes the
// source address in, and Go leaves the hook's counter increments and, for
// a stream it could finish at once, the response headers in the stream's
// mailbox (tg_mailbox), which the C side applies without calling back into
// Go; no later hook of such a stream crosses. The crossing also carries the
// time, read here once (CLOCK_REALTIME), which the filter uses for every
// callback it runs in the crossing: Go's time.Now would read the clock
// twice (wall and monotonic).
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "_cgo_export.h"
#include "abi.h"

// The hook answers meaning "continue" (0 in every status enum).
enum { CONTINUE = 0 };

// A Go handle that means "no Go side" (none was made, or it is released).
#define NONE ((uintptr_t)-1)

typedef struct tg_stream {
	uintptr_t cfg;          // the config's handle
	uintptr_t go;           // the stream's Go handle; 0: not made yet; NONE: none
	struct tg_stream* next; // in its thread's pool, once destroyed
	tg_mailbox box;         // what the Go side of the request-headers hook left for C
} tg_stream;

// Destroyed stream records, kept for the next streams of the same thread
// (Envoy creates and destroys a stream on its worker's thread): a malloc
// and a free less per stream. At most POOL_MAX a thread; a thread that
// exits leaves its pool behind (Envoy's workers live as long as the
// process). One pointer of thread-local storage, dynamic model, as in
// wrappers.c.
enum { POOL_MAX = 64 };
typedef struct {
	tg_stream* head;
	int n;
} stream_pool;
static __thread stream_pool* pool __attribute__((tls_model("global-dynamic")));

static int live(const tg_stream* s) { return s->go != 0 && s->go != NONE; }

const char* envoy_dynamic_module_on_program_init(void) { return tg_abi_version(); }

const void* envoy_dynamic_module_on_http_filter_config_new(void* cfg_envoy, tg_buffer name, tg_buffer config) {
	uintptr_t h = tgo_config_new((uintptr_t)cfg_envoy, (char*)config.ptr, config.length);
	return (const void*)h; // NULL: Envoy rejects the configuration
}

void envoy_dynamic_module_on_http_filter_config_destroy(const void* cfg) { tgo_config_destroy((uintptr_t)cfg); }

void envoy_dynamic_module_on_http_filter_config_scheduled(void* cfg_envoy, const void* cfg, uint64_t event) {}

const void* envoy_dynamic_module_on_http_filter_new(const void* cfg, void* f) {
	stream_pool* p = pool;
	tg_stream* s = p ? p->head : NULL;
	if (s != NULL) {
		p->head = s->next;
		p->n--;
	} else if ((s = malloc(sizeof *s)) == NULL) {
		return NULL;
	}
	s->cfg = (uintptr_t)cfg;
	s->go = 0;
	s->box.nheaders = s->box.ncounts = 0;
	return s;
}

uint32_t envoy_dynamic_module_on_http_filter_request_headers(void* f, const void* m, bool end) {
	tg_stream* s = (tg_stream*)m;
	if (s->go == 0) {
		// One crossing: the worker, the source address and the time go
		// in, the counts come back in the mailbox, and so do the response
		// headers of a stream Go finished at once (then r0 is 0).
		uint32_t worker = envoy_dynamic_module_callback_http_filter_get_worker_index(f);
		tg_buffer src = {0};
		bool src_ok = envoy_dynamic_module_callback_http_filter_get_attribute_string(f, 24 /* source.address */, &src) &&
		              src.ptr != NULL;
		s->box.nheaders = s->box.ncounts = s->box.buflen = 0;
		struct timespec ts;
		int64_t now = 0; // 0: Go reads the clock itself
		if (clock_gettime(CLOCK_REALTIME, &ts) == 0) now = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
		struct tgo_request_headers_new_return r =
		    tgo_request_headers_new(s->cfg, (uintptr_t)f, worker, end, (char*)src.ptr, src.length, src_ok, &s->box, now);
		s->go = r.r0 ? r.r0 : NONE;
		for (uint32_t i = 0; i < s->box.ncounts && i < TG_MAILBOX_COUNTS; i++)
			envoy_dynamic_module_callback_http_filter_increment_counter(f, (size_t)s->box.counts[2 * i], NULL, 0,
			                                                             s->box.counts[2 * i + 1]);
		s->box.ncounts = 0;
		return r.r1;
	}
	return live(s) ? tgo_request_headers((uintptr_t)f, s->go, end) : CONTINUE;
}

uint32_t envoy_dynamic_module_on_http_filter_request_body(void* f, const void* m, bool end) {
	const tg_stream* s = m;
	return live(s) ? tgo_request_body((uintptr_t)f, s->go, end) : CONTINUE;
}

uint32_t envoy_dynamic_module_on_http_filter_request_trailers(void* f, const void* m) {
	const tg_stream* s = m;
	return live(s) ? tgo_request_trailers((uintptr_t)f, s->go) : CONTINUE;
}

// set_box_headers sets (or adds) the response headers Go left in box, as
// tg_set_headers does, calling Envoy directly.
static void set_box_headers(void* f, const tg_mailbox* box) {
	uint32_t n = box->nheaders < TG_MAILBOX_HEADERS ? box->nheaders : TG_MAILBOX_HEADERS;
	const char* p = box->buf;
	for (uint32_t i = 0; i < n; i++) {
		const uint32_t* op = box->ops + 3 * i;
		tg_buffer k = {p, op[1]}, v = {p + op[1], op[2]};
		if (op[0]) {
			envoy_dynamic_module_callback_http_add_header(f, 2 /* response headers */, k, v);
		} else {
			envoy_dynamic_module_callback_http_set_header(f, 2 /* response headers */, k, v);
		}
		p += op[1] + op[2];
	}
}

uint32_t envoy_dynamic_module_on_http_filter_response_headers(void* f, const void* m, bool end) {
	tg_stream* s = (tg_stream*)m;
	if (s->box.nheaders > 0) { // the RateLimit headers of a stream Go finished at once
		set_box_headers(f, &s->box);
		s->box.nheaders = 0;
	}
	return live(s) ? tgo_response_headers((uintptr_t)f, s->go, end) : CONTINUE;
}

uint32_t envoy_dynamic_module_on_http_filter_response_body(void* f, const void* m, bool end) {
	const tg_stream* s = m;
	return live(s) ? tgo_response_body((uintptr_t)f, s->go, end) : CONTINUE;
}

uint32_t envoy_dynamic_module_on_http_filter_response_trailers(void* f, const void* m) {
	const tg_stream* s = m;
	return live(s) ? tgo_response_trailers((uintptr_t)f, s->go) : CONTINUE;
}

void envoy_dynamic_module_on_http_filter_stream_complete(void* f, const void* m) {
	tg_stream* s = (tg_stream*)m;
	if (live(s) && tgo_stream_complete((uintptr_t)f, s->go)) s->go = NONE;
}

void envoy_dynamic_module_on_http_filter_destroy(const void* m) {
	tg_stream* s = (tg_stream*)m;
	if (live(s)) tgo_destroy(s->go);
	stream_pool* p = pool;
	if (p == NULL && (p = pool = calloc(1, sizeof *p)) == NULL) {
		free(s);
		return;
	}
	if (p->n >= POOL_MAX) {
		free(s);
		return;
	}
	s->next = p->head;
	p->head = s;
	p->n++;
}

void envoy_dynamic_module_on_http_filter_http_callout_done(void* f, const void* m, uint64_t id, uint32_t result,
                                                          tg_header* headers, size_t n, tg_buffer* chunks, size_t nchunks) {
	const tg_stream* s = m;
	if (live(s)) tgo_callout_done((uintptr_t)f, s->go, id, result, headers, n, chunks, nchunks);
}

void envoy_dynamic_module_on_http_filter_scheduled(void* f, const void* m, uint64_t event) {
	const tg_stream* s = m;
	if (live(s)) tgo_scheduled((uintptr_t)f, s->go, event);
}

// The module makes no HTTP streams of its own, and does not hold the
// downstream: these hooks are required, and do nothing.
void envoy_dynamic_module_on_http_filter_http_stream_headers(void* f, const void* m, uint64_t id, tg_header* h, size_t n,
                                                            bool end) {}
void envoy_dynamic_module_on_http_filter_http_stream_data(void* f, const void* m, uint64_t id, const tg_buffer* d, size_t n,
                                                         bool end) {}
void envoy_dynamic_module_on_http_filter_http_stream_trailers(void* f, const void* m, uint64_t id, tg_header* h, size_t n) {}
void envoy_dynamic_module_on_http_filter_http_stream_complete(void* f, const void* m, uint64_t id) {}
void envoy_dynamic_module_on_http_filter_http_stream_reset(void* f, const void* m, uint64_t id, uint32_t reason) {}
void envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(void* f, const void* m) {}
void envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(void* f, const void* m) {}
