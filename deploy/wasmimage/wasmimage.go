// Package wasmimage packages a Wasm module as an OCI image in the "Wasm
// Image Specification" that Istio's image fetcher (pkg/wasm in istio/istio)
// accepts, and writes it as an OCI image layout directory that `oras cp
// --from-oci-layout` and `crane push` can push to any registry.
//
// Two variants exist (github.com/solo-io/wasm, spec/):
//
//   - compat (the default): an ordinary OCI image with exactly one layer of
//     media type application/vnd.oci.image.layer.v1.tar+gzip holding the
//     file plugin.wasm, and the manifest annotation
//     module.wasm.image/variant=compat. Standard container tooling handles
//     it, and Istio tries it first.
//   - oci: an artifact with two layers, a runtime config of media type
//     application/vnd.module.wasm.config.v1+json and the raw module of media
//     type application/vnd.module.wasm.content.layer.v1+wasm. Istio accepts
//     it when it does not parse as compat.
//
// Build is deterministic: the same module and options always give the same
// blobs and digests (no timestamps, fixed tar and gzip headers). Only the
// standard library is used.
package wasmimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Media types and annotations used by the image.
const (
	MediaTypeIndex       = "application/vnd.oci.image.index.v1+json"
	MediaTypeManifest    = "application/vnd.oci.image.manifest.v1+json"
	MediaTypeImageConfig = "application/vnd.oci.image.config.v1+json"
	MediaTypeLayerTarGz  = "application/vnd.oci.image.layer.v1.tar+gzip"
	MediaTypeWasmConfig  = "application/vnd.module.wasm.config.v1+json"
	MediaTypeWasmContent = "application/vnd.module.wasm.content.layer.v1+wasm"

	AnnotationVariant = "module.wasm.image/variant"
	AnnotationRefName = "org.opencontainers.image.ref.name"
	AnnotationTitle   = "org.opencontainers.image.title"

	// PluginFile is the name of the module inside the compat layer; Istio
	// looks for a file with this base name.
	PluginFile = "plugin.wasm"
	// RuntimeConfigFile is the title of the oci variant's config layer.
	RuntimeConfigFile = "runtime-config.json"
)

// Variant is one of the two Wasm image layouts.
type Variant string

// Variants.
const (
	Compat Variant = "compat"
	OCI    Variant = "oci"
)

// Options control Build.
type Options struct {
	// Variant is Compat when empty.
	Variant Variant
	// Tag names the image in the layout's index.json
	// (org.opencontainers.image.ref.name); "latest" when empty.
	Tag string
	// Annotations are added to the manifest, e.g.
	// org.opencontainers.image.source.
	Annotations map[string]string
}

