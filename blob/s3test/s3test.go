// Package s3test runs a private S3 server, VersityGW over a temporary
// directory, for tests of fleetd's S3 blob store: each test gets its own,
// on a free loopback port, with a fresh bucket.
package s3test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleet/blob"
	"github.com/google/uuid"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Server is a running versitygw.
type Server struct {
	Endpoint  string // http://127.0.0.1:port
	AccessKey string
	SecretKey string
	Bucket    string // made by Start
	Dir       string // the posix backend's root: one directory per bucket
}

// Install is how .ci/run installs the server; the message of a skipped test
// repeats it.
const Install = "go install github.com/versity/versitygw/cmd/versitygw@v1.8.0"

// binary finds versitygw on PATH or where go install puts it.
func binary() (string, error) {
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p, nil
	}
	var dirs []string
	if d := os.Getenv("GOBIN"); d != "" {
		dirs = append(dirs, d)
	}
	if d := os.Getenv("GOPATH"); d != "" {
		dirs = append(dirs, filepath.Join(d, "bin"))
	}
	if home, err := os.UserHomeDir(); err == nil {
		dirs = append(dirs, filepath.Join(home, "go", "bin"))
	}
	for _, d := range dirs {
		p := filepath.Join(d, "versitygw")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("versitygw is not on PATH nor in %v", dirs)
}

// Start runs versitygw with its posix backend in a temporary directory,
// makes a bucket, and stops the server when the test ends. Without
// versitygw installed the test is skipped, except under CI (CI=true),
// where .ci/run installs it.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := binary()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%v (%s)", err, Install)
		}
		t.Skipf("%v: %s, or set CI=true to make this a failure", err, Install)
	}
	s := &Server{AccessKey: "fleetd-test", SecretKey: "fleetd-test-secret", Bucket: "fleetd", Dir: t.TempDir()}
	port := freePort(t)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	s.Endpoint = "http://" + addr
	logPath := filepath.Join(t.TempDir(), "versitygw.log")
	out, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd := exec.Command(bin, "--port", addr, "posix", s.Dir)
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY="+s.AccessKey, "ROOT_SECRET_KEY="+s.SecretKey)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start versitygw: %v", err)
	}
	exit := make(chan error, 1)
	go func() { exit <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exit:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exit
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		// Any HTTP answer (an anonymous request is refused) means it serves.
		resp, err := http.Get(s.Endpoint)
		if err == nil {
			resp.Body.Close()
			break
		}
		select {
		case err := <-exit:
			log, _ := os.ReadFile(logPath)
			t.Fatalf("versitygw exited: %v\n%s", err, log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("versitygw did not serve %s in 30s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := s.Client(t).MakeBucket(context.Background(), s.Bucket, minio.MakeBucketOptions{}); err != nil {
		t.Fatalf("make bucket: %v", err)
	}
	return s
}

// Client is a client of the server, for checks behind the store's back.
func (s *Server) Client(t testing.TB) *minio.Client {
	t.Helper()
	c, err := minio.New(strings.TrimPrefix(s.Endpoint, "http://"), &minio.Options{
		Creds: credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""), Region: "us-east-1", BucketLookup: minio.BucketLookupPath})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// URL is the --blob-store of the server's bucket under prefix.
func (s *Server) URL(prefix string) string {
	return fmt.Sprintf("s3://%s/%s?endpoint=%s&region=us-east-1&path_style=true", s.Bucket, prefix, s.Endpoint)
}

// Getenv is the environment a fleetd using the server reads its
// credentials from.
func (s *Server) Getenv(name string) string {
	switch name {
	case "AWS_ACCESS_KEY_ID":
		return s.AccessKey
	case "AWS_SECRET_ACCESS_KEY":
		return s.SecretKey
	}
	return ""
}

// Store opens the bucket as a blob store, under a prefix of its own so
// that tests can check that nothing escapes it.
func (s *Server) Store(t testing.TB) *blob.S3 {
	t.Helper()
	cfg, err := blob.ParseS3URL(s.URL("t-"+uuid.NewString()[:8]), s.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	cfg.PartSize = 5 << 20 // S3's smallest: tests cross part boundaries cheaply
	st, err := blob.OpenS3(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return st
}
