package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/tokengate/tokengate/internal/service/rls"
)

const chartDir = "helm/tokengate-rls"

// Release name and namespace the tests (and the guides) install as:
// fullname is then "tokengate-rls" and the service
// tokengate-rls.tokengate.svc.cluster.local.
const (
	releaseName = "tokengate-rls"
	releaseNS   = "tokengate"
)

// rendered holds one rendering of the chart, decoded object by object.
type rendered struct {
	deployments map[string]*appsv1.Deployment
	services    map[string]*corev1.Service
	configMaps  map[string]*corev1.ConfigMap
	accounts    map[string]*corev1.ServiceAccount
	pdbs        map[string]*policyv1.PodDisruptionBudget
	hpas        map[string]*autoscalingv2.HorizontalPodAutoscaler
	netpols     map[string]*networkingv1.NetworkPolicy
	kinds       []string // "Kind/name", sorted
	raw         string   // every manifest, for searching
	notes       string
}

// decodeStrict turns one YAML manifest into the typed object: YAML → JSON
// → json.Decoder with DisallowUnknownFields, so that a misspelt or
// misplaced field, a wrong type or trailing data fails.
func decodeStrict(doc []byte, into any) error {
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("trailing data after the object")
	}
	return nil
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// capabilities are a recent cluster's: the chart needs >= 1.27.
func capabilities() *chartutil.Capabilities {
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = chartutil.KubeVersion{Version: "v1.31.0", Major: "1", Minor: "31"}
	return caps
}

// render renders the chart with vals (YAML, merged over values.yaml) the
// way `helm template` does, and decodes every object strictly into its
// k8s.io/api type. Any kind the chart is not expected to make fails.
func render(t *testing.T, vals string) (*rendered, error) {
	t.Helper()
	ch := loadChart(t)
	user, err := chartutil.ReadValues([]byte(vals))
	if err != nil {
		t.Fatalf("test values: %v", err)
	}
	top, err := chartutil.ToRenderValues(ch, user, chartutil.ReleaseOptions{
		Name: releaseName, Namespace: releaseNS, Revision: 1, IsInstall: true,
	}, capabilities())
	if err != nil {
		return nil, err
	}
	files, err := engine.Render(ch, top)
	if err != nil {
		return nil, err
	}
	r := &rendered{
		deployments: map[string]*appsv1.Deployment{},
		services:    map[string]*corev1.Service{},
		configMaps:  map[string]*corev1.ConfigMap{},
		accounts:    map[string]*corev1.ServiceAccount{},
		pdbs:        map[string]*policyv1.PodDisruptionBudget{},
		hpas:        map[string]*autoscalingv2.HorizontalPodAutoscaler{},
		netpols:     map[string]*networkingv1.NetworkPolicy{},
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		text := files[name]
		if strings.HasSuffix(name, "NOTES.txt") {
			r.notes = text
			continue
		}
		if strings.HasPrefix(filepath.Base(name), "_") {
			continue
		}
		for i, doc := range strings.Split(text, "\n---") {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			r.raw += doc + "\n---\n"
			if err := r.add([]byte(doc)); err != nil {
				t.Fatalf("%s, document %d: %v\n%s", name, i, err, doc)
			}
		}
	}
	sort.Strings(r.kinds)
	return r, nil
}

