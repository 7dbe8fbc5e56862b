package loadbench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"
)

// hostileProcess is the benchmark's end of the hostile process (RunHostile): it writes
// the spec to its stdin and, once stdin closes, reads the hostile clients' counts from
// its stdout.
type hostileProcess struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	stdout  bytes.Buffer
	logPath string
	exited  chan struct{}
	waitErr error
}

// startHostileProcess runs the hostile clients of kinds against the stack's serve in a
// process of their own; its stderr goes to the run's folder.
func startHostileProcess(cfg *Config, st *stack, kinds []string) (*hostileProcess, error) {
	spec := HostileSpec{Addr: st.addr, Kinds: kinds, AuditLoops: cfg.AuditLoops, IngestToken: st.tokens.hIngest, AuditToken: st.tokens.hCompliance}
	line, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	h := &hostileProcess{logPath: st.dir + "/hostile.log", exited: make(chan struct{})}
	logFile, err := os.OpenFile(h.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("cannot create the hostile process's log: %w", err)
	}
	defer logFile.Close() //nolint:errcheck // the child holds its own descriptor
	h.cmd = exec.Command(cfg.HostileCommand[0], cfg.HostileCommand[1:]...)
	h.cmd.Stdout, h.cmd.Stderr, h.cmd.Env = &h.stdout, logFile, serveEnv()
	if h.stdin, err = h.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	if err := h.cmd.Start(); err != nil {
		return nil, fmt.Errorf("cannot start the hostile process %q: %w", strings.Join(cfg.HostileCommand, " "), err)
	}
	go func() { h.waitErr = h.cmd.Wait(); close(h.exited) }()
	if _, err := h.stdin.Write(append(line, '\n')); err != nil {
		_, _ = h.stop()
		return nil, fmt.Errorf("cannot send the hostile spec: %w", err)
	}
	return h, nil
}

func (h *hostileProcess) pid() int { return h.cmd.Process.Pid }

// alive says whether the hostile process still runs: one that died early would make
// the attack phase a second alone phase.
func (h *hostileProcess) alive() bool {
	select {
	case <-h.exited:
		return false
	default:
		return true
	}
}

// stop closes the process's stdin, which ends its clients, and reads what they did; a
// process that does not end within 30 s is killed.
func (h *hostileProcess) stop() (HostileStats, error) {
	_ = h.stdin.Close() // the signal to stop; the process may have ended already
	select {
	case <-h.exited:
	case <-time.After(30 * time.Second):
		_ = h.cmd.Process.Kill()
		<-h.exited
	}
	var st HostileStats
	if h.waitErr != nil {
		return st, fmt.Errorf("the hostile process failed (%w); its output:\n%s", h.waitErr, tail(h.logPath, 4000))
	}
	if err := json.Unmarshal(bytes.TrimSpace(h.stdout.Bytes()), &st); err != nil {
		return st, fmt.Errorf("cannot read the hostile process's counts %q: %w", h.stdout.String(), err)
	}
	return st, nil
}

// tail is the end of a file, for an error message.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(cannot read " + path + ": " + err.Error() + ")"
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
