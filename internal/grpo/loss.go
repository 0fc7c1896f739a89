package grpo

import (
	"fmt"
	"math"
	"strings"
)

// LossType selects the per-token objective and its normaliser
// (grpo-reference.md §4.4 and §4.6). It is parsed once, when the config
// loads. worker_abi.h defines the same codes; internal/worker/abi.go checks
// them against these values at compile time.
type LossType int32

// The numeric values cross the C ABI: never renumber, only append.
const (
	LossDAPO   LossType = 0 // PPO clip, normalised by the round's active tokens / P (TRL default)
	LossGRPO   LossType = 1 // PPO clip, per-sequence mean, then mean over rows
	LossBNPO   LossType = 2 // PPO clip, micro-batch token mean
	LossDrGRPO LossType = 3 // PPO clip, normalised by B * max_completion_length
	LossCISPO  LossType = 4 // -sg(min(w, eps_high)) * A * logp
	LossSAPO   LossType = 5 // soft gate sigma(k(w-1)) * 4/k
	LossLUSPO  LossType = 6 // (1/B) sum_i l_i |o_i| / GA; meant for sequence level (token level: padding is not averaged in, unlike TRL)
	LossVESPO  LossType = 7 // -phi(W) * A * logp, phi detached
	LossSFT    LossType = 8 // supervised fine-tuning: -logp of the labels, normalised as dapo; no ratio, clip or KL
)

// lossTypeNames is the one table of loss names; order matches the constants.
var lossTypeNames = [...]string{"dapo", "grpo", "bnpo", "dr_grpo", "cispo", "sapo", "luspo", "vespo", "sft"}

// LossTypeNames lists the accepted loss_type values, for help and errors.
func LossTypeNames() []string { return append([]string(nil), lossTypeNames[:]...) }

func (t LossType) String() string {
	if t < 0 || int(t) >= len(lossTypeNames) {
		return fmt.Sprintf("LossType(%d)", int32(t))
	}
	return lossTypeNames[t]
}

// ParseLossType maps a config string (TRL's names) to a LossType.
func ParseLossType(s string) (LossType, error) {
	for i, n := range lossTypeNames {
		if strings.EqualFold(s, n) {
			return LossType(i), nil
		}
	}
	return 0, fmt.Errorf("unknown loss_type %q (allowed: %s)", s, strings.Join(lossTypeNames[:], ", "))
}

// NormalisedByRoundTokens reports whether the loss divides by the generation
// round's active-token count N/P instead of by the gradient-accumulation steps
// (grpo-reference.md §4.6: dapo, cispo and vespo; sft too, so that with
// gradient accumulation a step's loss is the token mean over the whole step,
// as TRL's SFTTrainer does with num_items_in_batch).
func (t LossType) NormalisedByRoundTokens() bool {
	return t == LossDAPO || t == LossCISPO || t == LossVESPO || t == LossSFT
}

// UsesClip reports whether the loss uses the PPO two-sided clip and so
// reports clip_ratio/{low,high,region} metrics.
func (t LossType) UsesClip() bool {
	switch t {
	case LossDAPO, LossGRPO, LossBNPO, LossDrGRPO, LossLUSPO:
		return true
	}
	return false
}

// ISLevel is importance_sampling_level: the ratio per token, or one ratio per
// sequence from the masked mean of token log-ratios (GSPO).
type ISLevel int32

const (
	ISLevelToken    ISLevel = 0
	ISLevelSequence ISLevel = 1
)

// ParseISLevel parses "token" or "sequence".
func ParseISLevel(s string) (ISLevel, error) {
	switch strings.ToLower(s) {
	case "token":
		return ISLevelToken, nil
	case "sequence":
		return ISLevelSequence, nil
	}
	return 0, fmt.Errorf("unknown importance_sampling_level %q (allowed: token, sequence)", s)
}

func (l ISLevel) String() string {
	if l == ISLevelSequence {
		return "sequence"
	}
	return "token"
}

// ISCorrection is vllm_importance_sampling_mode: how the ratio between the
// trainer's old log-probs and the sampler's log-probs reweights the loss
// (grpo-reference.md §4.9).
type ISCorrection int32

const (
	ISCorrectionOff              ISCorrection = 0
	ISCorrectionTokenTruncate    ISCorrection = 1
	ISCorrectionTokenMask        ISCorrection = 2
	ISCorrectionSequenceTruncate ISCorrection = 3
	ISCorrectionSequenceMask     ISCorrection = 4 // TRL default when enabled
)

