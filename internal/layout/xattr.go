package layout

// XattrName is the virtual extended attribute through which a Strata
// mount shows a file's layout (JSON, Xattr) and sets a directory's default
// ("stripe_count=N,stripe_size=S"). Mounts do not list it in listxattr.
const XattrName = "user.strata.layout"

// Xattr is the JSON of XattrName, the contract that `strata stripe get
// --json` prints too. Zero size or count: the system default.
type Xattr struct {
	StripeSize  uint32   `json:"stripe_size"`
	StripeCount uint32   `json:"stripe_count"`
	Targets     []uint32 `json:"targets"`
	// MaxFileBytes is the largest size of the file (files only).
	MaxFileBytes int64 `json:"max_file_bytes,omitempty"`
}
