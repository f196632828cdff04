package deploy

import (
	"reflect"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ingressFrom returns, by port name, the peers the NetworkPolicy admits
// (nil: every source).
func ingressFrom(np *networkingv1.NetworkPolicy) map[string][]networkingv1.NetworkPolicyPeer {
	out := map[string][]networkingv1.NetworkPolicyPeer{}
	for _, rule := range np.Spec.Ingress {
		for _, p := range rule.Ports {
			out[p.Port.String()] = rule.From
		}
	}
	return out
}

// TestChartTrustDefaults: by default the NetworkPolicy admits to the gRPC
// port only pods labelled tokengate.io/rls-client=true (any namespace),
// to the admin port only the monitoring namespace, and the service keeps
// writes closed (no -allow-unauthenticated-writes, nothing authenticates
// yet: docs/rls.md#trust-model).
func TestChartTrustDefaults(t *testing.T) {
	r := mustRender(t, "")
	from := ingressFrom(r.netpols["tokengate-rls"])
	wantGRPC := []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{},
		PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tokengate.io/rls-client": "true"}}}}
	if got := from["grpc"]; !reflect.DeepEqual(got, wantGRPC) {
		t.Errorf("gRPC port admits %+v, want only the proxies %+v", got, wantGRPC)
	}
	wantAdmin := []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{
		MatchLabels: map[string]string{"kubernetes.io/metadata.name": "monitoring"}}}}
	if got := from["admin"]; !reflect.DeepEqual(got, wantAdmin) {
		t.Errorf("admin port admits %+v, want only the monitoring namespace %+v", got, wantAdmin)
	}
	_, c := rlsContainer(t, r)
	for _, flag := range []string{"-credential-file=", "-allow-unauthenticated-writes", "-tls-client-optional", "-tls-writer-uri-prefix="} {
		if _, ok := argWithPrefix(c, flag); ok {
			t.Errorf("args %q: %s by default", c.Args, flag)
		}
	}
}

// TestChartTrustValues: the proxies' credential is a Secret's key mounted
// where -credential-file points; client certificates may be optional and
// restricted to a SPIFFE prefix; the NetworkPolicy's peers are the values'.
func TestChartTrustValues(t *testing.T) {
	r := mustRender(t, `
tls: {enabled: true, secretName: rls-tls, clientCASecret: rls-clients, clientOptional: true, writerURIPrefix: "spiffe://cluster.local/ns/edge/"}
writes: {credentialSecret: {name: rls-proxies, key: token}}
networkPolicy:
  grpcFrom:
    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: istio-system}}
      podSelector: {matchLabels: {istio: ingressgateway}}
  adminFrom:
    - namespaceSelector: {matchLabels: {team: observability}}
`)
	d, c := rlsContainer(t, r)
	path, ok := argWithPrefix(c, "-credential-file=")
	if !ok || !mountedFile(d, c, path, "rls-proxies", "token") {
		t.Errorf("-credential-file=%s is not Secret rls-proxies's key token", path)
	}
	for _, a := range []string{"-tls-client-optional", "-tls-writer-uri-prefix=spiffe://cluster.local/ns/edge/"} {
		if !hasArg(c, a) {
			t.Errorf("args %q lack %s", c.Args, a)
		}
	}
	if _, ok := argWithPrefix(c, "-allow-unauthenticated-writes"); ok {
		t.Errorf("args %q open writes", c.Args)
	}
	from := ingressFrom(r.netpols["tokengate-rls"])
	if g := from["grpc"]; len(g) != 1 || g[0].PodSelector == nil || g[0].PodSelector.MatchLabels["istio"] != "ingressgateway" {
		t.Errorf("gRPC port admits %+v, want Istio's ingress gateway", g)
	}
	if a := from["admin"]; len(a) != 1 || a[0].NamespaceSelector == nil || a[0].NamespaceSelector.MatchLabels["team"] != "observability" {
		t.Errorf("admin port admits %+v", a)
	}

	open := mustRender(t, `writes: {allowUnauthenticated: true}`)
	if _, c := rlsContainer(t, open); !hasArg(c, "-allow-unauthenticated-writes") {
		t.Errorf("writes.allowUnauthenticated: args %q", c.Args)
	}
	if _, err := render(t, `writes: {credentialSecret: {name: x, key: y}, typo: 1}`); err == nil {
		t.Error("an unknown key under writes was accepted")
	}
}
