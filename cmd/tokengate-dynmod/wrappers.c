// Thin wrappers over Envoy's callbacks, so that Go passes only integers
// and pointers to memory without Go pointers in it (cgo's rules), and the
// header arrays Envoy reads are in C memory.
#include <stdlib.h>
#include <string.h>

#include "abi.h"

static const char abi_version[] = "v0.1.0";

const char* tg_abi_version(void) { return abi_version; }

static tg_buffer buf(const char* p, size_t n) {
	tg_buffer b = {p, n};
	return b;
}

tg_result tg_get_header(uintptr_t f, uint32_t kind, const char* name, size_t name_len, size_t index) {
	tg_result r = {0};
	tg_buffer out = {0};
	size_t count = 0;
	r.ok = envoy_dynamic_module_callback_http_get_header((void*)f, kind, buf(name, name_len), &out, index, &count);
	r.ptr = out.ptr;
	r.len = out.length;
	r.count = count;
	if (r.ok && r.ptr == NULL) r.ok = 0;
	return r;
}

void tg_set_header(uintptr_t f, uint32_t kind, const char* name, size_t name_len, const char* value, size_t value_len, int add) {
	static const char empty[1] = {0};
	if (value == NULL) value = empty; // NULL would remove the header
	if (add) {
		envoy_dynamic_module_callback_http_add_header((void*)f, kind, buf(name, name_len), buf(value, value_len));
	} else {
		envoy_dynamic_module_callback_http_set_header((void*)f, kind, buf(name, name_len), buf(value, value_len));
	}
}

void tg_set_headers(uintptr_t f, uint32_t kind, const char* buf, const uint32_t* ops, size_t n) {
	for (size_t i = 0; i < n; i++) {
		uint32_t add = ops[3 * i], kl = ops[3 * i + 1], vl = ops[3 * i + 2];
		tg_set_header(f, kind, buf, kl, buf + kl, vl, (int)add);
		buf += kl + vl;
	}
}

void tg_log(uint32_t level, const char* msg, size_t len) { envoy_dynamic_module_callback_log(level, buf(msg, len)); }

uint32_t tg_worker_index(uintptr_t f) { return envoy_dynamic_module_callback_http_filter_get_worker_index((void*)f); }

uint32_t tg_concurrency(void) { return envoy_dynamic_module_callback_get_concurrency(); }

tg_id_result tg_define_counter(uintptr_t cfg, const char* name, size_t len) {
	tg_id_result r = {0, 0};
	size_t id = 0;
	r.status = envoy_dynamic_module_callback_http_filter_config_define_counter((void*)cfg, buf(name, len), NULL, 0, &id);
	r.id = id;
	return r;
}

void tg_increment_counter(uintptr_t f, uint64_t id, uint64_t delta) {
	envoy_dynamic_module_callback_http_filter_increment_counter((void*)f, (size_t)id, NULL, 0, delta);
}

tg_result tg_source_address(uintptr_t f) {
	tg_result r = {0};
	tg_buffer out = {0};
	r.ok = envoy_dynamic_module_callback_http_filter_get_attribute_string((void*)f, 24 /* source.address */, &out);
	r.ptr = out.ptr;
	r.len = out.length;
	if (r.ok && r.ptr == NULL) r.ok = 0;
	return r;
}

void tg_continue_decoding(uintptr_t f) { envoy_dynamic_module_callback_http_filter_continue_decoding((void*)f); }

// This thread's header buffer: the bytes, and the offsets of each header
// in them (the array Envoy reads is built at send time, since the bytes may
// move when they grow). One pointer of thread-local storage, dynamic model:
// static TLS is scarce in a library loaded with dlopen.
typedef struct {
	char* bytes;
	size_t len, cap, n;
	size_t off[128][4];
} hdr_buf;

static __thread hdr_buf* hdr __attribute__((tls_model("global-dynamic")));

static hdr_buf* hdrs(void) {
	if (hdr == NULL) hdr = calloc(1, sizeof *hdr);
	return hdr;
}

void tg_hdr_reset(void) {
	hdr_buf* h = hdrs();
	if (h) h->len = h->n = 0;
}

int tg_hdr_add(const char* k, size_t kl, const char* v, size_t vl) {
	hdr_buf* h = hdrs();
	if (h == NULL || h->n >= 128) return 0;
	if (h->len + kl + vl > h->cap) {
		size_t c = h->cap ? h->cap : 1024;
		while (c < h->len + kl + vl) c *= 2;
		char* nb = realloc(h->bytes, c);
		if (nb == NULL) return 0;
		h->bytes = nb;
		h->cap = c;
	}
	if (kl) memcpy(h->bytes + h->len, k, kl);
	if (vl) memcpy(h->bytes + h->len + kl, v, vl);
	h->off[h->n][0] = h->len;
	h->off[h->n][1] = kl;
	h->off[h->n][2] = h->len + kl;
	h->off[h->n][3] = vl;
	h->n++;
	h->len += kl + vl;
	return 1;
}

static size_t hdr_array(tg_header* hs) {
	hdr_buf* h = hdrs();
	if (h == NULL) return 0;
	for (size_t i = 0; i < h->n; i++) {
		hs[i].key_ptr = h->bytes + h->off[i][0];
		hs[i].key_length = h->off[i][1];
		hs[i].value_ptr = h->bytes + h->off[i][2];
		hs[i].value_length = h->off[i][3];
	}
	return h->n;
}

void tg_send_response(uintptr_t f, uint32_t status, const char* body, size_t body_len, const char* details, size_t details_len) {
	tg_header hs[128];
	size_t n = hdr_array(hs);
	envoy_dynamic_module_callback_http_send_response((void*)f, status, n ? hs : NULL, n, buf(body, body_len), buf(details, details_len));
}

tg_id_result tg_callout(uintptr_t f, const char* cluster, size_t cluster_len, const char* body, size_t body_len, uint64_t timeout_ms) {
	tg_header hs[128];
	size_t n = hdr_array(hs);
	tg_id_result r = {0, 0};
	uint64_t id = 0;
	r.status = envoy_dynamic_module_callback_http_filter_http_callout((void*)f, &id, buf(cluster, cluster_len), hs, n, buf(body, body_len), timeout_ms);
	r.id = id;
	return r;
}

uintptr_t tg_scheduler_new(uintptr_t f) { return (uintptr_t)envoy_dynamic_module_callback_http_filter_scheduler_new((void*)f); }

void tg_scheduler_commit(uintptr_t s, uint64_t event) { envoy_dynamic_module_callback_http_filter_scheduler_commit((void*)s, event); }

void tg_scheduler_delete(uintptr_t s) { envoy_dynamic_module_callback_http_filter_scheduler_delete((void*)s); }
