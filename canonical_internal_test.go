package fleet

import (
	"bytes"
	"encoding/json"
	"testing"
)

// TestAppendStringPlain checks the fast path of appendString against the
// encoder it stands for.
func TestAppendStringPlain(t *testing.T) {
	for _, s := range []string{"", "ok", "a b~c", "<&>", `q"uote`, `back\slash`, "tab\there", "é", "\u2028", "\x7f", "\xff"} {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		enc.Encode(s)
		want := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
		if got := appendString(nil, s); !bytes.Equal(got, want) {
			t.Errorf("appendString(%q) = %s, want %s", s, got, want)
		}
	}
}