func (r *rendered) add(doc []byte) error {
	var tm struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
	}
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return err
	}
	if tm.Metadata.Namespace != releaseNS {
		return fmt.Errorf("%s %s: namespace %q, want the release's %q", tm.Kind, tm.Metadata.Name, tm.Metadata.Namespace, releaseNS)
	}
	gvk := tm.APIVersion + " " + tm.Kind
	var obj any
	switch gvk {
	case "apps/v1 Deployment":
		o := &appsv1.Deployment{}
		r.deployments[tm.Metadata.Name], obj = o, o
	case "v1 Service":
		o := &corev1.Service{}
		r.services[tm.Metadata.Name], obj = o, o
	case "v1 ConfigMap":
		o := &corev1.ConfigMap{}
		r.configMaps[tm.Metadata.Name], obj = o, o
	case "v1 ServiceAccount":
		o := &corev1.ServiceAccount{}
		r.accounts[tm.Metadata.Name], obj = o, o
	case "policy/v1 PodDisruptionBudget":
		o := &policyv1.PodDisruptionBudget{}
		r.pdbs[tm.Metadata.Name], obj = o, o
	case "autoscaling/v2 HorizontalPodAutoscaler":
		o := &autoscalingv2.HorizontalPodAutoscaler{}
		r.hpas[tm.Metadata.Name], obj = o, o
	case "networking.k8s.io/v1 NetworkPolicy":
		o := &networkingv1.NetworkPolicy{}
		r.netpols[tm.Metadata.Name], obj = o, o
	default:
		return fmt.Errorf("unexpected object %s %s", gvk, tm.Metadata.Name)
	}
	if err := decodeStrict(doc, obj); err != nil {
		return fmt.Errorf("%s %s: %w", gvk, tm.Metadata.Name, err)
	}
	r.kinds = append(r.kinds, tm.Kind+"/"+tm.Metadata.Name)
	return nil
}

func mustRender(t *testing.T, vals string) *rendered {
	t.Helper()
	r, err := render(t, vals)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// rlsContainer is the Deployment's tokengate-rls container.
func rlsContainer(t *testing.T, r *rendered) (*appsv1.Deployment, corev1.Container) {
	t.Helper()
	d, ok := r.deployments[releaseName]
	if !ok {
		t.Fatalf("no Deployment %s (objects %v)", releaseName, r.kinds)
	}
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name == "tokengate-rls" {
			return d, c
		}
	}
	t.Fatalf("Deployment %s has no tokengate-rls container", releaseName)
	return nil, corev1.Container{}
}

func hasArg(c corev1.Container, arg string) bool { return slices.Contains(c.Args, arg) }

func argWithPrefix(c corev1.Container, prefix string) (string, bool) {
	for _, a := range c.Args {
		if strings.HasPrefix(a, prefix) {
			return strings.TrimPrefix(a, prefix), true
		}
	}
	return "", false
}

// mountedFile reports whether path is inside a volume mounted in c whose
// source is the Secret secret (or ConfigMap, by name) holding key.
func mountedFile(d *appsv1.Deployment, c corev1.Container, path, source, key string) bool {
	for _, m := range c.VolumeMounts {
		if filepath.Dir(path) != m.MountPath {
			continue
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name != m.Name {
				continue
			}
			var items []corev1.KeyToPath
			switch {
			case v.Secret != nil && v.Secret.SecretName == source:
				items = v.Secret.Items
			case v.ConfigMap != nil && v.ConfigMap.Name == source:
				items = v.ConfigMap.Items
			default:
				return false
			}
			for _, it := range items {
				if it.Key == key && it.Path == filepath.Base(path) {
					return true
				}
			}
		}
	}
	return false
}

