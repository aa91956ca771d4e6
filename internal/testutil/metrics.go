package testutil

import (
	"io"
	"net/http"
	"testing"
)

// ScrapeMetrics returns the text of http://addr/metrics.
func ScrapeMetrics(t testing.TB, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
