package worker

import (
	"math"

	"github.com/ortrain/ortrain/internal/grpo"
)

// refLoss is an independent float64 implementation of grpo-reference.md
// §4.3-§4.6 (entropy bonus excluded), one row at a time, used to check the
// worker's loss values. logp[i][t] are the policy's token log-probs.
func refLoss(cfg grpo.LossConfig, mb grpo.MicroBatch, logp [][]float64) float64 {
	B := float64(len(mb.Rows))
	GA := float64(max(1, mb.GradAccumSteps))
	var sumAll, maskAll, rowMeans, rowSums float64
	for i, r := range mb.Rows {
		lp := logp[i]
		T := len(lp)
		m := make([]float64, T)
		old := make([]float64, T)
		var nm float64
		for t := range T {
			m[t] = float64(r.LossMask[t])
			nm += m[t]
			old[t] = lp[t]
			if r.OldLogprobs != nil {
				old[t] = float64(r.OldLogprobs[t])
			}
		}
		lr := make([]float64, T)
		var seqLR float64
		for t := range T {
			lr[t] = lp[t] - old[t]
			seqLR += m[t] * lr[t]
		}
		seqLR /= math.Max(1, nm)
		rho := refRho(cfg, r, old, m)
		A := float64(r.Advantage)
		var phi float64
		if cfg.Type == grpo.LossVESPO {
			phi = refPhi(cfg, lr, m, rho, A)
		}
		var rowSum float64
		for t := range T {
			logw := lr[t]
			if cfg.ISLevel == grpo.ISLevelSequence {
				logw = seqLR
			}
			w := math.Exp(logw)
			var l float64
			switch cfg.Type {
			case grpo.LossCISPO:
				l = -math.Min(w, cfg.EpsilonHigh) * A * lp[t]
			case grpo.LossSAPO:
				k := cfg.SAPOTemperatureNeg
				if A > 0 {
					k = cfg.SAPOTemperaturePos
				}
				l = -(1 / (1 + math.Exp(-k*(w-1)))) * 4 / k * A
			case grpo.LossVESPO:
				l = -phi * A * lp[t]
			default:
				wt := w
				if cfg.Delta > 0 {
					wt = math.Min(w, cfg.Delta)
				}
				c := math.Min(math.Max(w, 1-cfg.Epsilon), 1+cfg.EpsilonHigh)
				l = -math.Min(wt*A, c*A)
			}
			if rho != nil && cfg.Type != grpo.LossVESPO {
				l *= rho[t]
			}
			if cfg.Beta != 0 {
				d := float64(r.RefLogprobs[t]) - lp[t]
				l += cfg.Beta * (math.Exp(d) - d - 1)
			}
			rowSum += m[t] * l
		}
		sumAll += rowSum
		maskAll += nm
		rowMeans += rowSum / math.Max(1, nm)
		rowSums += rowSum
	}
	switch cfg.Type {
	case grpo.LossGRPO, grpo.LossSAPO:
		return rowMeans / B / GA
	case grpo.LossBNPO:
		return sumAll / math.Max(1, maskAll) / GA
	case grpo.LossDrGRPO:
		return sumAll / (B * float64(cfg.MaxCompletionLength)) / GA
	case grpo.LossLUSPO:
		return rowSums / B / GA
	}
	return sumAll / mb.RoundTokens
}

// refRho is the vLLM importance-sampling weight per token (§4.9), or nil.
func refRho(cfg grpo.LossConfig, r grpo.Row, old, m []float64) []float64 {
	if cfg.ISCorrection == grpo.ISCorrectionOff || r.SamplerLogprobs == nil {
		return nil
	}
	T := len(old)
	d := make([]float64, T)
	var sum float64
	for t := range T {
		d[t] = (old[t] - float64(r.SamplerLogprobs[t])) * m[t]
		sum += d[t]
	}
	rho := make([]float64, T)
	for t := range T {
		x := math.Exp(d[t])
		if cfg.ISCorrection.Sequence() {
			x = math.Exp(sum)
		}
		if cfg.ISCorrection.Mask() {
			if x < cfg.ISClipMin || x > cfg.ISClipMax {
				x = 0
			}
		} else {
			x = math.Min(math.Max(x, cfg.ISClipMin), cfg.ISClipMax)
		}
		rho[t] = x
	}
	return rho
}

// refPhi is vespo's per-sequence weight (§4.4).
func refPhi(cfg grpo.LossConfig, lr, m, rho []float64, A float64) float64 {
	var lam float64
	for t := range lr {
		lam += m[t] * math.Min(math.Max(lr[t], -20), 20)
		if rho != nil {
			lam += math.Min(math.Max(math.Log(rho[t]), math.Log(1e-8)), 20)
		}
	}
	logW := math.Min(math.Max(lam, math.Log(1e-8)), 20)
	W := math.Exp(logW)
	k, l := cfg.VESPOKNeg, cfg.VESPOLambdaNeg
	if A >= 0 {
		k, l = cfg.VESPOKPos, cfg.VESPOLambdaPos
	}
	l = math.Max(l, 1e-4)
	phi := math.Exp(l + k*logW - l*W)
	if math.IsNaN(phi) || math.IsInf(phi, 0) {
		return 0
	}
	return phi
}