func matches(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func TestChartDefaults(t *testing.T) {
	r := mustRender(t, "")
	want := []string{
		"ConfigMap/tokengate-rls-config",
		"Deployment/tokengate-rls", "Deployment/tokengate-rls-redis",
		"HorizontalPodAutoscaler/tokengate-rls",
		"NetworkPolicy/tokengate-rls", "NetworkPolicy/tokengate-rls-redis",
		"PodDisruptionBudget/tokengate-rls",
		"Service/tokengate-rls", "Service/tokengate-rls-redis",
		"ServiceAccount/tokengate-rls",
	}
	if !reflect.DeepEqual(r.kinds, want) {
		t.Errorf("objects:\n got %v\nwant %v", r.kinds, want)
	}
	d, c := rlsContainer(t, r)
	pod := d.Spec.Template
	podLabels := pod.Labels

	// The rules: a ConfigMap the service's own parser accepts, mounted
	// where -config points, as a directory (no subPath: updates arrive).
	cfgPath, ok := argWithPrefix(c, "-config=")
	if !ok {
		t.Fatalf("no -config in %q", c.Args)
	}
	if !mountedFile(d, c, cfgPath, "tokengate-rls-config", "tokengate.json") {
		t.Errorf("-config=%s is not the ConfigMap's tokengate.json", cfgPath)
	}
	for _, m := range c.VolumeMounts {
		if m.SubPath != "" {
			t.Errorf("volume %s mounted with subPath %q: updates would never reach it", m.Name, m.SubPath)
		}
	}
	rulesJSON := r.configMaps["tokengate-rls-config"].Data["tokengate.json"]
	cfg, err := rls.ParseConfig([]byte(rulesJSON))
	if err != nil {
		t.Errorf("the ConfigMap's tokengate.json does not parse: %v\n%s", err, rulesJSON)
	} else if len(cfg.Rules()) == 0 {
		t.Error("the default configuration has no rule")
	}

	// Listeners on every interface, on the ports the Service targets.
	for _, a := range []string{"-listen=:8081", "-admin=:9901", "-redis=tokengate-rls-redis:6379"} {
		if !hasArg(c, a) {
			t.Errorf("args %q lack %s", c.Args, a)
		}
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["grpc"] != 8081 || ports["admin"] != 9901 {
		t.Errorf("container ports %v, want grpc 8081 and admin 9901", ports)
	}

	// Probes: readiness by grpc.health.v1 (service "") on the gRPC port,
	// liveness by /live on the admin port.
	rp := c.ReadinessProbe
	if rp == nil || rp.GRPC == nil || rp.GRPC.Port != 8081 || rp.GRPC.Service == nil || *rp.GRPC.Service != "" {
		t.Errorf("readiness probe %+v, want gRPC health on 8081 for service \"\"", rp)
	}
	lp := c.LivenessProbe
	if lp == nil || lp.HTTPGet == nil || lp.HTTPGet.Path != "/live" || lp.HTTPGet.Port != intstr.FromString("admin") {
		t.Errorf("liveness probe %+v, want GET /live on the admin port", lp)
	}

	// Resources and security.
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v: want CPU and memory requests and a memory limit", c.Resources)
	}
	if !c.Resources.Limits.Cpu().IsZero() {
		t.Errorf("a CPU limit (%v): throttling would break the latency bound", c.Resources.Limits.Cpu())
	}
	psc, sc := pod.Spec.SecurityContext, c.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Errorf("pod security context %+v: want runAsNonRoot and a non-zero uid", psc)
	}
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("container security context %+v", sc)
	}
	if d.Spec.Replicas != nil {
		t.Errorf("replicas %d set while the HPA owns the count", *d.Spec.Replicas)
	}
	if !matches(d.Spec.Selector.MatchLabels, podLabels) {
		t.Errorf("the Deployment's selector %v does not match its pods %v", d.Spec.Selector.MatchLabels, podLabels)
	}
	if pod.Spec.ServiceAccountName != "tokengate-rls" {
		t.Errorf("service account %q", pod.Spec.ServiceAccountName)
	}
	if pod.Spec.TerminationGracePeriodSeconds == nil || *pod.Spec.TerminationGracePeriodSeconds <= 10 {
		t.Errorf("terminationGracePeriodSeconds %v: must exceed -drain-delay + -drain (10 s)", pod.Spec.TerminationGracePeriodSeconds)
	}

	// The Service: HTTP/2 cleartext on the gRPC port.
	svc := r.services["tokengate-rls"]
	if !matches(svc.Spec.Selector, podLabels) {
		t.Errorf("the Service selects %v, not the pods %v", svc.Spec.Selector, podLabels)
	}
	if matches(svc.Spec.Selector, r.deployments["tokengate-rls-redis"].Spec.Template.Labels) {
		t.Error("the Service also selects the Redis pod")
	}
	sp := map[string]corev1.ServicePort{}
	for _, p := range svc.Spec.Ports {
		sp[p.Name] = p
	}
	if g := sp["grpc"]; g.Port != 8081 || g.TargetPort != intstr.FromString("grpc") || g.AppProtocol == nil || *g.AppProtocol != "kubernetes.io/h2c" {
		t.Errorf("Service port grpc %+v, want 8081 → grpc with appProtocol kubernetes.io/h2c", g)
	}
	if a := sp["http-admin"]; a.Port != 9901 || a.TargetPort != intstr.FromString("admin") {
		t.Errorf("Service port http-admin %+v", a)
	}

	// PDB and HPA point at these pods.
	pdb := r.pdbs["tokengate-rls"]
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 || !matches(pdb.Spec.Selector.MatchLabels, podLabels) {
		t.Errorf("PDB %+v", pdb.Spec)
	}
	hpa := r.hpas["tokengate-rls"]
	if ref := hpa.Spec.ScaleTargetRef; ref.Kind != "Deployment" || ref.Name != "tokengate-rls" || ref.APIVersion != "apps/v1" {
		t.Errorf("HPA targets %+v", ref)
	}
	if hpa.Spec.MinReplicas == nil || *hpa.Spec.MinReplicas < 2 || hpa.Spec.MaxReplicas < *hpa.Spec.MinReplicas {
		t.Errorf("HPA replicas %v..%d", hpa.Spec.MinReplicas, hpa.Spec.MaxReplicas)
	}
	if len(hpa.Spec.Metrics) != 1 || hpa.Spec.Metrics[0].Resource == nil || hpa.Spec.Metrics[0].Resource.Name != corev1.ResourceCPU {
		t.Errorf("HPA metrics %+v, want CPU utilisation", hpa.Spec.Metrics)
	}

	// NetworkPolicy: the service's pods take gRPC and admin, reach DNS and
	// the in-release Redis only; that Redis takes only them.
	np := r.netpols["tokengate-rls"]
	if !matches(np.Spec.PodSelector.MatchLabels, podLabels) {
		t.Errorf("NetworkPolicy selects %v", np.Spec.PodSelector.MatchLabels)
	}
	var inPorts []string
	for _, rule := range np.Spec.Ingress {
		for _, p := range rule.Ports {
			inPorts = append(inPorts, p.Port.String())
		}
	}
	if !reflect.DeepEqual(inPorts, []string{"grpc", "admin"}) {
		t.Errorf("ingress ports %v, want grpc and admin", inPorts)
	}
	redisPods := r.deployments["tokengate-rls-redis"].Spec.Template.Labels
	var toRedis bool
	for _, rule := range np.Spec.Egress {
		for _, peer := range rule.To {
			if peer.PodSelector != nil && matches(peer.PodSelector.MatchLabels, redisPods) {
				toRedis = len(rule.Ports) == 1 && rule.Ports[0].Port.IntValue() == 6379
			}
		}
	}
	if !toRedis {
		t.Errorf("egress %+v does not allow the Redis pod on 6379", np.Spec.Egress)
	}
	rnp := r.netpols["tokengate-rls-redis"]
	if !matches(rnp.Spec.PodSelector.MatchLabels, redisPods) || len(rnp.Spec.Ingress) != 1 ||
		len(rnp.Spec.Ingress[0].From) != 1 || !matches(rnp.Spec.Ingress[0].From[0].PodSelector.MatchLabels, podLabels) {
		t.Errorf("Redis NetworkPolicy %+v: want ingress from the service's pods only", rnp.Spec)
	}
	if !matches(r.services["tokengate-rls-redis"].Spec.Selector, redisPods) {
		t.Error("the Redis Service does not select the Redis pod")
	}
	if !strings.Contains(r.notes, "outbound|8081||tokengate-rls.tokengate.svc.cluster.local") {
		t.Errorf("NOTES.txt does not give Istio's cluster name:\n%s", r.notes)
	}
}

