package fleethttp_test

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"testing"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestUploadsTakeNothingOfTheBodyBudget: a firmware upload streams to the
// blob store and holds nothing of the budget of request bodies held while
// they arrive (docs/reliability.md). With half of an 8 MiB budget held by
// two bulk bodies of the tenant that stopped part-way, the same tenant
// uploads 12 MiB archives, more than the whole budget, in one multipart
// request and as a pending record's file: both are taken, and the bytes
// held stay the bulk bodies'.
func TestUploadsTakeNothingOfTheBodyBudget(t *testing.T) {
	const budget, announced, sent = 8 << 20, 4 << 20, 1 << 20
	s := fleetdtest.Start(t, sqlstoretest.Backends()[0], "--max-held-body-bytes", strconv.Itoa(budget), "--max-bulk-bytes", strconv.Itoa(announced))
	admin := s.Admin()
	held := func() float64 {
		t.Helper()
		v := fleetdtest.Metric(t, s.URL, "fleetd_http_body_bytes_held")
		if v > budget {
			t.Fatalf("%.0f bytes of bodies held, over the budget of %d", v, budget)
		}
		return v
	}

	// Two bulk bodies that send a megabyte and stop, one after the other:
	// each grows its buffer to 2 MiB and holds it.
	u, _ := url.Parse(s.URL)
	head := fmt.Sprintf("POST /api/v1/devices/bulk HTTP/1.1\r\nHost: fleetd\r\nContent-Type: application/json\r\n"+
		"x-service-tenant: %s\r\nx-service-api-key: %s\r\nContent-Length: %d\r\n\r\n", admin.Tenant, admin.Key, announced)
	partial := append([]byte(`{"devices":[`), bytes.Repeat([]byte(" "), sent)...)
	for i := range 2 {
		c, err := net.Dial("tcp", u.Host)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		go c.Write(append([]byte(head), partial...))
		fleetdtest.Eventually(t, fmt.Sprintf("bulk body %d holding 2 MiB", i+1), func() bool { return held() == float64((i+1)*2<<20) })
	}

	archive := fleetdtest.MakeBundle(t, "9.0.0", fleetdtest.Part{Name: "big", Version: "9.0.0", Body: string(random(t, 12<<20))})
	if len(archive) <= budget {
		t.Fatalf("the archive is %d bytes, not larger than the budget", len(archive))
	}
	s.MustUpload(t, admin, archive)

	var pending struct {
		ID string `json:"id"`
	}
	second := fleetdtest.MakeBundle(t, "9.0.1", fleetdtest.Part{Name: "big", Version: "9.0.1", Body: string(random(t, 12<<20))})
	s.Do(t, admin, "POST", "/api/v1/firmware-bundles", map[string]any{"version": "9.0.1", "file_name": "big-9.0.1.tar.gz"}).
		Want(t, 201).Decode(t, &pending)
	s.PutFile(t, admin, pending.ID, second).Want(t, 200)
	if h := held(); h != 4<<20 {
		t.Errorf("%.0f bytes held after the uploads, want the bulk bodies' 4 MiB", h)
	}
}

func random(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}
