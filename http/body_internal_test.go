package fleethttp

import (
	"context"
	"errors"
	"net/http/httptest"
	"reflect"
	"runtime"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/prometheus/client_golang/prometheus"
)

// TestBodiesOneHolderWaits: of the bodies that hold part of the budget and
// need more, one waits for room and the others are refused at once, so
// that they give back what they hold and the one can finish; a body that
// holds nothing yet waits its turn.
func TestBodiesOneHolderWaits(t *testing.T) {
	ctx := context.Background()
	b := newBodies(100, 10, prometheus.NewRegistry()) // a tenant's share: 80
	a, err := b.take(ctx, "a", 40, false)
	if err != nil {
		t.Fatal(err)
	}
	c, err := b.take(ctx, "c", 40, false)
	if err != nil {
		t.Fatal(err)
	}
	grown := make(chan error, 1)
	go func() {
		more, err := b.take(ctx, "a", 40, true) // 20 left: a waits
		if err == nil {
			b.give(more)
		}
		grown <- err
	}()
	for !b.growing.Load() {
		select {
		case err := <-grown:
			t.Fatalf("the first holder to need more did not wait: %v", err)
		default:
			runtime.Gosched()
		}
	}
	start := time.Now()
	if _, err := b.take(ctx, "c", 40, true); !errors.Is(err, errNoRoom) {
		t.Fatalf("a second holder needing more: %v, want errNoRoom at once", err)
	}
	if d := time.Since(start); d >= bodyWait {
		t.Fatalf("the second holder was refused after %s, not at once", d)
	}
	b.give(c) // what the refused one held goes back
	if err := <-grown; err != nil {
		t.Fatalf("the waiting holder: %v", err)
	}
	b.give(a)
	if got := b.held.Load(); got != 0 {
		t.Fatalf("held %d bytes after everything was given back", got)
	}
}

// TestBodyTenant: a body takes from its actor's tenant's share, else from
// the share of the tenant in a hawkBit DDI path, else from the share of
// requests without a tenant.
func TestBodyTenant(t *testing.T) {
	r := httptest.NewRequest("POST", "/DEFAULT/controller/v1/d1/configData", nil)
	if got := bodyTenant(r); got != "" {
		t.Errorf("no actor, no path value: %q", got)
	}
	r.SetPathValue("tenant", "DEFAULT")
	if got := bodyTenant(r); got != "default" {
		t.Errorf("DDI path: %q, want default", got)
	}
	r = r.WithContext(fleet.NewContextWithActor(r.Context(), &fleet.Actor{Tenant: "acme"}))
	if got := bodyTenant(r); got != "acme" {
		t.Errorf("actor: %q, want acme", got)
	}
}

// TestOpenBody: a request body marked openBody (DDI's, whose protocol says
// unknown fields are ignored) allows other properties in the OpenAPI
// document; every other body refuses them.
func TestOpenBody(t *testing.T) {
	g := &schemaGen{components: map[string]any{}}
	for _, c := range []struct {
		t    reflect.Type
		open bool
	}{
		{reflect.TypeFor[ddiFeedback](), true},
		{reflect.TypeFor[ddiConfigData](), true},
		{reflect.TypeFor[ddiStatus](), false},
	} {
		if got := g.schema(c.t, true)["additionalProperties"]; got != c.open {
			t.Errorf("%s: additionalProperties %v, want %v", c.t, got, c.open)
		}
	}
}