// TestChartExternalRedis: an external Redis Cluster with an ACL user, a
// password and TLS, each secret a mounted file; no Redis in the release.
func TestChartExternalRedis(t *testing.T) {
	r := mustRender(t, `
redis:
  timeout: 40ms
  internal: {enabled: false}
  external:
    addresses: [redis-0.redis:6379, redis-1.redis:6379]
    cluster: true
    username: tokengate
    passwordSecret: {name: redis-auth, key: pass}
    tls:
      enabled: true
      serverName: redis.example.internal
      caSecret: {name: redis-ca}
      clientCertSecret: redis-client
networkPolicy:
  egress:
    redisTo: [{ipBlock: {cidr: 10.20.0.0/16}}]
    redisPorts: [6379, 16379]
`)
	d, c := rlsContainer(t, r)
	for _, a := range []string{
		"-redis=redis-0.redis:6379,redis-1.redis:6379", "-redis-cluster", "-redis-timeout=40ms",
		"-redis-user=tokengate", "-redis-tls", "-redis-tls-server-name=redis.example.internal",
	} {
		if !hasArg(c, a) {
			t.Errorf("args %q lack %s", c.Args, a)
		}
	}
	for flag, src := range map[string][2]string{
		"-redis-password-file=": {"redis-auth", "pass"},
		"-redis-tls-ca=":        {"redis-ca", "ca.crt"},
		"-redis-tls-cert=":      {"redis-client", "tls.crt"},
		"-redis-tls-key=":       {"redis-client", "tls.key"},
	} {
		path, ok := argWithPrefix(c, flag)
		if !ok {
			t.Errorf("no %s in %q", flag, c.Args)
			continue
		}
		if !mountedFile(d, c, path, src[0], src[1]) {
			t.Errorf("%s%s is not Secret %s's key %s", flag, path, src[0], src[1])
		}
	}
	for _, e := range c.Env {
		if strings.Contains(strings.ToUpper(e.Name), "PASSWORD") {
			t.Errorf("env %s: the password must be a file, not the environment", e.Name)
		}
	}
	if _, ok := r.deployments["tokengate-rls-redis"]; ok {
		t.Error("an in-release Redis with an external one")
	}
	if _, ok := r.services["tokengate-rls-redis"]; ok {
		t.Error("an in-release Redis Service with an external one")
	}
	np := r.netpols["tokengate-rls"]
	var found bool
	for _, rule := range np.Spec.Egress {
		if len(rule.To) == 1 && rule.To[0].IPBlock != nil && rule.To[0].IPBlock.CIDR == "10.20.0.0/16" {
			var ports []int
			for _, p := range rule.Ports {
				ports = append(ports, p.Port.IntValue())
			}
			found = reflect.DeepEqual(ports, []int{6379, 16379})
		}
	}
	if !found {
		t.Errorf("egress %+v: want 10.20.0.0/16 on 6379 and 16379", np.Spec.Egress)
	}
}

