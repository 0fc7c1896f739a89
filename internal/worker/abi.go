//go:build cgo

package worker

/*
#include "csrc/worker_abi.h"
*/
import "C"

import (
	"unsafe"

	"github.com/ortrain/ortrain/internal/grpo"
)

// CGOEnabled says whether this build can open the worker library.
const CGOEnabled = true

// csrc/worker_abi.h is the one definition of every code that crosses the
// ABI. Each Go constant with the same meaning is checked against it here at
// compile time: uint(a-b) and uint(b-a) are both constant only when a == b,
// so a renumbering on either side stops the build.

const (
	_ = uint(ABIVersion-C.ORT_ABI_VERSION) + uint(C.ORT_ABI_VERSION-ABIVersion)

	_ = uint(KindWeight-C.ORT_KIND_WEIGHT) + uint(C.ORT_KIND_WEIGHT-KindWeight)
	_ = uint(KindLoRA-C.ORT_KIND_LORA) + uint(C.ORT_KIND_LORA-KindLoRA)
	_ = uint(KindOptim-C.ORT_KIND_OPTIM) + uint(C.ORT_KIND_OPTIM-KindOptim)
	_ = uint(KindGrad-C.ORT_KIND_GRAD) + uint(C.ORT_KIND_GRAD-KindGrad)

	_ = uint(grpo.LossDAPO-C.ORT_LOSS_DAPO) + uint(C.ORT_LOSS_DAPO-grpo.LossDAPO)
	_ = uint(grpo.LossGRPO-C.ORT_LOSS_GRPO) + uint(C.ORT_LOSS_GRPO-grpo.LossGRPO)
	_ = uint(grpo.LossBNPO-C.ORT_LOSS_BNPO) + uint(C.ORT_LOSS_BNPO-grpo.LossBNPO)
	_ = uint(grpo.LossDrGRPO-C.ORT_LOSS_DR_GRPO) + uint(C.ORT_LOSS_DR_GRPO-grpo.LossDrGRPO)
	_ = uint(grpo.LossCISPO-C.ORT_LOSS_CISPO) + uint(C.ORT_LOSS_CISPO-grpo.LossCISPO)
	_ = uint(grpo.LossSAPO-C.ORT_LOSS_SAPO) + uint(C.ORT_LOSS_SAPO-grpo.LossSAPO)
	_ = uint(grpo.LossLUSPO-C.ORT_LOSS_LUSPO) + uint(C.ORT_LOSS_LUSPO-grpo.LossLUSPO)
	_ = uint(grpo.LossVESPO-C.ORT_LOSS_VESPO) + uint(C.ORT_LOSS_VESPO-grpo.LossVESPO)
	_ = uint(grpo.LossSFT-C.ORT_LOSS_SFT) + uint(C.ORT_LOSS_SFT-grpo.LossSFT)

	_ = uint(grpo.ISLevelToken-C.ORT_IS_LEVEL_TOKEN) + uint(C.ORT_IS_LEVEL_TOKEN-grpo.ISLevelToken)
	_ = uint(grpo.ISLevelSequence-C.ORT_IS_LEVEL_SEQUENCE) + uint(C.ORT_IS_LEVEL_SEQUENCE-grpo.ISLevelSequence)

	_ = uint(grpo.ISCorrectionOff-C.ORT_IS_OFF) + uint(C.ORT_IS_OFF-grpo.ISCorrectionOff)
	_ = uint(grpo.ISCorrectionTokenTruncate-C.ORT_IS_TOKEN_TRUNCATE) + uint(C.ORT_IS_TOKEN_TRUNCATE-grpo.ISCorrectionTokenTruncate)
	_ = uint(grpo.ISCorrectionTokenMask-C.ORT_IS_TOKEN_MASK) + uint(C.ORT_IS_TOKEN_MASK-grpo.ISCorrectionTokenMask)
	_ = uint(grpo.ISCorrectionSequenceTruncate-C.ORT_IS_SEQUENCE_TRUNCATE) + uint(C.ORT_IS_SEQUENCE_TRUNCATE-grpo.ISCorrectionSequenceTruncate)
	_ = uint(grpo.ISCorrectionSequenceMask-C.ORT_IS_SEQUENCE_MASK) + uint(C.ORT_IS_SEQUENCE_MASK-grpo.ISCorrectionSequenceMask)

	_ = uint(LogprobAuto-C.ORT_LOGPROB_AUTO) + uint(C.ORT_LOGPROB_AUTO-LogprobAuto)
	_ = uint(LogprobRecompute-C.ORT_LOGPROB_RECOMPUTE) + uint(C.ORT_LOGPROB_RECOMPUTE-LogprobRecompute)
	_ = uint(LogprobFused-C.ORT_LOGPROB_FUSED) + uint(C.ORT_LOGPROB_FUSED-LogprobFused)

	_ = uint(StopToken-C.ORT_STOP_TOKEN) + uint(C.ORT_STOP_TOKEN-StopToken)

	_ = uint(ReduceSum-C.ORT_REDUCE_SUM) + uint(C.ORT_REDUCE_SUM-ReduceSum)
	_ = uint(ReduceMin-C.ORT_REDUCE_MIN) + uint(C.ORT_REDUCE_MIN-ReduceMin)
	_ = uint(ReduceMax-C.ORT_REDUCE_MAX) + uint(C.ORT_REDUCE_MAX-ReduceMax)
	_ = uint(StopLength-C.ORT_STOP_LENGTH) + uint(C.ORT_STOP_LENGTH-StopLength)
)

