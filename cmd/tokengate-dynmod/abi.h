// The callbacks of Envoy's dynamic-module ABI "v0.1.0" (Envoy 1.38) that
// tokengate uses, declared from Envoy's abi.h with layout-identical types of
// our own, and the thin wrappers the Go side calls. The hooks the module
// exports are declared by cgo (_cgo_export.h) from their Go signatures:
// uintptr_t where abi.h says a pointer, which has the same calling
// convention.
#ifndef TOKENGATE_DYNMOD_ABI_H
#define TOKENGATE_DYNMOD_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct { const char* ptr; size_t length; } tg_buffer;
typedef struct { const char* key_ptr; size_t key_length; const char* value_ptr; size_t value_length; } tg_header;

// Envoy's callbacks (resolved by the dynamic linker in the Envoy process).
extern uint32_t envoy_dynamic_module_callback_get_concurrency(void);
extern uint32_t envoy_dynamic_module_callback_http_filter_get_worker_index(void* filter_envoy_ptr);
extern void envoy_dynamic_module_callback_log(uint32_t level, tg_buffer message);
extern uint32_t envoy_dynamic_module_callback_http_filter_config_define_counter(void* config_envoy_ptr, tg_buffer name, tg_buffer* label_names, size_t label_names_length, size_t* counter_id_ptr);
extern uint32_t envoy_dynamic_module_callback_http_filter_increment_counter(void* filter_envoy_ptr, size_t id, tg_buffer* label_values, size_t label_values_length, uint64_t value);
extern bool envoy_dynamic_module_callback_http_get_header(void* filter_envoy_ptr, uint32_t header_type, tg_buffer key, tg_buffer* result, size_t index, size_t* optional_size);
extern bool envoy_dynamic_module_callback_http_set_header(void* filter_envoy_ptr, uint32_t header_type, tg_buffer key, tg_buffer value);
extern bool envoy_dynamic_module_callback_http_add_header(void* filter_envoy_ptr, uint32_t header_type, tg_buffer key, tg_buffer value);
extern void envoy_dynamic_module_callback_http_send_response(void* filter_envoy_ptr, uint32_t status_code, tg_header* headers, size_t headers_size, tg_buffer body, tg_buffer details);
extern void envoy_dynamic_module_callback_http_filter_continue_decoding(void* filter_envoy_ptr);
extern bool envoy_dynamic_module_callback_http_filter_get_attribute_string(void* filter_envoy_ptr, uint32_t attribute_id, tg_buffer* result);
extern uint32_t envoy_dynamic_module_callback_http_filter_http_callout(void* filter_envoy_ptr, uint64_t* callout_id_out, tg_buffer cluster_name, tg_header* headers, size_t headers_size, tg_buffer body, uint64_t timeout_milliseconds);
extern void* envoy_dynamic_module_callback_http_filter_scheduler_new(void* filter_envoy_ptr);
extern void envoy_dynamic_module_callback_http_filter_scheduler_commit(void* scheduler, uint64_t event_id);
extern void envoy_dynamic_module_callback_http_filter_scheduler_delete(void* scheduler);

// A stream's mailbox (filter/dynmod.Mailbox, same layout): the request-
// headers hook's counter increments, and the response headers of a stream
// Go finished at once, left by Go for the hooks' C side (hooks.c).
enum { TG_MAILBOX_HEADERS = 8, TG_MAILBOX_COUNTS = 6, TG_MAILBOX_BYTES = 800 };
typedef struct {
	uint32_t nheaders, ncounts, buflen, pad;
	uint32_t ops[3 * TG_MAILBOX_HEADERS];
	uint64_t counts[2 * TG_MAILBOX_COUNTS];
	char buf[TG_MAILBOX_BYTES];
} tg_mailbox;

// Wrappers (wrappers.c).
typedef struct { const char* ptr; size_t len; size_t count; int ok; } tg_result;
typedef struct { uint64_t id; uint32_t status; } tg_id_result;

const char* tg_abi_version(void);
tg_result tg_get_header(uintptr_t f, uint32_t kind, const char* name, size_t name_len, size_t index);
void tg_set_header(uintptr_t f, uint32_t kind, const char* name, size_t name_len, const char* value, size_t value_len, int add);
// tg_set_headers applies n set (ops[3i] == 0) or add operations; ops[3i+1]
// and ops[3i+2] are the name's and value's lengths, laid out back to back
// in buf.
void tg_set_headers(uintptr_t f, uint32_t kind, const char* buf, const uint32_t* ops, size_t n);
void tg_log(uint32_t level, const char* msg, size_t len);
uint32_t tg_worker_index(uintptr_t f);
uint32_t tg_concurrency(void);
tg_id_result tg_define_counter(uintptr_t cfg, const char* name, size_t len);
void tg_increment_counter(uintptr_t f, uint64_t id, uint64_t delta);
tg_result tg_source_address(uintptr_t f);
void tg_continue_decoding(uintptr_t f);
// Headers for a reply or a callout are copied into this thread's C buffer
// one by one (tg_hdr_reset, tg_hdr_add), then sent.
void tg_hdr_reset(void);
int tg_hdr_add(const char* k, size_t kl, const char* v, size_t vl);
void tg_send_response(uintptr_t f, uint32_t status, const char* body, size_t body_len, const char* details, size_t details_len);
tg_id_result tg_callout(uintptr_t f, const char* cluster, size_t cluster_len, const char* body, size_t body_len, uint64_t timeout_ms);
uintptr_t tg_scheduler_new(uintptr_t f);
void tg_scheduler_commit(uintptr_t s, uint64_t event);
void tg_scheduler_delete(uintptr_t s);

#endif
