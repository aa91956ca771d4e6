package bench

import (
	_ "embed"
	"encoding/json"
	"fmt"
)

// The seed studies' published figures, copied from shared/seed-results.md
// as data. Values are numbers where the study gave one (0 when it gave only
// a relation like "< baseline"); Text keeps the published wording.
//
//go:embed seeds.json
var seedsJSON []byte

// Seeds is the parsed seed table.
type Seeds struct {
	Source string    `json:"source"`
	Rows   []SeedRow `json:"rows"`
}

// SeedRow is one system of one study; Figures is keyed "workload/phase".
type SeedRow struct {
	System  string                `json:"system"`
	Figures map[string]SeedFigure `json:"figures"`
}

// SeedFigure is one published number.
type SeedFigure struct {
	Text    string  `json:"text"`
	Value   float64 `json:"value"`
	Unit    string  `json:"unit"`
	Threads int     `json:"threads,omitempty"`
}

// SeedColumns are the keys of the seed table, in print order.
var SeedColumns = []string{"seq/write", "seq/read", "random/write", "random/read", "shared/write", "shared/read", "meta/create", "meta/stat", "meta/remove"}

// LoadSeeds parses the embedded seed figures.
func LoadSeeds() (*Seeds, error) {
	var s Seeds
	if err := json.Unmarshal(seedsJSON, &s); err != nil {
		return nil, fmt.Errorf("embedded seeds.json: %w", err)
	}
	return &s, nil
}
