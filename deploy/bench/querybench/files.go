package querybench

import (
	"fmt"
	"syscall"
)

// raiseFileLimit raises this process's soft limit of open files to its hard limit,
// and says what to do when even that is under need: every WebSocket is a file in the
// benchmark's process (the server's end) and one in the subscribers' process.
func raiseFileLimit(need int, who string) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("cannot read the open-file limit of %s: %w", who, err)
	}
	if lim.Cur < lim.Max {
		raised := lim
		raised.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err == nil {
			lim = raised
		}
	}
	return fileLimitError(need, lim.Cur, lim.Max, who)
}

func fileLimitError(need int, cur, hard uint64, who string) error {
	if uint64(need) <= cur {
		return nil
	}
	return fmt.Errorf("%s needs about %d open files (a WebSocket is one on each side) but may open %d (RLIMIT_NOFILE; hard limit %d): "+
		"raise it (ulimit -n, limits.conf, LimitNOFILE= of a systemd unit) or ask for fewer --subscribers", who, need, cur, hard)
}
