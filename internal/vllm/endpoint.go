package vllm

// Endpoint is a server a client can send to: a supervised Replica (whose
// URL may move on restart, and which is not Ready while restarting) or a
// fixed URL given by the user.
type Endpoint interface {
	URL() string
	Ready() bool
}

// StaticEndpoint is a server ortrain did not launch; it is always
// considered ready (failures surface as request errors and are retried).
type StaticEndpoint string

// URL is the server's base URL.
func (e StaticEndpoint) URL() string { return string(e) }

// Ready is always true: ortrain cannot see an external server's state.
func (e StaticEndpoint) Ready() bool { return true }
