// Package s3test runs a private S3 server, VersityGW over a temporary
// directory, for tests of fleetd's S3 blob store: each test gets its own,
// on a free loopback port (internal/loopback), with a fresh bucket.
package s3test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleet/blob"
	"github.com/fleetd/fleet/internal/loopback"
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
	// A secret of its own: only this server accepts it, so the first
	// request it accepts proves that the port is this server's.
	s := &Server{AccessKey: "fleetd-test", SecretKey: "fleetd-test-" + uuid.NewString(), Bucket: "fleetd", Dir: t.TempDir()}
	logPath := filepath.Join(t.TempDir(), "versitygw.log")
	loopback.Start(t, 1, func(ports []int) error { return s.start(t, bin, ports[0], logPath) })
	if err := s.Client(t).MakeBucket(context.Background(), s.Bucket, minio.MakeBucketOptions{}); err != nil {
		t.Fatalf("make bucket: %v", err)
	}
	return s
}

// start runs versitygw on port and waits until it answers a request
// signed with the server's secret: a port that answers may be another
// process's, which took it after it was chosen. A port taken is
// loopback.ErrPortTaken.
func (s *Server) start(t testing.TB, bin string, port int, logPath string) error {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	s.Endpoint = "http://" + addr
	out, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer out.Close()
	cmd := exec.Command(bin, "--port", addr, "posix", s.Dir)
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY="+s.AccessKey, "ROOT_SECRET_KEY="+s.SecretKey)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start versitygw: %w", err)
	}
	exit := make(chan error, 1)
	go func() { exit <- cmd.Wait() }()
	stop := func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exit:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exit
		}
	}
	c := s.client(1)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.ListBuckets(ctx)
		cancel()
		if err == nil {
			t.Cleanup(stop)
			return nil
		}
		select {
		case exitErr := <-exit:
			log, _ := os.ReadFile(logPath)
			if strings.Contains(string(log), "address already in use") {
				return fmt.Errorf("versitygw on %s: %w:\n%s", addr, loopback.ErrPortTaken, log)
			}
			return fmt.Errorf("versitygw exited: %v\n%s", exitErr, log)
		default:
		}
		if time.Now().After(deadline) {
			stop()
			log, _ := os.ReadFile(logPath)
			return fmt.Errorf("versitygw did not serve %s in 30s: %v\n%s", addr, err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Client is a client of the server, for checks behind the store's back.
func (s *Server) Client(t testing.TB) *minio.Client {
	t.Helper()
	return s.client(0)
}

// client is a client of the server that tries a request retries times
// more (0: minio's default).
func (s *Server) client(retries int) *minio.Client {
	c, err := minio.New(strings.TrimPrefix(s.Endpoint, "http://"), &minio.Options{
		Creds: credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""), Region: "us-east-1", BucketLookup: minio.BucketLookupPath, MaxRetries: retries})
	if err != nil {
		panic(err) // only for a malformed endpoint, which start never makes
	}
	return c
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
