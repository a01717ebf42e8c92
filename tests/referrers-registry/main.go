// referrers-registry: the OCI registry of go-containerregistry's pkg/registry (pinned in go.mod)
// with its OCI 1.1 referrers API on (`GET /v2/<name>/referrers/<digest>`), on a loopback port:
// the test environment's registry that serves referrers (distribution 2.8 does not).
// scripts/install-deps.sh builds it, scripts/test-env.sh starts it.
//
// One correction on top: pkg/registry v0.22.1 lists each referrer with its config's media
// type as `artifactType`, even when the manifest has an `artifactType` of its own; the OCI
// distribution spec (1.1, "Listing Referrers") says the manifest's `artifactType` comes
// first, as distribution 3, zot and Harbor answer. The answer is also sorted by digest (the
// package lists them in map order). Manifests live in memory, blobs under -blobs.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
)

// fixReferrers wraps the registry: a referrers answer gets each manifest's own artifactType.
func fixReferrers(inner http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elems := strings.Split(r.URL.Path, "/")
		if r.Method != http.MethodGet || len(elems) < 5 || elems[len(elems)-2] != "referrers" {
			inner.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		inner.ServeHTTP(rec, r)
		var index map[string]any
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &index) != nil {
			copyAnswer(w, rec, rec.Body.Bytes())
			return
		}
		repo := strings.Join(elems[2:len(elems)-2], "/")
		list, _ := index["manifests"].([]any)
		for _, d := range list {
			desc, ok := d.(map[string]any)
			if !ok {
				continue
			}
			digest, _ := desc["digest"].(string)
			get := httptest.NewRequest(http.MethodGet, "/v2/"+repo+"/manifests/"+digest, nil)
			m := httptest.NewRecorder()
			inner.ServeHTTP(m, get)
			var own struct {
				ArtifactType string `json:"artifactType"`
			}
			if m.Code == http.StatusOK && json.Unmarshal(m.Body.Bytes(), &own) == nil && own.ArtifactType != "" {
				desc["artifactType"] = own.ArtifactType
			}
		}
		sort.SliceStable(list, func(i, j int) bool {
			a, _ := list[i].(map[string]any)
			b, _ := list[j].(map[string]any)
			x, _ := a["digest"].(string)
			y, _ := b["digest"].(string)
			return x < y
		})
		body, err := json.Marshal(index)
		if err != nil {
			copyAnswer(w, rec, rec.Body.Bytes())
			return
		}
		copyAnswer(w, rec, body)
	})
}

func copyAnswer(w http.ResponseWriter, rec *httptest.ResponseRecorder, body []byte) {
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.Header().Set("Content-Length", fmt.Sprint(len(body)))
	w.WriteHeader(rec.Code)
	_, _ = bytes.NewReader(body).WriteTo(w)
}

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "address to listen on (HOST:PORT)")
	blobs := flag.String("blobs", "", "directory for the blobs (required)")
	flag.Parse()
	if *blobs == "" {
		fmt.Fprintln(os.Stderr, "referrers-registry: -blobs DIR is required")
		os.Exit(2)
	}
	if err := os.MkdirAll(*blobs, 0o755); err != nil {
		log.Fatalf("referrers-registry: %v", err)
	}
	h := registry.New(
		registry.WithReferrersSupport(true),
		registry.WithBlobHandler(registry.NewDiskBlobHandler(*blobs)),
		registry.Logger(log.New(os.Stderr, "", log.LstdFlags)),
	)
	s := &http.Server{
		Addr:              *addr,
		Handler:           fixReferrers(h),
		ReadHeaderTimeout: 30 * time.Second,
	}
	log.Printf("referrers-registry: serving on %s (OCI 1.1 referrers API on)", *addr)
	log.Fatal(s.ListenAndServe())
}
