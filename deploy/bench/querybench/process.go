package querybench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// subscriberProcess is the benchmark's end of the subscribers' process
// (RunSubscribers): it writes the spec to its stdin, reads its records from its stdout
// into a tally, and passes its stderr on as progress.
type subscriberProcess struct {
	cmd    *exec.Cmd
	cancel context.CancelFunc // SIGTERM, then SIGKILL after the cmd's WaitDelay
	stdin  io.WriteCloser
	stderr *progressLines

	ready    chan struct{} // closed by the ready record
	readyErr error         // read after ready
	readDone chan struct{} // closed when stdout ends
	readErr  error         // read after readDone

	waitOnce sync.Once
	waitErr  error
}

func startSubscribers(ctx context.Context, cfg *Config, spec SubscriberSpec, t *tally) (*subscriberProcess, error) {
	ctx, cancel := context.WithCancel(ctx)
	name, args := cfg.SubscriberCommand[0], cfg.SubscriberCommand[1:]
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 15 * time.Second
	s := &subscriberProcess{cmd: cmd, cancel: cancel, stderr: &progressLines{progress: cfg.Progress},
		ready: make(chan struct{}), readDone: make(chan struct{})}
	cmd.Stderr = s.stderr
	var err error
	if s.stdin, err = cmd.StdinPipe(); err != nil {
		cancel()
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, fmt.Errorf("cannot start the subscribers' process %q: %w", strings.Join(cfg.SubscriberCommand, " "), err)
	}
	go func() {
		defer close(s.readDone)
		var once sync.Once
		s.readErr = readRecords(stdout, t, func(n int, _ time.Duration) {
			once.Do(func() {
				if n != spec.Subscribers {
					s.readyErr = fmt.Errorf("the subscribers' process is ready with %d subscribers of %d", n, spec.Subscribers)
				}
				close(s.ready)
			})
		})
		if s.readErr != nil {
			_, _ = io.Copy(io.Discard, stdout) // let the process finish its writes
		}
	}()
	line, err := json.Marshal(spec)
	if err != nil {
		s.kill()
		return nil, err
	}
	if _, err := s.stdin.Write(append(line, '\n')); err != nil {
		s.kill()
		return nil, fmt.Errorf("cannot send the subscriber spec: %w%s", err, s.exitReason())
	}
	return s, nil
}

func (s *subscriberProcess) pid() int { return s.cmd.Process.Pid }

// exited says whether the process's stdout has ended: it is gone.
func (s *subscriberProcess) exited() bool {
	select {
	case <-s.readDone:
		return true
	default:
		return false
	}
}

// waitReady waits for the ready record.
func (s *subscriberProcess) waitReady(ctx context.Context, timeout time.Duration) error {
	select {
	case <-s.ready:
		return s.readyErr
	case <-s.readDone:
		if s.readErr != nil {
			return s.readErr
		}
		err := s.wait() // and its stderr is read to the end
		return fmt.Errorf("the subscribers' process ended before its subscribers were ready (%w)%s", err, s.exitReason())
	case <-time.After(timeout):
		return fmt.Errorf("the subscribers' process is not ready after %s", timeout)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stop closes the process's stdin, which ends it, reads its last records and waits
// for it: an error is its exit's, or a broken record stream.
func (s *subscriberProcess) stop() error {
	_ = s.stdin.Close() // its end is the signal
	select {
	case <-s.readDone:
	case <-time.After(time.Minute):
		s.cancel()
		<-s.readDone
	}
	if err := s.wait(); err != nil {
		return fmt.Errorf("the subscribers' process failed: %w%s", err, s.exitReason())
	}
	return s.readErr
}

// kill ends the process if stop has not (any error return), and waits for it.
func (s *subscriberProcess) kill() {
	_ = s.stdin.Close()
	s.cancel()
	<-s.readDone
	_ = s.wait() // the error that made the benchmark stop is the one reported
}

func (s *subscriberProcess) wait() error {
	s.waitOnce.Do(func() { s.waitErr = s.cmd.Wait() })
	return s.waitErr
}

// exitReason is the last thing the process said on stderr, to follow an error.
func (s *subscriberProcess) exitReason() string {
	if last := s.stderr.last(); last != "" {
		return ": " + last
	}
	return ""
}

// progressLines passes each line written to it to progress, prefixed, and keeps the
// last one.
type progressLines struct {
	progress func(format string, args ...any)
	mu       sync.Mutex
	partial  []byte
	lastLine string
}

func (p *progressLines) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.partial = append(p.partial, b...)
	for {
		i := bytes.IndexByte(p.partial, '\n')
		if i < 0 {
			break
		}
		line := strings.TrimSpace(string(p.partial[:i]))
		p.partial = p.partial[i+1:]
		if line != "" {
			p.lastLine = line
			p.progress("live: subscriber process: %s", line)
		}
	}
	return len(b), nil
}

func (p *progressLines) last() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if rest := strings.TrimSpace(string(p.partial)); rest != "" {
		return rest
	}
	return p.lastLine
}
