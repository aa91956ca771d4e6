package mountinfo

import "testing"

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`/mnt/strata`:        "/mnt/strata",
		`/mnt/with\040space`: "/mnt/with space",
		`/a\011tab\134slash`: "/a\ttab\\slash",
		`/trailing\04`:       `/trailing\04`,
		`/not\999octal`:      `/not\999octal`,
	} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestReadHasRoot(t *testing.T) {
	ms, err := Read()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Point == "/" && m.FSType != "" && m.Source != "" {
			return
		}
	}
	t.Fatalf("no root mount among %d: %+v", len(ms), ms)
}