// Descriptor is an OCI content descriptor.
type Descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Manifest is an OCI image manifest.
type Manifest struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     string            `json:"mediaType"`
	Config        Descriptor        `json:"config"`
	Layers        []Descriptor      `json:"layers"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

// Index is an OCI image index, the layout's index.json.
type Index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []Descriptor `json:"manifests"`
}

// imageConfig is the compat variant's OCI image configuration.
type imageConfig struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	RootFS       struct {
		Type    string   `json:"type"`
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
}

// runtimeConfig is the oci variant's runtime configuration
// (application/vnd.module.wasm.config.v1+json).
type runtimeConfig struct {
	Type        string   `json:"type"`
	ABIVersions []string `json:"abiVersions"`
}

// Image is a built image: its manifest and every blob it references.
type Image struct {
	Tag      string
	Manifest Manifest
	// ManifestDescriptor describes the manifest blob; its Digest is the
	// image digest a registry reports after a push.
	ManifestDescriptor Descriptor
	// Blobs maps digests ("sha256:<hex>") to content, manifest included.
	Blobs map[string][]byte
}

// wasmMagic starts every binary Wasm module: "\0asm" and version 1.
var wasmMagic = []byte{0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00}

// Build packages module as an image. module must be a binary Wasm module.
func Build(module []byte, opts Options) (*Image, error) {
	if !bytes.HasPrefix(module, wasmMagic) {
		return nil, errors.New("wasmimage: not a binary Wasm module (no \\0asm version 1 header)")
	}
	if opts.Variant == "" {
		opts.Variant = Compat
	}
	if opts.Tag == "" {
		opts.Tag = "latest"
	}
	img := &Image{Tag: opts.Tag, Blobs: map[string][]byte{}}
	m := Manifest{SchemaVersion: 2, MediaType: MediaTypeManifest, Annotations: map[string]string{}}
	for k, v := range opts.Annotations {
		m.Annotations[k] = v
	}
	switch opts.Variant {
	case Compat:
		tarball, err := pluginTar(module)
		if err != nil {
			return nil, err
		}
		layer, err := gzipBytes(tarball)
		if err != nil {
			return nil, err
		}
		cfg := imageConfig{Architecture: "wasm", OS: "wasi"}
		cfg.RootFS.Type = "layers"
		cfg.RootFS.DiffIDs = []string{digest(tarball)}
		cfgJSON, err := json.Marshal(cfg)
		if err != nil {
			return nil, err
		}
		m.Config = img.add(MediaTypeImageConfig, cfgJSON, nil)
		m.Layers = []Descriptor{img.add(MediaTypeLayerTarGz, layer, nil)}
		m.Annotations[AnnotationVariant] = string(Compat)
	case OCI:
		rc, err := json.Marshal(runtimeConfig{Type: "envoy_proxy", ABIVersions: []string{"proxy_abi_version_0_2_1"}})
		if err != nil {
			return nil, err
		}
		m.Config = img.add(MediaTypeWasmConfig, rc, nil)
		m.Layers = []Descriptor{
			img.add(MediaTypeWasmConfig, rc, map[string]string{AnnotationTitle: RuntimeConfigFile}),
			img.add(MediaTypeWasmContent, module, map[string]string{AnnotationTitle: PluginFile}),
		}
	default:
		return nil, fmt.Errorf("wasmimage: unknown variant %q (want %q or %q)", opts.Variant, Compat, OCI)
	}
	if len(m.Annotations) == 0 {
		m.Annotations = nil
	}
	mj, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	img.Manifest = m
	img.ManifestDescriptor = img.add(MediaTypeManifest, mj, nil)
	return img, nil
}

// add stores a blob and returns its descriptor.
func (img *Image) add(mediaType string, b []byte, annotations map[string]string) Descriptor {
	d := digest(b)
	img.Blobs[d] = b
	return Descriptor{MediaType: mediaType, Digest: d, Size: int64(len(b)), Annotations: annotations}
}

// Index returns the layout's index.json content: one manifest, named Tag.
func (img *Image) Index() Index {
	d := img.ManifestDescriptor
	d.Annotations = map[string]string{AnnotationRefName: img.Tag}
	return Index{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: []Descriptor{d}}
}

// WriteLayout writes the image as an OCI image layout in dir: the
// oci-layout file, index.json (replaced, naming only this image) and
// blobs/sha256/<hex> for every blob. Existing blobs are left in place.
func (img *Image) WriteLayout(dir string) error {
	blobDir := filepath.Join(dir, "blobs", "sha256")
	if err := os.MkdirAll(blobDir, 0o755); err != nil {
		return err
	}
	digests := make([]string, 0, len(img.Blobs))
	for d := range img.Blobs {
		digests = append(digests, d)
	}
	sort.Strings(digests)
	for _, d := range digests {
		if err := os.WriteFile(filepath.Join(blobDir, strings.TrimPrefix(d, "sha256:")), img.Blobs[d], 0o644); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`+"\n"), 0o644); err != nil {
		return err
	}
	idx, err := json.MarshalIndent(img.Index(), "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "index.json"), append(idx, '\n'), 0o644)
}

