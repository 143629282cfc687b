package codec_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetd/fleet/codec"
)

// exemplarDir holds transit-format's 67 example values, each written by
// transit-clj as .edn, .json, .verbose.json and .mp.
const exemplarDir = "testdata/transit-exemplars"

// exemplarNames lists the exemplars, by file name without extension.
func exemplarNames(t testing.TB) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(exemplarDir, "*.mp"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no exemplars in %s: %v", exemplarDir, err)
	}
	var names []string
	for _, f := range files {
		names = append(names, strings.TrimSuffix(filepath.Base(f), ".mp"))
	}
	return names
}

func readExemplar(t testing.TB, name, ext string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(exemplarDir, name+ext))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// lossyEDN names the exemplars whose .edn file lost the value: transit-clj
// printed the tagged values as #object[TaggedValueImpl …] with no content.
var lossyEDN = map[string]bool{"maps_unrecognized_keys": true}

// TestExemplars reads every exemplar from its four files and requires the
// same full-fidelity value from each.
func TestExemplars(t *testing.T) {
	for _, name := range exemplarNames(t) {
		t.Run(name, func(t *testing.T) {
			fromJSON, err := codec.ReadTransitJSON(readExemplar(t, name, ".json"))
			if err != nil {
				t.Fatalf("json: %v", err)
			}
			fromVerbose, err := codec.ReadTransitJSON(readExemplar(t, name, ".verbose.json"))
			if err != nil {
				t.Fatalf("verbose json: %v", err)
			}
			fromMsgpack, err := codec.ReadTransitMsgpack(readExemplar(t, name, ".mp"))
			if err != nil {
				t.Fatalf("msgpack: %v", err)
			}
			if !codec.Equal(fromJSON, fromVerbose) {
				t.Errorf("json and verbose json differ:\n%#v\n%#v", fromJSON, fromVerbose)
			}
			if !codec.Equal(fromJSON, fromMsgpack) {
				t.Errorf("json and msgpack differ:\n%#v\n%#v", fromJSON, fromMsgpack)
			}
			fromEDN, err := codec.ReadEDN(readExemplar(t, name, ".edn"))
			if err != nil {
				t.Fatalf("edn: %v", err)
			}
			if lossyEDN[name] {
				return
			}
			if !codec.Equal(fromJSON, fromEDN) {
				t.Errorf("json and edn differ:\n%#v\n%#v", fromJSON, fromEDN)
			}
		})
	}
}
