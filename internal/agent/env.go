package agent

import "strings"

// An agent runs code its policy chooses, so it gets an allow-listed
// environment, never the trainer's own: OPENREWARD_API_KEY, HF_TOKEN,
// VLLM_API_KEY, the envs' token variables and cloud credentials stay out.
// What it gets: what a program needs to run at all, the locale, the
// language runtimes' search paths, proxies, and every ORTRAIN_*, OPENAI_*
// and ANTHROPIC_* variable (the facts set below override the key and URLs),
// plus what the config names (Spec.InheritEnv) or sets (Spec.Env).

// inherited reports whether the parent's variable name reaches the agent:
// by exact name, by prefix, or named in extra.
func inherited(name string, extra []string) bool {
	switch name {
	case "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "TMPDIR", "TMP", "TEMP", "TZ", "LANG", "LANGUAGE",
		"NODE_PATH", "NODE_OPTIONS", "PYTHONPATH", "PYTHONHOME", "PYTHONUNBUFFERED", "VIRTUAL_ENV", "CONDA_PREFIX",
		"LD_LIBRARY_PATH", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "NO_COLOR", "CI",
		"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy":
		return true
	}
	for _, p := range []string{"LC_", "XDG_", "ORTRAIN_", "OPENAI_", "ANTHROPIC_"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	for _, e := range extra {
		if e == name {
			return true
		}
	}
	return false
}