var isCorrectionNames = [...]string{"off", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"}

// ISCorrectionNames lists the accepted modes.
func ISCorrectionNames() []string { return append([]string(nil), isCorrectionNames[:]...) }

func (c ISCorrection) String() string {
	if c < 0 || int(c) >= len(isCorrectionNames) {
		return fmt.Sprintf("ISCorrection(%d)", int32(c))
	}
	return isCorrectionNames[c]
}

// ParseISCorrection parses a vllm_importance_sampling_mode value, or "off".
func ParseISCorrection(s string) (ISCorrection, error) {
	for i, n := range isCorrectionNames {
		if strings.EqualFold(s, n) {
			return ISCorrection(i), nil
		}
	}
	return 0, fmt.Errorf("unknown importance sampling correction %q (allowed: %s)", s, strings.Join(isCorrectionNames[:], ", "))
}

// Sequence reports whether the ratio is a product over the whole sequence.
func (c ISCorrection) Sequence() bool {
	return c == ISCorrectionSequenceTruncate || c == ISCorrectionSequenceMask
}

// Mask reports whether out-of-range ratios are zeroed (else clamped).
func (c ISCorrection) Mask() bool { return c == ISCorrectionTokenMask || c == ISCorrectionSequenceMask }

// LossConfig is everything the worker needs to turn log-probs into a loss.
// Field names follow TRL's GRPOConfig (grpo-reference.md §0, §4).
type LossConfig struct {
	Type    LossType
	ISLevel ISLevel
	// Epsilon and EpsilonHigh are the clip range (1-Epsilon, 1+EpsilonHigh).
	// For cispo EpsilonHigh is the weight cap.
	Epsilon     float64
	EpsilonHigh float64
	// Delta caps the unclipped ratio (two-sided clip, INTELLECT-2); 0 = off.
	Delta float64
	// Beta weights the k3 KL to the reference policy; 0 = no reference.
	Beta float64
	// Temperature divides the logits before log-softmax, for the policy, the
	// old policy and the reference alike.
	Temperature float64
	// MaxCompletionLength is L_max, the dr_grpo normaliser.
	MaxCompletionLength int
	// SAPO gate temperatures for positive and negative advantages.
	SAPOTemperaturePos float64
	SAPOTemperatureNeg float64
	// VESPO shape parameters (k, lambda) for A >= 0 and A < 0.
	VESPOKPos, VESPOLambdaPos float64
	VESPOKNeg, VESPOLambdaNeg float64
	// ISCorrection reweights by exp(logp_old - logp_sampler) when the batch
	// carries sampler log-probs; ISClipMin (0 = none) and ISClipMax
	// (+Inf = none) bound it.
	ISCorrection ISCorrection
	ISClipMin    float64
	ISClipMax    float64
	// EntropyCoef subtracts EntropyCoef * masked mean entropy from the loss; 0 = off.
	EntropyCoef float64
}

// DefaultLossConfig returns TRL's defaults: dapo, eps 0.2, beta 0, token level,
// IS correction sequence_mask with cap 3 (used only when sampler log-probs exist).
func DefaultLossConfig() LossConfig {
	return LossConfig{
		Type:                LossDAPO,
		ISLevel:             ISLevelToken,
		Epsilon:             0.2,
		EpsilonHigh:         0.2,
		Temperature:         1.0,
		MaxCompletionLength: 512,
		SAPOTemperaturePos:  1.0,
		SAPOTemperatureNeg:  1.05,
		VESPOKPos:           2, VESPOLambdaPos: 3,
		VESPOKNeg: 3, VESPOLambdaNeg: 2,
		ISCorrection: ISCorrectionSequenceMask,
		ISClipMin:    0,
		ISClipMax:    3.0,
	}
}

// Validate refuses inconsistent settings, naming the field, the value and what is allowed.
func (c LossConfig) Validate() error {
	switch {
	case c.Type < 0 || int(c.Type) >= len(lossTypeNames):
		return fmt.Errorf("loss_type: %d is not a known loss (allowed: %s)", c.Type, strings.Join(lossTypeNames[:], ", "))
	case !(c.Epsilon >= 0) || c.Epsilon >= 1:
		return fmt.Errorf("epsilon: %v must be in [0, 1)", c.Epsilon)
	case !(c.EpsilonHigh >= 0):
		return fmt.Errorf("epsilon_high: %v must be >= 0", c.EpsilonHigh)
	case c.Delta != 0 && !(c.Delta > 1+c.EpsilonHigh):
		return fmt.Errorf("delta: %v must be > 1 + epsilon_high (%v), or 0 to disable", c.Delta, 1+c.EpsilonHigh)
	case !(c.Beta >= 0):
		return fmt.Errorf("beta: %v must be >= 0", c.Beta)
	case c.Type == LossSFT && c.Beta != 0:
		return fmt.Errorf("beta: %v must be 0 for loss_type sft (it has no KL term to a reference)", c.Beta)
	case !(c.Temperature > 0):
		return fmt.Errorf("temperature: %v must be > 0", c.Temperature)
	case c.Type == LossDrGRPO && c.MaxCompletionLength <= 0:
		return fmt.Errorf("max_completion_length: %d must be > 0 for loss_type dr_grpo", c.MaxCompletionLength)
	case c.ISClipMin < 0 || math.IsNaN(c.ISClipMax) || !(c.ISClipMin < c.ISClipMax):
		return fmt.Errorf("vllm_importance_sampling_clip_min/max: [%v, %v] must satisfy 0 <= min < max", c.ISClipMin, c.ISClipMax)
	case (c.ISCorrection == ISCorrectionTokenTruncate || c.ISCorrection == ISCorrectionSequenceTruncate) &&
		c.ISClipMin == 0 && math.IsInf(c.ISClipMax, 1):
		return fmt.Errorf("vllm_importance_sampling_mode %s needs a clip_min or clip_max", c.ISCorrection)
	}
	return nil
}
