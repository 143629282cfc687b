package fleet_test

import (
	"strings"
	"testing"

	"github.com/fleetd/fleet"
)

// TestValidateMetadata: metadata is stored as JSON, which has no invalid
// UTF-8: such a key or value would be stored as another (U+FFFD), and two
// keys as one, so it is refused by every caller, not only by the HTTP
// decoders that reject invalid UTF-8 anyway; nor, on PostgreSQL, a NUL.
func TestValidateMetadata(t *testing.T) {
	for _, tc := range []struct {
		m    map[string]string
		want string // in the problem; "" for none
	}{
		{map[string]string{"site": "berlin"}, ""},
		{map[string]string{"k\xff": "1", "k\xfe": "2"}, "UTF-8 text"},
		{map[string]string{"site": "ber\xc3lin"}, "UTF-8 text"},
		// PostgreSQL's JSON holds no NUL: it was a 500 there.
		{map[string]string{"site": "ber\x00lin"}, "without NUL"},
		{map[string]string{"si\x00te": "berlin"}, "without NUL"},
		{map[string]string{"": "x"}, "1 to"},
		{map[string]string{"k": strings.Repeat("é", fleet.MaxMetadataValLen+1)}, "at most"},
	} {
		got := fleet.ValidateMetadata(tc.m)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("ValidateMetadata(%q) = %q; want a problem with %q", tc.m, got, tc.want)
		}
	}
}
