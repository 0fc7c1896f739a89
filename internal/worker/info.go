package worker

// ABIVersion is the C ABI this package speaks (csrc/worker_abi.h).
const ABIVersion = 11

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

// OneDNNInfo says whether oneDNN's sgemm (found in the oneDNN libtorch
// loaded) is a candidate for CPU float32 sampling and decoding; whether it
// runs is measured per model (DecodeKernels). Without it they run on at::mm.
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
