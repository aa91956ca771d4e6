package rounds

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// Callers arriving while a round runs share the next round, never the
// running one (it may have begun before their changes), and every caller
// gets its round's error.
func TestJoinNextRound(t *testing.T) {
	var g Rounds[int]
	release := make(chan struct{})
	var mu sync.Mutex
	var ran [][]int
	do := func(items []int) error {
		mu.Lock()
		first := len(ran) == 0
		ran = append(ran, slices.Clone(items))
		mu.Unlock()
		if first {
			<-release
			return nil
		}
		return errSecond
	}
	errs := make([]error, 5)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); errs[1] = g.Join(1, do) }()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		mu.Lock()
		started := len(ran) == 1
		mu.Unlock()
		if started {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first round did not start")
		}
	}
	for k := 2; k <= 4; k++ {
		wg.Add(1)
		go func() { defer wg.Done(); errs[k] = g.Join(k, do) }()
	}
	for deadline := time.Now().Add(5 * time.Second); g.Waiting() != 3; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d callers joined the next round, want 3", g.Waiting())
		}
	}
	close(release)
	wg.Wait()
	if len(ran) != 2 || !slices.Equal(ran[0], []int{1}) {
		t.Fatalf("rounds ran %v, want [1] then the three others together", ran)
	}
	if errs[1] != nil || !errors.Is(errs[2], errSecond) || !errors.Is(errs[3], errSecond) || !errors.Is(errs[4], errSecond) {
		t.Fatalf("errors %v: want the first round's nil, then the second's", errs[1:])
	}
	second := slices.Sorted(slices.Values(ran[1]))
	if !slices.Equal(second, []int{2, 3, 4}) {
		t.Fatalf("second round ran %v, want 2, 3, 4", ran[1])
	}
}

var errSecond = errors.New("the second round failed")
