package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

// TestFollowPages: the pages come to decode in order, each asked for on
// the previous one's Link (among other links), and a body whose next
// disagrees with its Link is an error.
func TestFollowPages(t *testing.T) {
	const pages = 20
	lie := -1 // the page whose Link is left out while its body has a next
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k, _ := strconv.Atoi(r.URL.Query().Get("cursor"))
		next := "null"
		if k < pages-1 {
			next = strconv.Quote(strconv.Itoa(k + 1))
			if k != lie {
				w.Header().Add("Link", `</p?cursor=0>; rel="first"`)
				w.Header().Add("Link", fmt.Sprintf(`</p?cursor=%d&x=a%%2Cb>; title="on"; rel="next", </p>; rel="last"`, k+1))
			}
		}
		fmt.Fprintf(w, `{"page":%d,"next":%s}`, k, next)
	}))
	defer srv.Close()
	a := newAPI(srv.URL, "t", "k")
	var got []string
	decode := func(b []byte) (bool, error) {
		got = append(got, string(b))
		return !strings.HasSuffix(string(b), "null}"), nil
	}
	if err := a.followPages(context.Background(), "/p", decode); err != nil {
		t.Fatal(err)
	}
	if len(got) != pages {
		t.Fatalf("decoded %d pages, want %d", len(got), pages)
	}
	for i, b := range got {
		if !strings.HasPrefix(b, fmt.Sprintf(`{"page":%d,`, i)) {
			t.Fatalf("page %d decoded as %s", i, b)
		}
	}
	got, lie = nil, 5
	if err := a.followPages(context.Background(), "/p", decode); err == nil || !strings.Contains(err.Error(), "disagree") {
		t.Fatalf("a page without its Link: %v, want the disagreement", err)
	}
	if len(got) != lie+1 {
		t.Fatalf("decoded %d pages before the disagreement, want %d", len(got), lie+1)
	}
}
