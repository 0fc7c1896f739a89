package worker

import (
	"fmt"

	"github.com/ortrain/ortrain/internal/model"
)

// ABIVersion is the C ABI this package speaks (csrc/worker_abi.h).
const ABIVersion = 9

// Info describes an opened library.
type Info struct {
	Path            string `json:"path"`
	ABIVersion      int    `json:"abi_version"`
	LibtorchVersion string `json:"libtorch"`
	CUDADevices     int    `json:"cuda_devices"`
	Threads         int    `json:"threads"`
	CXX11ABI        bool   `json:"cxx11_abi"`
	// DistBackends are the c10d backends compiled in, for Model.JoinGroup:
	// "gloo" (CPU), "nccl" (CUDA).
	DistBackends []string `json:"dist_backends"`
	// OneDNN and Store are nil when the library is older than these
	// reports (they were added to the info JSON without an ABI bump).
	OneDNN *OneDNNInfo `json:"onednn,omitempty"`
	Store  *StoreInfo  `json:"tcpstore,omitempty"`
}

// OneDNNInfo says whether CPU float32 sampling and decoding hand their
// matmuls to oneDNN's sgemm (found in the oneDNN libtorch loaded); without
// it they run on at::mm, which is several times slower at a few rows when
// libtorch's BLAS is OpenBLAS.
type OneDNNInfo struct {
	Active  bool   `json:"active"`
	Library string `json:"library,omitempty"` // where dnnl_sgemm was found
	Detail  string `json:"detail,omitempty"`  // why it is not active
}

// StoreInfo describes the rendezvous TCPStore: libtorch 2.4+ serves it with
// libuv by default (LibUVDefault); LibUV says whether that server starts
// here. Without it JoinGroup serves the classic store.
type StoreInfo struct {
	LibUVDefault bool   `json:"libuv_default"`
	LibUV        bool   `json:"libuv"`
	Detail       string `json:"detail,omitempty"`
}

// oneDNNWarning is what LoadModel says when a CPU float32 model's sampling
// cannot reach oneDNN's sgemm; "" when it can, when the model would not use
// it, or when the library does not report it.
func oneDNNWarning(info Info, device string, dt model.DType) string {
	if device != "cpu" || dt != model.F32 || info.OneDNN == nil || info.OneDNN.Active {
		return ""
	}
	return fmt.Sprintf("oneDNN decode matmuls unavailable (%s): CPU sampling runs them on at::mm, several times slower "+
		"at a few rows; `ortrain doctor` reports it", info.OneDNN.Detail)
}
