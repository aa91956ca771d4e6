package admin

import (
	"encoding/json"
	"fmt"

	"github.com/stratafs/strata/internal/layout"
)

// LayoutXattr is the virtual extended attribute of a file's layout
// (layout.XattrName).
const LayoutXattr = layout.XattrName

// Layout is the contract of the layout xattr and of `strata stripe get
// --json` (layout.Xattr).
type Layout = layout.Xattr

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