func TestChartSentinel(t *testing.T) {
	r := mustRender(t, `
redis:
  internal: {enabled: false}
  external:
    addresses: [sentinel-0:26379, sentinel-1:26379, sentinel-2:26379]
    sentinel:
      master: mymaster
      passwordSecret: {name: sentinel-auth}
`)
	d, c := rlsContainer(t, r)
	if !hasArg(c, "-redis=sentinel-0:26379,sentinel-1:26379,sentinel-2:26379") || !hasArg(c, "-redis-sentinel-master=mymaster") {
		t.Errorf("args %q", c.Args)
	}
	if hasArg(c, "-redis-cluster") || hasArg(c, "-redis-tls") {
		t.Errorf("args %q: cluster or TLS not asked for", c.Args)
	}
	path, ok := argWithPrefix(c, "-redis-sentinel-password-file=")
	if !ok || !mountedFile(d, c, path, "sentinel-auth", "password") {
		t.Errorf("-redis-sentinel-password-file %q is not Secret sentinel-auth's key password", path)
	}
	if _, ok := argWithPrefix(c, "-redis-password-file="); ok {
		t.Errorf("a Redis password file with no passwordSecret: %q", c.Args)
	}
}

// TestChartServerTLS: gRPC over TLS with client certificates; readiness
// moves to /ready (the kubelet's gRPC probe has no TLS) and the Service
// no longer claims cleartext HTTP/2.
func TestChartServerTLS(t *testing.T) {
	r := mustRender(t, `
tls: {enabled: true, secretName: rls-tls, clientCASecret: rls-clients}
`)
	d, c := rlsContainer(t, r)
	for flag, src := range map[string][2]string{
		"-tls-cert=":      {"rls-tls", "tls.crt"},
		"-tls-key=":       {"rls-tls", "tls.key"},
		"-tls-client-ca=": {"rls-clients", "ca.crt"},
	} {
		path, ok := argWithPrefix(c, flag)
		if !ok || !mountedFile(d, c, path, src[0], src[1]) {
			t.Errorf("%s%s is not Secret %s's key %s", flag, path, src[0], src[1])
		}
	}
	rp := c.ReadinessProbe
	if rp == nil || rp.HTTPGet == nil || rp.HTTPGet.Path != "/ready" || rp.HTTPGet.Port != intstr.FromString("admin") || rp.GRPC != nil {
		t.Errorf("readiness probe %+v, want GET /ready on the admin port", rp)
	}
	for _, p := range r.services["tokengate-rls"].Spec.Ports {
		if p.Name == "grpc" && (p.AppProtocol == nil || *p.AppProtocol != "https") {
			t.Errorf("grpc port appProtocol %v with TLS, want https", p.AppProtocol)
		}
	}
}

