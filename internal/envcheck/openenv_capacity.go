package envcheck

import (
	"fmt"
	"reflect"

	"github.com/coder/websocket"
)

// capacity opens /ws sessions one by one (at most oeMaxProbe) until
// the server refuses one, then checks the refusal, and that two of the
// sessions it held are independent.
func (x *oe) capacity() {
	const name, indep = "openenv/capacity", "openenv/sessions independent"
	if !x.ok["openenv/ws connect"] {
		x.r.skip(name, "needs openenv/ws connect, which did not pass")
		x.r.skip(indep, "needs openenv/ws connect, which did not pass")
		return
	}
	var held []*websocket.Conn
	var ids []string
	defer func() { x.closeAll(held...) }()
	var refusal *oeFrame
	var refusedClose websocket.StatusCode
	var closeObs string
	var probeErr error
	for i := range oeMaxProbe {
		id := oeEpisodeID()
		// A refusal below the limit is a slot still being freed (ours,
		// or another client's): retried for a while; at the limit it is
		// the answer.
		c, reply, err := x.open("/ws", oeResetFrame(id), x.o.CallTimeout, func(b []byte) bool {
			limit, ok := oeRefusal(b)
			return ok && limit > int64(len(held))
		})
		if c == nil {
			probeErr = fmt.Errorf("session %d: %w", i+1, err)
			break
		}
		var f oeFrame
		if err == nil {
			f, err = oeParseFrame(reply)
		}
		switch {
		case err != nil:
			probeErr = fmt.Errorf("session %d: reset: %w", i+1, err)
		case f.Type == "error":
			refusal = &f
			refusedClose, closeObs = x.awaitClose(c)
		case f.Type != "observation":
			probeErr = fmt.Errorf("session %d: reset answered %s", i+1, brief(f.Raw))
		default:
			held, ids = append(held, c), append(ids, id)
			continue
		}
		_ = c.CloseNow()
		break
	}
	x.check(name, fmt.Sprintf("sessions up to the server's limit are accepted; the next gets, unsolicited after the 101, an error frame CAPACITY_REACHED with active_sessions and max_sessions, then a close with 1000 (§2 Capacity; probed up to %d sessions)", oeMaxProbe), nil, func() (string, bool) {
		switch {
		case probeErr != nil:
			return fmt.Sprintf("%v (after %d sessions accepted)", probeErr, len(held)), false
		case refusal == nil:
			return fmt.Sprintf("%d concurrent sessions accepted, no refusal up to the probe's bound", len(held)), true
		}
		active, aok := oeInt(refusal.Data["active_sessions"])
		limit, lok := oeInt(refusal.Data["max_sessions"])
		obs := fmt.Sprintf("%d sessions accepted, then %s; %s", len(held), brief(refusal.Raw), closeObs)
		// Sessions of other clients, or ours still being torn down, may
		// hold slots too: the limit is at least what this probe held.
		ok := oeErrorCode(*refusal) == "CAPACITY_REACHED" && aok && lok && limit >= int64(len(held)) && active >= limit &&
			refusedClose == websocket.StatusNormalClosure
		return obs, ok
	})
	if len(held) < 2 {
		why := "needs openenv/capacity, which did not pass"
		if refusal != nil && x.ok[name] {
			why = fmt.Sprintf("the server holds at most %d session(s) at once (CAPACITY_REACHED): two cannot be open together", len(held))
		}
		x.r.skip(indep, why)
		return
	}
	action, needs := x.stepAction()
	if needs != "" {
		x.r.skip(indep, "needs "+needs+", which did not pass")
		return
	}
	x.check(indep, "two concurrent /ws sessions have their own episode ids, and a step in one leaves the other's state as it was (§1: the connection is the session)", nil, func() (string, bool) {
		a, b := held[0], held[1]
		stateMsg := []byte(`{"type":"state"}`)
		b0, obs, ok, _ := x.reply(b, stateMsg, x.o.RequestTimeout, "state")
		if !ok {
			return "session B: state: " + obs, false
		}
		if _, obs, ok, _ = x.reply(a, oeJSON(map[string]any{"type": "step", "data": action}), x.o.CallTimeout, "observation"); !ok {
			return fmt.Sprintf("session A: step %s: %s", oeText(action), obs), false
		}
		a1, obs, ok, _ := x.reply(a, stateMsg, x.o.RequestTimeout, "state")
		if !ok {
			return "session A: state: " + obs, false
		}
		b1, obs, ok, _ := x.reply(b, stateMsg, x.o.RequestTimeout, "state")
		if !ok {
			return "session B: state: " + obs, false
		}
		obs = fmt.Sprintf("A after a step: %s; B before: %s, after: %s", brief(a1.Raw), brief(b0.Raw), brief(b1.Raw))
		na, _ := oeInt(a1.Data["step_count"])
		return obs, a1.Data["episode_id"] == ids[0] && b0.Data["episode_id"] == ids[1] && na > 0 && reflect.DeepEqual(b0.Data, b1.Data)
	})
}
