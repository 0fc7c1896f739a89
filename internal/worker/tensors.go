package worker

import "github.com/ortrain/ortrain/internal/model"

// TensorKind selects a family of named tensors.
type TensorKind int

const (
	KindWeight TensorKind = 0 // HF names; reads fold LoRA in
	KindLoRA   TensorKind = 1 // PEFT names
	KindOptim  TensorKind = 2 // AdamW state
	KindGrad   TensorKind = 3 // gradients, by trainable name (read only)
)

// TensorInfo names one tensor of the model.
type TensorInfo struct {
	Name  string
	DType model.DType
	Shape []int64
}

// Bytes is the tensor's size in bytes.
func (t TensorInfo) Bytes() int64 { return model.TensorSpec{DType: t.DType, Shape: t.Shape}.ByteLen() }

// TensorBytes is the size of a listing's tensors (Model.Tensors) in bytes:
// what a model holds of that kind.
func TensorBytes(ts []TensorInfo) int64 {
	var n int64
	for _, t := range ts {
		n += t.Bytes()
	}
	return n
}

// Room for one tensor's name and shape when listing: HF and PEFT names are
// far shorter, and no tensor of these models has more than 2 dims.
const (
	maxTensorName = 1024
	maxTensorDims = 8
)