func TestChartOptionalObjects(t *testing.T) {
	r := mustRender(t, `
replicaCount: 3
autoscaling: {enabled: false}
podDisruptionBudget: {enabled: false}
networkPolicy: {enabled: false}
serviceAccount: {create: false}
existingConfigMap: my-rules
image: {digest: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}
`)
	want := []string{"Deployment/tokengate-rls", "Deployment/tokengate-rls-redis", "Service/tokengate-rls", "Service/tokengate-rls-redis"}
	if !reflect.DeepEqual(r.kinds, want) {
		t.Errorf("objects %v, want %v", r.kinds, want)
	}
	d, c := rlsContainer(t, r)
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 3 {
		t.Errorf("replicas %v, want 3", d.Spec.Replicas)
	}
	path, _ := argWithPrefix(c, "-config=")
	if !mountedFile(d, c, path, "my-rules", "tokengate.json") {
		t.Errorf("-config=%s is not ConfigMap my-rules's tokengate.json", path)
	}
	if c.Image != "registry.example.com/tokengate/tokengate-rls@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" {
		t.Errorf("image %s, want the digest", c.Image)
	}
}

// TestChartRefuses: values that cannot work fail the rendering with a
// message naming the value, instead of a broken Deployment.
func TestChartRefuses(t *testing.T) {
	for _, tc := range []struct{ name, vals, want string }{
		{"external Redis without addresses", "redis: {internal: {enabled: false}}", "redis.external.addresses"},
		{"TLS without a Secret", "tls: {enabled: true}", "tls.secretName"},
		{"a misspelt value", "redis: {extrenal: {}}", "extrenal"},
		{"an unknown log level", "log: {level: verbose}", "level"},
		{"an address without a port", "redis: {internal: {enabled: false}, external: {addresses: [redis]}}", "addresses"},
		{"a bad duration", "drainDelay: 5", "drainDelay"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, tc.vals)
			if err == nil {
				t.Fatal("rendered, want an error")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name %s", err, tc.want)
			}
		})
	}
}

// TestChartLint runs Helm's linter (the checks of `helm lint --strict`).
func TestChartLint(t *testing.T) {
	res := lint.AllWithKubeVersion(chartDir, map[string]any{}, releaseNS, &capabilities().KubeVersion)
	for _, m := range res.Messages {
		if m.Severity >= support.WarningSev {
			t.Errorf("helm lint: %s", m)
		}
	}
}

// TestDecodeStrict: the decoding the chart tests rely on refuses what
// the API server would drop or refuse.
func TestDecodeStrict(t *testing.T) {
	for _, tc := range []struct{ name, doc string }{
		{"unknown field", "apiVersion: apps/v1\nkind: Deployment\nspec:\n  replica: 2\n"},
		{"misplaced field", "apiVersion: v1\nkind: Service\nspec:\n  ports:\n    - port: 80\n      appProtcol: http\n"},
		{"wrong type", "apiVersion: v1\nkind: Service\nspec:\n  ports:\n    - port: eighty\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var obj any = &appsv1.Deployment{}
			if strings.Contains(tc.doc, "Service") {
				obj = &corev1.Service{}
			}
			if err := decodeStrict([]byte(tc.doc), obj); err == nil {
				t.Error("decoded, want an error")
			}
		})
	}
}