// The header's vocabulary sizes, for a test that grpo names no code the
// header lacks (grpo's tables are variables, so this cannot be a constant check).
const (
	abiLossTypes     = C.ORT_LOSS_SFT + 1
	abiISCorrections = C.ORT_IS_SEQUENCE_MASK + 1
)

// lossStatsLayout is the C struct LossStats mirrors: the worker writes the
// statistics straight into a LossStats, so the two must agree field by field
// (all float64, same order, same size).
type lossStatsLayout = C.ort_loss_stats

const (
	_ = uint(unsafe.Sizeof(LossStats{})-unsafe.Sizeof(lossStatsLayout{})) + uint(unsafe.Sizeof(lossStatsLayout{})-unsafe.Sizeof(LossStats{}))

	_ = uint(unsafe.Offsetof(LossStats{}.Loss)-unsafe.Offsetof(lossStatsLayout{}.loss)) + uint(unsafe.Offsetof(lossStatsLayout{}.loss)-unsafe.Offsetof(LossStats{}.Loss))
	_ = uint(unsafe.Offsetof(LossStats{}.ActiveTokens)-unsafe.Offsetof(lossStatsLayout{}.active_tokens)) + uint(unsafe.Offsetof(lossStatsLayout{}.active_tokens)-unsafe.Offsetof(LossStats{}.ActiveTokens))
	_ = uint(unsafe.Offsetof(LossStats{}.Rows)-unsafe.Offsetof(lossStatsLayout{}.rows)) + uint(unsafe.Offsetof(lossStatsLayout{}.rows)-unsafe.Offsetof(LossStats{}.Rows))
	_ = uint(unsafe.Offsetof(LossStats{}.RowsWithTokens)-unsafe.Offsetof(lossStatsLayout{}.rows_with_tokens)) + uint(unsafe.Offsetof(lossStatsLayout{}.rows_with_tokens)-unsafe.Offsetof(LossStats{}.RowsWithTokens))
	_ = uint(unsafe.Offsetof(LossStats{}.ClipLow)-unsafe.Offsetof(lossStatsLayout{}.clip_low)) + uint(unsafe.Offsetof(lossStatsLayout{}.clip_low)-unsafe.Offsetof(LossStats{}.ClipLow))
	_ = uint(unsafe.Offsetof(LossStats{}.ClipHigh)-unsafe.Offsetof(lossStatsLayout{}.clip_high)) + uint(unsafe.Offsetof(lossStatsLayout{}.clip_high)-unsafe.Offsetof(LossStats{}.ClipHigh))
	_ = uint(unsafe.Offsetof(LossStats{}.ClipRegion)-unsafe.Offsetof(lossStatsLayout{}.clip_region)) + uint(unsafe.Offsetof(lossStatsLayout{}.clip_region)-unsafe.Offsetof(LossStats{}.ClipRegion))
	_ = uint(unsafe.Offsetof(LossStats{}.ClipDenom)-unsafe.Offsetof(lossStatsLayout{}.clip_denom)) + uint(unsafe.Offsetof(lossStatsLayout{}.clip_denom)-unsafe.Offsetof(LossStats{}.ClipDenom))
	_ = uint(unsafe.Offsetof(LossStats{}.ClipLowMin)-unsafe.Offsetof(lossStatsLayout{}.clip_low_min)) + uint(unsafe.Offsetof(lossStatsLayout{}.clip_low_min)-unsafe.Offsetof(LossStats{}.ClipLowMin))
	_ = uint(unsafe.Offsetof(LossStats{}.ClipHighMax)-unsafe.Offsetof(lossStatsLayout{}.clip_high_max)) + uint(unsafe.Offsetof(lossStatsLayout{}.clip_high_max)-unsafe.Offsetof(LossStats{}.ClipHighMax))
	_ = uint(unsafe.Offsetof(LossStats{}.CISPOClip)-unsafe.Offsetof(lossStatsLayout{}.cispo_clip)) + uint(unsafe.Offsetof(lossStatsLayout{}.cispo_clip)-unsafe.Offsetof(LossStats{}.CISPOClip))
	_ = uint(unsafe.Offsetof(LossStats{}.KLSum)-unsafe.Offsetof(lossStatsLayout{}.kl_sum)) + uint(unsafe.Offsetof(lossStatsLayout{}.kl_sum)-unsafe.Offsetof(LossStats{}.KLSum))
	_ = uint(unsafe.Offsetof(LossStats{}.EntropySum)-unsafe.Offsetof(lossStatsLayout{}.entropy_sum)) + uint(unsafe.Offsetof(lossStatsLayout{}.entropy_sum)-unsafe.Offsetof(LossStats{}.EntropySum))
	_ = uint(unsafe.Offsetof(LossStats{}.VESPOPhiSum)-unsafe.Offsetof(lossStatsLayout{}.vespo_phi_sum)) + uint(unsafe.Offsetof(lossStatsLayout{}.vespo_phi_sum)-unsafe.Offsetof(LossStats{}.VESPOPhiSum))
	_ = uint(unsafe.Offsetof(LossStats{}.CorrectTokens)-unsafe.Offsetof(lossStatsLayout{}.correct_tokens)) + uint(unsafe.Offsetof(lossStatsLayout{}.correct_tokens)-unsafe.Offsetof(LossStats{}.CorrectTokens))
)
