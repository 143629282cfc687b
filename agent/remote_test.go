package agent

import (
	"os"
	"path/filepath"
	"testing"
)

// TestRemotePath: get and put stay within --remote-root, whatever the path
// names: .., an absolute path, a symbolic link out of it, or the root
// itself as a file to put (whose temporary file would go beside it, in
// its parent).
func TestRemotePath(t *testing.T) {
	parent := t.TempDir()
	root := filepath.Join(parent, "share")
	if err := os.MkdirAll(filepath.Join(root, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(parent, "secret"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(parent, filepath.Join(root, "out")); err != nil {
		t.Fatal(err)
	}
	a := testAgent(t)
	a.cfg.RemoteRoot = root
	for _, tc := range []struct {
		path      string
		mustExist bool
		want      string // "" for refused
	}{
		{"dir", true, filepath.Join(root, "dir")},
		{"/dir/new", false, filepath.Join(root, "dir", "new")},
		{"../secret", true, ""}, // cleaned to /secret, which is not in the root
		{"/../../secret", false, filepath.Join(root, "secret")},
		{"out/secret", true, ""},
		{"out/new", false, ""},
		{"/", false, ""},
		{"..", false, ""},
		{"/", true, root}, // a get of it then finds a directory
	} {
		got, err := a.remotePath(tc.path, tc.mustExist)
		if tc.want == "" {
			if err == nil {
				t.Errorf("%q (must exist %v): %s, want refused", tc.path, tc.mustExist, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q (must exist %v): %q %v, want %q", tc.path, tc.mustExist, got, err, tc.want)
		}
	}
}