// ReadLayout reads the image named tag from the OCI image layout in dir,
// checks every digest and size, and extracts the module the way Istio's
// fetcher does: first as the compat variant (the last layer is
// application/vnd.oci.image.layer.v1.tar+gzip and holds a file named
// plugin.wasm), then as the oci variant (exactly two layers, one of them
// application/vnd.module.wasm.content.layer.v1+wasm).
func ReadLayout(dir, tag string) ([]byte, Manifest, error) {
	var m Manifest
	var layout struct {
		ImageLayoutVersion string `json:"imageLayoutVersion"`
	}
	if err := readJSON(filepath.Join(dir, "oci-layout"), &layout); err != nil {
		return nil, m, err
	}
	if layout.ImageLayoutVersion != "1.0.0" {
		return nil, m, fmt.Errorf("wasmimage: imageLayoutVersion %q", layout.ImageLayoutVersion)
	}
	var idx Index
	if err := readJSON(filepath.Join(dir, "index.json"), &idx); err != nil {
		return nil, m, err
	}
	var md *Descriptor
	for i := range idx.Manifests {
		if idx.Manifests[i].Annotations[AnnotationRefName] == tag {
			md = &idx.Manifests[i]
		}
	}
	if md == nil {
		return nil, m, fmt.Errorf("wasmimage: no manifest named %q in %s", tag, dir)
	}
	if md.MediaType != MediaTypeManifest {
		return nil, m, fmt.Errorf("wasmimage: %s is a %s, want an image manifest", md.Digest, md.MediaType)
	}
	mb, err := readBlob(dir, *md)
	if err != nil {
		return nil, m, err
	}
	if err := json.Unmarshal(mb, &m); err != nil {
		return nil, m, fmt.Errorf("wasmimage: manifest: %w", err)
	}
	if _, err := readBlob(dir, m.Config); err != nil {
		return nil, m, err
	}
	if len(m.Layers) == 0 {
		return nil, m, errors.New("wasmimage: the image has no layers")
	}
	last := m.Layers[len(m.Layers)-1]
	if last.MediaType == MediaTypeLayerTarGz {
		b, err := readBlob(dir, last)
		if err != nil {
			return nil, m, err
		}
		w, err := extractPlugin(b)
		return w, m, err
	}
	if len(m.Layers) != 2 {
		return nil, m, fmt.Errorf("wasmimage: neither variant: the last layer is %s and there are %d layers (the oci variant has 2)", last.MediaType, len(m.Layers))
	}
	for _, l := range m.Layers {
		if l.MediaType == MediaTypeWasmContent {
			w, err := readBlob(dir, l)
			return w, m, err
		}
	}
	return nil, m, fmt.Errorf("wasmimage: neither variant: no %s layer", MediaTypeWasmContent)
}

// pluginTar returns a tar archive holding module as plugin.wasm, with fixed
// metadata.
func pluginTar(module []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     PluginFile,
		Mode:     0o644,
		Size:     int64(len(module)),
		ModTime:  time.Unix(0, 0),
		Format:   tar.FormatUSTAR,
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, err
	}
	if _, err := tw.Write(module); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// gzipBytes compresses b with an empty gzip header (no name, no time).
func gzipBytes(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(b); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// extractPlugin returns the plugin.wasm file of a tar+gzip layer.
func extractPlugin(layer []byte) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(layer))
	if err != nil {
		return nil, fmt.Errorf("wasmimage: layer is not gzip: %w", err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil, fmt.Errorf("wasmimage: no %s in the layer", PluginFile)
		}
		if err != nil {
			return nil, fmt.Errorf("wasmimage: layer: %w", err)
		}
		if filepath.Base(h.Name) == PluginFile {
			return io.ReadAll(tr)
		}
	}
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("wasmimage: %s: %w", path, err)
	}
	return nil
}

// readBlob reads the blob d describes and checks its size and digest.
func readBlob(dir string, d Descriptor) ([]byte, error) {
	hexDigest, ok := strings.CutPrefix(d.Digest, "sha256:")
	if !ok || len(hexDigest) != 64 {
		return nil, fmt.Errorf("wasmimage: unsupported digest %q", d.Digest)
	}
	b, err := os.ReadFile(filepath.Join(dir, "blobs", "sha256", hexDigest))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) != d.Size {
		return nil, fmt.Errorf("wasmimage: blob %s is %d bytes, descriptor says %d", d.Digest, len(b), d.Size)
	}
	if got := digest(b); got != d.Digest {
		return nil, fmt.Errorf("wasmimage: blob %s has digest %s", d.Digest, got)
	}
	return b, nil
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}
