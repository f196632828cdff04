package deploy

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestChartAdminDefaults: by default the chart configures no admin
// credential and no admin certificate prefix (the admin API answers 403),
// and the admin port's probes speak plain HTTP.
func TestChartAdminDefaults(t *testing.T) {
	r := mustRender(t, "")
	d, c := rlsContainer(t, r)
	for _, flag := range []string{"-admin-credential-file=", "-usage-credential-file=", "-tls-admin-uri-prefix="} {
		if _, ok := argWithPrefix(c, flag); ok {
			t.Errorf("args %q: %s by default", c.Args, flag)
		}
	}
	if p := c.LivenessProbe.HTTPGet; p == nil || p.Scheme == corev1.URISchemeHTTPS {
		t.Errorf("liveness probe %+v, want plain HTTP", c.LivenessProbe)
	}
	if _, ok := d.Spec.Template.Annotations["prometheus.io/scheme"]; ok {
		t.Errorf("annotations %v: a scrape scheme by default", d.Spec.Template.Annotations)
	}
}

// TestChartAdminValues: the admin's and the usage endpoint's credentials
// are Secrets' keys mounted where -admin-credential-file and
// -usage-credential-file point; admin.uriPrefix passes
// -tls-admin-uri-prefix and switches the admin port's probes and scrape to
// HTTPS; without the client CA it is refused at render time.
func TestChartAdminValues(t *testing.T) {
	r := mustRender(t, `
tls: {enabled: true, secretName: rls-tls, clientCASecret: rls-clients, writerURIPrefix: "spiffe://cluster.local/ns/edge/"}
admin:
  credentialSecret: {name: rls-admins, key: token}
  usageCredentialSecret: {name: rls-portal, key: portal}
  uriPrefix: "spiffe://cluster.local/ns/ops/"
`)
	d, c := rlsContainer(t, r)
	for flag, src := range map[string][2]string{
		"-admin-credential-file=": {"rls-admins", "token"},
		"-usage-credential-file=": {"rls-portal", "portal"},
	} {
		path, ok := argWithPrefix(c, flag)
		if !ok || !mountedFile(d, c, path, src[0], src[1]) {
			t.Errorf("%s%s is not Secret %s's key %s", flag, path, src[0], src[1])
		}
	}
	if !hasArg(c, "-tls-admin-uri-prefix=spiffe://cluster.local/ns/ops/") {
		t.Errorf("args %q lack -tls-admin-uri-prefix", c.Args)
	}
	for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Scheme != corev1.URISchemeHTTPS {
			t.Errorf("%s probe %+v, want HTTPS on the TLS admin port", name, p)
		}
	}
	if got := d.Spec.Template.Annotations["prometheus.io/scheme"]; got != "https" {
		t.Errorf("prometheus.io/scheme %q, want https", got)
	}
	if _, err := render(t, `admin: {uriPrefix: "spiffe://x/ops/"}`); err == nil || !strings.Contains(err.Error(), "admin.uriPrefix needs tls.enabled and tls.clientCASecret") {
		t.Errorf("admin.uriPrefix without a client CA: %v, want a render error naming it", err)
	}
	if _, err := render(t, `admin: {credentialSecret: {name: x, key: y}, typo: 1}`); err == nil {
		t.Error("an unknown key under admin was accepted")
	}
}
