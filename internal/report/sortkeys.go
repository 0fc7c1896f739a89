package report

import (
	"sort"
	"strconv"
)

// slicesSortNumeric sorts keys numerically where both are integers
// ("2" < "10"), else as strings.
func slicesSortNumeric(keys []string) {
	sort.Slice(keys, func(i, j int) bool {
		a, errA := strconv.Atoi(keys[i])
		b, errB := strconv.Atoi(keys[j])
		if errA == nil && errB == nil {
			return a < b
		}
		return keys[i] < keys[j]
	})
}
