package bmc

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// The few things this package reads from the BMC's JSON itself, where gofish does not
// expose them: the Reset action's target and a task monitor's answer. Both are
// untrusted input (FuzzParseResetTarget, FuzzParseTask).

// maxTaskBody bounds how much of a task monitor's answer is read.
const maxTaskBody = 1 << 20

// parseResetTarget returns the target of a ComputerSystem's #ComputerSystem.Reset
// action (Redfish ComputerSystem schema, Actions), or "" when it has none.
func parseResetTarget(raw []byte) (string, error) {
	var sys struct {
		Actions struct {
			Reset struct {
				Target string `json:"target"`
			} `json:"#ComputerSystem.Reset"`
		} `json:"Actions"`
	}
	if err := json.Unmarshal(raw, &sys); err != nil {
		return "", err
	}
	return sys.Actions.Reset.Target, nil
}

// taskProgress is what one read of a task monitor says.
type taskProgress struct {
	done     bool
	state    string
	messages []string
}

// failed reports whether a finished task ended other than Completed (or removed).
func (p taskProgress) failed() bool {
	return p.done && p.state != "Completed" && p.state != "removed" && p.state != "done"
}

// The TaskStates after which a task changes no more (Redfish Task schema, TaskState).
var taskEnded = map[string]bool{"Completed": true, "Exception": true, "Killed": true, "Cancelled": true}

// parseTask reads a task monitor's answer (DSP0266 "Asynchronous operations"): 202
// Accepted while the task runs; once it ends, either the Task resource with a final
// TaskState (BMCs whose Location is the Task itself answer 200 with TaskState Running
// meanwhile) or the action's own response, with no TaskState, which means done.
func parseTask(status int, body []byte) taskProgress {
	var task struct {
		TaskState string `json:"TaskState"`
		Messages  []struct {
			Message   string `json:"Message"`
			MessageID string `json:"MessageId"`
		} `json:"Messages"`
	}
	parsed := json.Unmarshal(body, &task) == nil
	p := taskProgress{state: task.TaskState}
	for _, m := range task.Messages {
		switch {
		case m.Message != "" && m.MessageID != "":
			p.messages = append(p.messages, fmt.Sprintf("%s (%s)", m.Message, m.MessageID))
		case m.Message != "":
			p.messages = append(p.messages, m.Message)
		case m.MessageID != "":
			p.messages = append(p.messages, m.MessageID)
		}
	}
	switch {
	case parsed && taskEnded[task.TaskState]:
		p.done = true
	case status == http.StatusAccepted:
		if p.state == "" {
			p.state = "Running"
		}
	case parsed && task.TaskState != "":
		// The Task resource itself, still running.
	default:
		p.done = true
		p.state = "done"
	}
	return p
}
