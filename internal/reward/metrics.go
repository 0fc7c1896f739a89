package reward

import "math"

// Metrics reduces a batch's scores to TRL's per-function metrics:
// rewards/<name>/mean and rewards/<name>/std, the mean and the sample
// (ddof=1) standard deviation of the non-NaN values, as TRL's nanmean and
// nanstd. Trajectories with Err are left out (they are failed rollouts). A
// metric with no defined value (no values; std of fewer than two) is
// omitted rather than written as NaN.
func (s *Set) Metrics(scores []Scores) map[string]float64 {
	out := make(map[string]float64, 2*len(s.specs))
	for k, spec := range s.specs {
		var vals []float64
		for _, sc := range scores {
			if sc.Err == nil && k < len(sc.Values) && !math.IsNaN(sc.Values[k]) {
				vals = append(vals, sc.Values[k])
			}
		}
		if len(vals) == 0 {
			continue
		}
		mean := 0.0
		for _, v := range vals {
			mean += v
		}
		mean /= float64(len(vals))
		out["rewards/"+spec.Name+"/mean"] = mean
		if len(vals) < 2 {
			continue
		}
		ss := 0.0
		for _, v := range vals {
			ss += (v - mean) * (v - mean)
		}
		out["rewards/"+spec.Name+"/std"] = math.Sqrt(ss / float64(len(vals)-1))
	}
	return out
}
