package admin

import (
	"encoding/json"
	"fmt"
)

// LayoutXattr is the virtual extended attribute through which a Strata
// mount shows a file's layout (JSON, Layout) and sets a directory's
// default ("stripe_count=N,stripe_size=S").
const LayoutXattr = "user.strata.layout"

// Layout is the contract of the layout xattr and of `strata stripe get
// --json`. Zero size or count: the system default.
type Layout struct {
	StripeSize  uint32   `json:"stripe_size"`
	StripeCount uint32   `json:"stripe_count"`
	Targets     []uint32 `json:"targets"`
	// MaxFileBytes is the largest size of the file (files only).
	MaxFileBytes int64 `json:"max_file_bytes,omitempty"`
}

// ParseLayout reads the layout xattr's value.
func ParseLayout(b []byte) (Layout, error) {
	var l Layout
	if err := json.Unmarshal(b, &l); err != nil {
		return Layout{}, fmt.Errorf("unexpected layout %q: %w", b, err)
	}
	if l.Targets == nil {
		l.Targets = []uint32{}
	}
	return l, nil
}

// SetValue is the xattr value that sets a directory's default layout to
// cur with the fields given (nil: keep cur's).
func SetValue(cur Layout, count, size *uint32) string {
	if count != nil {
		cur.StripeCount = *count
	}
	if size != nil {
		cur.StripeSize = *size
	}
	return fmt.Sprintf("stripe_count=%d,stripe_size=%d", cur.StripeCount, cur.StripeSize)
}
