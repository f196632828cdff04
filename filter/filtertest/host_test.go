package filtertest

import "testing"

// TestValuesDieWithTheCallback: a header value, property or string view
// kept past its callback must not still read as it was, or a filter that
// breaks the lifetime rule would pass every native test.
func TestValuesDieWithTheCallback(t *testing.T) {
	h := New()
	h.Request = Get("/", "192.0.2.1:5000", "x-api-key", "secret-key")
	hdr, _ := h.RequestHeader("x-api-key")
	prop, _ := h.Property("source", "address")
	ps, _ := h.PropertyString("source", "address")
	if hdr != "secret-key" || string(prop) != "192.0.2.1:5000" || ps != "192.0.2.1:5000" {
		t.Fatalf("during the callback: %q %q %q", hdr, prop, ps)
	}
	h.EndCallback()
	if hdr == "secret-key" || string(prop) == "192.0.2.1:5000" || ps == "192.0.2.1:5000" {
		t.Errorf("after the callback the kept values still read %q %q %q: a lifetime mistake would pass", hdr, prop, ps)
	}
	// The next callback gets fresh, correct values.
	if v, _ := h.RequestHeader("x-api-key"); v != "secret-key" {
		t.Errorf("next callback: %q", v)
	}
}

// TestHostCopiesWhatItKeeps: what the filter hands the host (response
// headers, local replies, logs) is copied, as Envoy copies it, so a filter
// reusing its buffers does not rewrite what the test observed.
func TestHostCopiesWhatItKeeps(t *testing.T) {
	h := New()
	buf := []byte("value-1")
	h.SetResponseHeader("x", view(buf))
	h.Log(0, view(buf))
	copy(buf, "VALUE-2")
	if got := h.Response.Headers[0][1]; got != "value-1" {
		t.Errorf("response header changed with the filter's buffer: %q", got)
	}
	if got := h.logs[0].Msg; got != "value-1" {
		t.Errorf("log line changed with the filter's buffer: %q", got)
	}
}
